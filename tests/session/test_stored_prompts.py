"""Stored prompts in ``session.update`` on the core (issue 28, point 3).

As OpenAI documents a prompt in a session: the prompt's fields apply, and the fields the
update sets itself override them where they overlap. The agents SDKs send an agent's
prompt beside its instructions (``""`` when it has none), tools and voice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from hark.protocol import prompts
from hark.protocol.prompts import PromptStore
from hark.session.actions import Generate

from .conftest import Driver

SDK_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
BOOK = {"type": "function", "name": "book", "description": "Book.", "parameters": {}}
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PromptStore]:
    """The process's prompt store for the test: a concierge prompt in two versions."""
    versions = tmp_path / "pmpt_concierge"
    versions.mkdir()
    (versions / "1.txt").write_text("You are the concierge of {{hotel}}.")
    (versions / "2.json").write_text(
        json.dumps(
            {
                "instructions": "You are the night concierge of {{hotel}}.",
                "tools": [BOOK],
                "voice": "marin",
            }
        )
    )
    store = PromptStore.load(tmp_path)
    assert prompts.current() is None
    prompts.configure(store)
    yield store
    prompts.configure(None)


@pytest.fixture
def driver(store: PromptStore) -> Iterator[Driver]:
    driver = Driver()
    yield driver
    for event in driver.events:
        SDK_EVENT.validate_python(event)


def update(driver: Driver, **session: Any) -> list[dict[str, Any]]:
    return driver.send(
        {"type": "session.update", "event_id": "evt_3", "session": {"type": "realtime", **session}}
    )


def prompt(version: str | None = None, **variables: Any) -> dict[str, Any]:
    return {"id": "pmpt_concierge", "version": version, "variables": variables}


def test_the_prompts_fields_apply_and_the_reference_is_echoed(driver: Driver) -> None:
    (updated,) = update(driver, prompt=prompt(hotel="the Ritz"))
    session = updated["session"]
    assert session["instructions"] == "You are the night concierge of the Ritz."
    assert [t["name"] for t in session["tools"]] == ["book"]
    assert session["audio"]["output"]["voice"] == "marin"
    assert session["prompt"] == prompt(hotel="the Ritz")
    # The model reads the rendered instructions and the prompt's tools.
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert generate.request.messages[0].content == "You are the night concierge of the Ritz."
    assert [t.name for t in generate.request.tools] == ["book"]


def test_the_updates_own_fields_override_the_prompts(driver: Driver) -> None:
    (updated,) = update(
        driver,
        instructions="Speak clearly and briefly.",
        tools=[LOOKUP, {**BOOK, "description": "Book a table."}],
        audio={"output": {"voice": "cedar"}},
        prompt=prompt(hotel="the Ritz"),
    )
    session = updated["session"]
    assert session["instructions"] == "Speak clearly and briefly."
    assert [(t["name"], t["description"]) for t in session["tools"]] == [
        ("lookup", ""),
        ("book", "Book a table."),
    ]
    assert session["audio"]["output"]["voice"] == "cedar"


def test_an_agent_without_instructions_gets_the_prompts(driver: Driver) -> None:
    # The agents SDKs' update for RealtimeAgent(prompt=…): instructions "", the agent's tools.
    (updated,) = update(driver, instructions="", tools=[LOOKUP], prompt=prompt("1", hotel="Ritz"))
    session = updated["session"]
    assert session["instructions"] == "You are the concierge of Ritz."
    assert [t["name"] for t in session["tools"]] == ["lookup"]
    assert session["audio"]["output"]["voice"] == "alloy"


def test_a_prompt_that_cannot_be_resolved_is_an_error_and_the_rest_applies(
    driver: Driver,
) -> None:
    for reference, param in (
        ({"id": "pmpt_gone"}, "session.prompt.id"),
        (prompt("7", hotel="Ritz"), "session.prompt.version"),
        (prompt(), "session.prompt.variables"),
    ):
        events = update(driver, instructions="Be brief.", prompt=reference)
        assert driver.types(events) == ["error", "session.updated"]
        assert events[0]["error"]["param"] == param
        assert events[0]["error"]["event_id"] == "evt_3"
        assert events[1]["session"]["instructions"] == "Be brief."
        assert events[1]["session"]["prompt"] is None
    # A malformed reference, or malformed fields beside a good one, refuse the whole
    # update, as OpenAI would.
    for session, param in (
        ({"prompt": {"version": "1"}}, "session.prompt.id"),
        ({"prompt": prompt("2", hotel="Ritz"), "tools": {"name": "x"}}, "session.tools"),
        ({"prompt": prompt("2", hotel="Ritz"), "audio": "loud"}, "session.audio"),
    ):
        events = update(driver, instructions="Be long.", **session)
        assert driver.types(events) == ["error"]
        assert events[0]["error"]["param"] == param
        assert driver.session.config.instructions == "Be brief."


def test_without_a_store_a_prompt_is_an_error_and_the_rest_applies() -> None:
    driver = Driver()
    events = update(driver, instructions="Be brief.", prompt=prompt(hotel="Ritz"))
    assert driver.types(events) == ["error", "session.updated"]
    assert events[0]["error"]["param"] == "session.prompt"
    assert "--prompts" in events[0]["error"]["message"]
    assert driver.session.config.instructions == "Be brief."
    assert driver.session.config.prompt is None


def test_a_response_takes_a_prompt_for_itself(driver: Driver) -> None:
    update(driver, instructions="Be brief.", tools=[LOOKUP])
    events = driver.send(
        {"type": "response.create", "response": {"prompt": prompt("2", hotel="the Ritz")}}
    )
    assert events[0]["type"] == "response.created"
    assert events[0]["response"]["audio"]["output"]["voice"] == "marin"
    (generate,) = driver.take(Generate)
    assert generate.request.messages[0].content == "You are the night concierge of the Ritz."
    assert [t.name for t in generate.request.tools] == ["book"]
    driver.send({"type": "response.cancel"})
    # The session keeps its own configuration; a prompt that cannot be resolved refuses the
    # response, naming the field.
    assert driver.session.config.instructions == "Be brief."
    events = driver.send({"type": "response.create", "response": {"prompt": {"id": "nope"}}})
    assert driver.types(events) == ["error"]
    assert events[0]["error"]["param"] == "response.prompt.id"

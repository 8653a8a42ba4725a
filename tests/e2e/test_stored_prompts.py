"""End to end: stored prompts (issue 28, point 3) on `hark serve --engines fake --prompts DIR`,
driven by the official `openai` SDK (a session update, a client secret) and by the
`openai-agents` SDK's ``RealtimeAgent(prompt=…)``, which sends the prompt beside the agent's
empty instructions and its tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeSessionModelSettings

from tests.helpers.streams import of_type
from tests.servers import hark_serve

from .conftest import API_KEY, Server, artifact, events_until, speech
from .test_agents_sdk import conversation

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

CONCIERGE = "You are the concierge of {{hotel}}. Answer in one short sentence."
BOOK = {"type": "function", "name": "book_table", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def prompt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The fake engines with a prompt store of one prompt in two versions."""
    store = tmp_path_factory.mktemp("prompts")
    (store / "pmpt_concierge").mkdir()
    (store / "pmpt_concierge" / "1.txt").write_text(CONCIERGE)
    (store / "pmpt_concierge" / "2.json").write_text(
        json.dumps({"instructions": "Night shift. " + CONCIERGE, "tools": [BOOK]})
    )
    log = artifact("e2e-prompts-fake-server.log")
    args = ["--engines", "fake", "--prompts", str(store)]
    with hark_serve(args, log, env={"HARK_API_KEYS": API_KEY}) as port:
        yield Server("127.0.0.1", port, log)


def concierge(version: str | None = None) -> Any:
    reference: dict[str, Any] = {"id": "pmpt_concierge", "variables": {"hotel": "the Ritz"}}
    if version is not None:
        reference["version"] = version
    return reference


async def test_a_session_update_names_a_stored_prompt(prompt_server: Server) -> None:
    async with prompt_server.client().realtime.connect(model="gpt-realtime") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={"type": "realtime", "instructions": "", "prompt": concierge()}
        )
        updated = await conn.recv()
        assert updated.type == "session.updated"
        session: Any = updated.session
        assert session.instructions.startswith("Night shift. You are the concierge of the Ritz.")
        assert [t.name for t in session.tools] == ["book_table"]
        assert session.prompt.id == "pmpt_concierge"
        # An id the store lacks: an error naming it, and the rest of the update applies.
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "Be brief.",
                "prompt": {"id": "pmpt_elsewhere"},
            }
        )
        error, updated = await conn.recv(), await conn.recv()
        assert error.type == "error" and error.error.param == "session.prompt.id"
        assert "pmpt_elsewhere" in error.error.message
        assert updated.type == "session.updated"
        assert updated.session.instructions == "Be brief."  # type: ignore[union-attr]


async def test_a_client_secret_carries_a_stored_prompt(prompt_server: Server) -> None:
    client = prompt_server.client()
    secret = await client.realtime.client_secrets.create(
        session={"type": "realtime", "prompt": concierge("1")}
    )
    session: Any = secret.session
    assert (
        session.instructions == "You are the concierge of the Ritz. Answer in one short sentence."
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await client.realtime.client_secrets.create(
            session={"type": "realtime", "prompt": {"id": "pmpt_concierge", "version": "9"}}
        )
    assert caught.value.param == "session.prompt.version"
    # A session opened with the key has the prompt's instructions.
    ephemeral = prompt_server.client(api_key=secret.value)
    async with ephemeral.realtime.connect(model="gpt-realtime") as conn:
        created: Any = await conn.recv()
        assert created.session.instructions == session.instructions


@function_tool
async def opening_hours(day: str) -> str:
    """The restaurant's opening hours on a day."""
    return "Noon to midnight."


async def test_the_agents_sdk_runs_an_agent_with_a_stored_prompt(prompt_server: Server) -> None:
    # The SDK sends the agent's empty instructions, its tools and the prompt in one update.
    agent = RealtimeAgent(name="Concierge", prompt=concierge("2"), tools=[opening_hours])
    async with conversation(prompt_server, agent, RealtimeSessionModelSettings()) as (
        _,
        recorder,
        microphone,
    ):
        updated = await recorder.wait_for("session.updated", 0)
        session = updated["session"]
        assert session["instructions"].startswith("Night shift. You are the concierge of the Ritz.")
        assert [t["name"] for t in session["tools"]] == ["book_table", "opening_hours"]
        mark = recorder.mark()
        microphone.say(await speech("What is the capital of France?"))
        done = await recorder.wait_for("response.done", mark)
        assert done["response"]["status"] == "completed"
    assert recorder.errors() == []


async def test_a_response_names_a_stored_prompt(prompt_server: Server) -> None:
    async with prompt_server.client().realtime.connect(model="gpt-realtime") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
            }
        )
        await conn.response.create(response={"prompt": concierge("1")})
        events: list[Any] = [e async for e in events_until(conn, "response.done", 60)]
        assert not of_type(events, "error")
        assert of_type(events, "response.done")[0].response.status == "completed"

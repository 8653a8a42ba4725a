"""``parallel_tool_calls: false`` is enforced (issue 28, point 6): the LLM is asked for one
call at a time, and a model that calls several in one run anyway has only its first made.
The session's setting holds unless ``response.create`` sets its own."""

from __future__ import annotations

from typing import Any

import pytest

from hark.engines.llm import Finished
from hark.session.actions import Generate
from hark.session.results import (
    GenerationFinished,
    ToolCallDelta,
    ToolCallFinished,
    ToolCallStarted,
)

from .conftest import Driver

LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
BOOK = {"type": "function", "name": "book", "parameters": {"type": "object"}}


def two_calls(driver: Driver, generate: Generate) -> dict[str, Any]:
    """The LLM calls both tools in one run; returns the response's ``response.done``."""
    rid = generate.response_id
    for call_id, name in (("call_1", "lookup"), ("call_2", "book")):
        driver.session.handle(ToolCallStarted(rid, call_id, name), now=driver.now)
        driver.session.handle(ToolCallDelta(rid, call_id, "{}"), now=driver.now)
        driver.session.handle(ToolCallFinished(rid, call_id, "{}"), now=driver.now)
    driver.session.handle(GenerationFinished(rid, Finished("tool_calls")), now=driver.now)
    (done,) = [e for e in driver.pump() if e["type"] == "response.done"]
    return done


def session(driver: Driver, parallel: bool | None) -> None:
    update: dict[str, Any] = {
        "type": "realtime",
        "output_modalities": ["text"],
        "audio": {"input": {"turn_detection": None}},
        "tools": [LOOKUP, BOOK],
    }
    if parallel is not None:
        update["parallel_tool_calls"] = parallel
    (updated,) = driver.send({"type": "session.update", "session": update})
    assert updated["session"]["parallel_tool_calls"] == parallel


@pytest.mark.parametrize(
    ("session_setting", "response_setting", "calls"),
    [
        (None, None, ["lookup", "book"]),
        (True, None, ["lookup", "book"]),
        (False, None, ["lookup"]),
        (False, True, ["lookup", "book"]),
        (None, False, ["lookup"]),
    ],
)
def test_only_the_first_call_of_a_run_is_made_when_parallel_calls_are_off(
    session_setting: bool | None, response_setting: bool | None, calls: list[str]
) -> None:
    driver = Driver()
    session(driver, session_setting)
    response: dict[str, Any] = {}
    if response_setting is not None:
        response["parallel_tool_calls"] = response_setting
    driver.send({"type": "response.create", "response": response})
    (generate,) = driver.take(Generate)
    assert generate.request.parallel_tool_calls == (len(calls) == 2)
    done = two_calls(driver, generate)
    assert [item["name"] for item in done["response"]["output"]] == calls
    made = [
        e["name"] for e in driver.events if e["type"] == "response.function_call_arguments.done"
    ]
    assert made == calls

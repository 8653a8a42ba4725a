"""The session's ``truncation``: validated as OpenAI types it, echoed, handed to the LLM, and
a context that overflows failing its response with OpenAI's code while the session goes on."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.fake import FakeLlm
from hark.engines.llm import GenerationRequest, LlmEvent, Truncation
from hark.engines.llm.truncation import ContextOverflow
from hark.engines.registry import build_engines
from hark.session.actions import Generate

from .conftest import Driver

RATIO = {"type": "retention_ratio", "retention_ratio": 0.7}


@pytest.mark.parametrize(
    ("truncation", "param", "code"),
    [
        ("sometimes", "session.truncation", "invalid_value"),
        (7, "session.truncation", "invalid_type"),
        ({"type": "newest_first"}, "session.truncation.type", "invalid_value"),
        ({"type": "retention_ratio"}, "session.truncation.retention_ratio", None),
        (RATIO | {"retention_ratio": 1.5}, "session.truncation.retention_ratio", "invalid_value"),
        (
            RATIO | {"token_limits": {"post_instructions": 0}},
            "session.truncation.token_limits.post_instructions",
            "invalid_value",
        ),
        (
            RATIO | {"token_limits": {"pre_instructions": 10}},
            "session.truncation.token_limits.pre_instructions",
            "unknown_parameter",
        ),
    ],
)
def test_bad_truncation_is_an_error_naming_the_param(
    driver: Driver, truncation: Any, param: str, code: str | None
) -> None:
    new = driver.send({"type": "session.update", "session": {"truncation": truncation}})
    assert driver.types(new) == ["error"]
    error = new[0]["error"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    # The session goes on with its truncation unchanged.
    ok = driver.send({"type": "session.update", "session": {}})
    assert ok[0]["session"]["truncation"] == "auto"


@pytest.mark.parametrize(
    ("truncation", "expected"),
    [
        ("auto", Truncation()),
        ("disabled", Truncation("disabled")),
        (RATIO, Truncation("retention_ratio", retention_ratio=0.7)),
        (
            RATIO | {"token_limits": {"post_instructions": 3000}},
            Truncation("retention_ratio", 0.7, post_instructions_tokens=3000),
        ),
    ],
)
def test_truncation_is_echoed_and_reaches_the_llm(
    driver: Driver, truncation: Any, expected: Truncation
) -> None:
    new = driver.send({"type": "session.update", "session": {"truncation": truncation}})
    assert driver.types(new) == ["session.updated"]
    echoed = new[0]["session"]["truncation"]
    if isinstance(truncation, dict):
        assert echoed["type"] == "retention_ratio"
        assert echoed["retention_ratio"] == truncation["retention_ratio"]
    else:
        assert echoed == truncation
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hello"}],
            },
        }
    )
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert generate.request.truncation == expected


class OverflowingLlm(FakeLlm):
    """Fails as an LLM does when the conversation cannot fit its context."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        if request.truncation.mode == "disabled":
            raise self.error
        async for event in super().generate(request):
            yield event


async def turn(runner: SessionRunner, events: AsyncIterator[str]) -> dict[str, Any]:
    """One text turn; its ``response.done``."""
    runner.receive_text(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hi"}],
                },
            }
        )
    )
    runner.receive_text(json.dumps({"type": "response.create"}))
    async with asyncio.timeout(10):
        async for text in events:
            event = json.loads(text)
            assert event["type"] != "error", event
            if event["type"] == "response.done":
                done: dict[str, Any] = event["response"]
                return done
    raise AssertionError("the session ended")


@pytest.mark.parametrize(
    ("error", "code", "error_type"),
    [
        (ContextOverflow("the conversation no longer fits"), "context_length_exceeded", None),
        (RuntimeError("POST http://10.0.0.7:8001/v1 failed"), "engine_error", "server_error"),
    ],
)
async def test_a_context_overflow_fails_the_response_with_its_own_code(
    error: Exception, code: str, error_type: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    engines = build_engines(Settings(engines="fake"))
    engines.llm = OverflowingLlm(error)
    runner = SessionRunner(engines, model="m")
    await runner.start()
    events = runner.outgoing()
    try:
        update = {"output_modalities": ["text"], "truncation": "disabled"}
        runner.receive_text(json.dumps({"type": "session.update", "session": update}))
        done = await turn(runner, events)
        assert done["status"] == "failed"
        failure = done["status_details"]["error"]
        # OpenAI's code for a prompt past the context, an invalid request of the client's.
        assert failure["code"] == code
        assert failure["type"] == (error_type or "invalid_request_error")
        if isinstance(error, ContextOverflow):
            assert str(error) in failure["message"]
        else:
            # An engine's own error may name internal hosts: the client gets an id, the log
            # the error.
            assert "10.0.0.7" not in failure["message"]
            (error_id,) = re.findall(r"err_[0-9a-f]{12}", failure["message"])
            assert any(
                error_id in r.getMessage() and r.exc_info and r.exc_info[1] is error
                for r in caplog.records
            )
        # The session goes on: with truncation back on, the next turn is answered.
        update = {"truncation": "auto"}
        runner.receive_text(json.dumps({"type": "session.update", "session": update}))
        assert (await turn(runner, events))["status"] == "completed"
    finally:
        await runner.close()

"""The session's ``truncation``: validated as OpenAI types it, echoed, and handed to the LLM."""

from __future__ import annotations

from typing import Any

import pytest

from hark.engines.llm import Truncation
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

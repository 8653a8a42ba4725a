"""``reasoning.effort`` (issue 28, point 6): validated against OpenAI's values, echoed, and
given to the LLM with every request (an OpenAI-compatible engine sends it to a reasoning
model as ``reasoning_effort``); ``response.create`` sets it for one response.
"""

from __future__ import annotations

from typing import Any

from hark.engines.llm import Finished
from hark.session.actions import Generate
from hark.session.results import GenerationFinished

from .conftest import Driver


def text_session(driver: Driver, **session: Any) -> list[dict[str, Any]]:
    return driver.send(
        {
            "type": "session.update",
            "session": {
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                **session,
            },
        }
    )


def effort_of_next_response(driver: Driver, **response: object) -> str | None:
    driver.send({"type": "response.create", "response": response or None})
    (generate,) = driver.take(Generate)
    driver.session.handle(
        GenerationFinished(generate.response_id, Finished("stop")), now=driver.now
    )
    driver.pump()
    return generate.request.reasoning_effort


def test_the_sessions_effort_reaches_the_llm_and_a_response_may_set_its_own() -> None:
    driver = Driver()
    assert effort_of_next_response(driver) is None
    (updated,) = text_session(driver, reasoning={"effort": "low"})
    assert updated["session"]["reasoning"] == {"effort": "low"}
    assert effort_of_next_response(driver) == "low"
    assert effort_of_next_response(driver, reasoning={"effort": "xhigh"}) == "xhigh"
    assert effort_of_next_response(driver) == "low"
    # An update without reasoning keeps it.
    text_session(driver, instructions="Think.")
    assert effort_of_next_response(driver) == "low"


def test_an_effort_openai_does_not_have_is_an_error_and_the_session_goes_on() -> None:
    driver = Driver()
    text_session(driver, reasoning={"effort": "medium"})
    (error,) = text_session(driver, reasoning={"effort": "extreme"})
    assert error["type"] == "error"
    assert error["error"]["param"] == "session.reasoning.effort"
    assert effort_of_next_response(driver) == "medium"
    (error,) = driver.send({"type": "response.create", "response": {"reasoning": {"x": 1}}})
    assert error["error"]["param"].startswith("response.reasoning")
    assert driver.take(Generate) == []
    assert effort_of_next_response(driver) == "medium"

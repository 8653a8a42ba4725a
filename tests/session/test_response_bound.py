"""Responses in progress are bounded: out-of-band responses run side by side, but never
more than ``MAX_RESPONSES_IN_PROGRESS`` at once."""

from __future__ import annotations

from hark.engines.llm import Finished
from hark.session.actions import Generate
from hark.session.response_lifecycle import MAX_RESPONSES_IN_PROGRESS
from hark.session.results import GenerationFinished
from tests.session.conftest import Driver

OUT_OF_BAND = {
    "type": "response.create",
    "response": {"conversation": "none", "output_modalities": ["text"]},
}


def test_responses_past_the_bound_are_refused_until_one_finishes() -> None:
    driver = Driver()
    for _ in range(MAX_RESPONSES_IN_PROGRESS - 1):
        created = driver.send(OUT_OF_BAND)
        assert created[0]["type"] == "response.created"
    # The conversation's own response counts too.
    assert driver.send({"type": "response.create"})[0]["type"] == "response.created"
    refused = driver.send(OUT_OF_BAND)
    assert [e["type"] for e in refused] == ["error"]
    assert refused[0]["error"]["code"] == "too_many_responses_in_progress"
    generations = [a for a in driver.actions if isinstance(a, Generate)]
    assert len(generations) == MAX_RESPONSES_IN_PROGRESS
    # The session goes on: once one is done, another may start.
    first = generations[0].response_id
    driver.session.handle(GenerationFinished(first, Finished("stop")), now=driver.now)
    driver.pump()
    assert driver.send(OUT_OF_BAND)[0]["type"] == "response.created"
    assert driver.send(OUT_OF_BAND)[0]["error"]["code"] == "too_many_responses_in_progress"

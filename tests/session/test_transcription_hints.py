"""Transcription ``keywords`` and ``languages`` (issue 28, point 6), and ``languages`` in
``…transcription.completed``, on the core with scripted recognition results.

``keywords`` prompt the recogniser (after the client's ``prompt``); ``languages`` with one
language fixes it, with several lets the engine tell; ``completed`` reports the language the
engine heard (else the one fixed), as ``gpt-transcribe`` does.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import pydantic
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from hark.engines.asr import Urgency
from hark.session.actions import Recognise, Transcribe

from .conftest import Driver, silence, voiced
from .test_recognition import COMPLETED, say

SDK_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)


def transcribing(driver: Driver, **transcription: Any) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {
                        "transcription": {"model": "whisper-1", "delay": "minimal", **transcription}
                    }
                }
            },
        }
    )


def turn(driver: Driver, heard_in: str | None) -> tuple[dict[str, Any], list[Recognise]]:
    """A spoken turn whose every step the engine hears in ``heard_in``: its ``completed``
    (one the `openai` SDK reads) and the steps."""
    driver.append(silence(300))
    steps: list[Recognise] = []
    for _ in range(60):
        driver.append(voiced(20))
        for step in driver.steps():
            steps.append(step)
            heard = replace(say(step), language=heard_in)
            driver.session.on_recognised(step.request_id, heard, now=driver.now)
            driver.pump()
    for _ in range(40):
        driver.append(silence(20))
        for step in driver.steps():
            steps.append(step)
            heard = replace(say(step), language=heard_in)
            driver.session.on_recognised(step.request_id, heard, now=driver.now)
            driver.pump()
    assert steps
    (completed,) = [e for e in driver.events if e["type"] == COMPLETED]
    SDK_EVENT.validate_python(completed)
    return completed, steps


def test_keywords_prompt_the_recogniser_after_the_clients_prompt() -> None:
    driver = Driver()
    transcribing(driver, prompt="A call to the town hall.", keywords=["Kerguelen", " ", "Ushuaia"])
    _, steps = turn(driver, "en")
    prompts = [s.request.prompt for s in steps]
    assert prompts[0] == "A call to the town hall. Kerguelen, Ushuaia"
    # Later steps continue from the words committed so far, after the hints.
    assert all((p or "").startswith("A call to the town hall. Kerguelen, Ushuaia") for p in prompts)


def test_keywords_alone_are_the_prompt_of_a_whole_item() -> None:
    driver = Driver()
    transcribing(driver, keywords=["Kerguelen"])
    driver.send(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
    )
    audio = base64.b64encode(voiced(500).astype("<i2").tobytes()).decode()
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": audio}],
            },
        }
    )
    transcribes = driver.take(Transcribe)
    recognises = driver.take(Recognise)
    prompts = [a.prompt for a in transcribes] + [r.request.prompt for r in recognises]
    assert prompts and all(p == "Kerguelen" for p in prompts)


@pytest.mark.parametrize(
    ("settings", "told", "heard_in", "reported"),
    [
        ({"languages": ["fr"]}, "fr", "fr", ["fr"]),
        ({"languages": ["fr", "de"]}, None, "de", ["de"]),
        ({"language": "es", "languages": ["fr", "de"]}, "es", "es", ["es"]),
        ({"languages": ["fr"]}, "fr", None, ["fr"]),
        ({}, None, "en", ["en"]),
    ],
)
def test_languages_fix_or_leave_the_language_and_completed_reports_it(
    settings: dict[str, Any], told: str | None, heard_in: str | None, reported: list[str]
) -> None:
    driver = Driver()
    transcribing(driver, **settings)
    completed, steps = turn(driver, heard_in)
    assert {s.request.language for s in steps} == {told}
    assert completed["languages"] == [{"code": code} for code in reported]


def test_no_language_known_leaves_languages_out() -> None:
    driver = Driver()
    transcribing(driver)
    completed, _ = turn(driver, None)
    assert "languages" not in completed
    assert not driver.steps(Urgency.ANSWER)

"""Transcription ``keywords`` and ``languages`` (issue 28, point 6), and ``languages`` in
``…transcription.completed``, on the core with scripted recognition results.

``keywords`` prompt the recogniser (after the client's ``prompt``); ``languages`` with one
language fixes it, with several holds the engine's detection to them (each step of a spoken
turn, and a whole item, which the engine detects before it transcribes); ``completed`` reports
the language the engine heard (else the one fixed), as ``gpt-transcribe`` does.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pydantic
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.asr import AudioToTranscribe, Urgency
from hark.engines.fake import FakeAsr
from hark.engines.registry import build_engines
from hark.session.actions import Recognise, Transcribe
from hark.session.results import Recognised, TranscriptionDone

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
            driver.session.handle(Recognised(step.request_id, heard), now=driver.now)
            driver.pump()
    for _ in range(40):
        driver.append(silence(20))
        for step in driver.steps():
            steps.append(step)
            heard = replace(say(step), language=heard_in)
            driver.session.handle(Recognised(step.request_id, heard), now=driver.now)
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


@pytest.mark.parametrize(
    ("settings", "allowed"),
    [
        ({"languages": ["fr", "de"]}, ("fr", "de")),
        ({"languages": ["fr"]}, ()),
        ({"language": "es", "languages": ["fr", "de"]}, ()),
        ({}, ()),
    ],
)
def test_several_languages_hold_the_engines_detection_to_them(
    settings: dict[str, Any], allowed: tuple[str, ...]
) -> None:
    """Each step of a spoken turn, and a whole item, asks the engine to tell between the
    session's languages when it fixes none."""
    driver = Driver()
    transcribing(driver, **settings)
    _, steps = turn(driver, "fr")
    assert {s.request.languages for s in steps} == {allowed}
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": pcm_b64(voiced(500))}],
            },
        }
    )
    (whole,) = driver.take(Transcribe)
    assert whole.languages == allowed


def test_a_whole_items_completed_reports_the_language_the_engine_heard() -> None:
    driver = Driver()
    transcribing(driver, languages=["fr", "de"])
    driver.send(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
    )
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": pcm_b64(voiced(500))}],
            },
        }
    )
    (whole,) = driver.take(Transcribe)
    assert whole.language is None
    driver.session.handle(
        TranscriptionDone(whole.request_id, "Guten Tag.", 0.5, "de"), now=driver.now
    )
    driver.pump()
    (completed,) = [e for e in driver.events if e["type"] == COMPLETED]
    SDK_EVENT.validate_python(completed)
    assert completed["languages"] == [{"code": "de"}]


def pcm_b64(pcm: Any) -> str:
    return base64.b64encode(pcm.astype("<i2").tobytes()).decode()


class LanguageRecordingAsr(FakeAsr):
    """Notes the languages it is asked to tell between and to transcribe in."""

    def __init__(self) -> None:
        super().__init__("Bonjour.")
        self.detections: list[tuple[str, ...]] = []
        self.transcribed_in: list[str | None] = []

    async def detect_language(
        self, audio: npt.NDArray[np.float32], *, languages: Sequence[str] = ()
    ) -> str | None:
        self.detections.append(tuple(languages))
        return await super().detect_language(audio, languages=languages)

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        self.transcribed_in.append(request.language)
        async for delta in super().transcribe(request):
            yield delta


@pytest.mark.parametrize(
    ("transcription", "detections", "transcribed_in", "reported"),
    [
        # Told between the session's languages, transcribed in the one told, and reported.
        ({"languages": ["fr", "de"]}, [("fr", "de")], ["fr"], [{"code": "fr"}]),
        # Any language: the engine's detection names it all the same.
        ({}, [()], ["en"], [{"code": "en"}]),
        # Fixed by the session: nothing to detect.
        ({"language": "de"}, [], ["de"], [{"code": "de"}]),
    ],
)
async def test_a_whole_item_is_transcribed_in_the_language_detected_and_reports_it(
    transcription: dict[str, Any],
    detections: list[tuple[str, ...]],
    transcribed_in: list[str],
    reported: list[dict[str, str]],
) -> None:
    engines = build_engines(Settings(engines="fake"))
    asr = engines.asr = LanguageRecordingAsr()
    runner = SessionRunner(engines, model="m")
    await runner.start()
    audio = {"transcription": {"model": "whisper-1", **transcription}, "turn_detection": None}
    runner.receive_text(
        json.dumps({"type": "session.update", "session": {"audio": {"input": audio}}})
    )
    content = [{"type": "input_audio", "audio": pcm_b64(voiced(500))}]
    item = {"type": "message", "role": "user", "content": content}
    runner.receive_text(json.dumps({"type": "conversation.item.create", "item": item}))

    async def completed() -> dict[str, Any]:
        async for text in runner.outgoing():
            event = json.loads(text)
            if event["type"] == COMPLETED:
                return cast(dict[str, Any], event)
        raise AssertionError("the session ended first")

    event = await asyncio.wait_for(completed(), 10)
    SDK_EVENT.validate_python(event)
    assert event["transcript"] == "Bonjour."
    assert event["languages"] == reported
    assert asr.detections == detections
    assert asr.transcribed_in == transcribed_in
    await runner.close()

"""The driver's part in a step whose words are wanted before their times: the engine's
stages reach the core as ``RecognisedText`` then ``Recognised``, whatever the engine."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import pytest

from hark.config import Settings
from hark.driver.engine_work import EngineWork
from hark.engines.asr import RecognitionRequest, TimedTranscript, TranscriptText
from hark.engines.fake import FakeAsr
from hark.engines.registry import build_engines
from hark.session.actions import Recognise
from hark.session.core import Session
from hark.session.results import Recognised, RecognisedText, TranscriptionFailed

TEXT = "one two three"


class StagedAsr(FakeAsr):
    """Gives a step's words before their times, as Whisper does; ``fail`` fails the times."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__(TEXT)
        self.fail = fail
        self.closed = False

    async def recognise_stages(
        self, request: RecognitionRequest
    ) -> AsyncGenerator[TranscriptText | TimedTranscript, None]:
        timed = await self.recognise(request)
        try:
            yield TranscriptText(tuple(word.word for word in timed.words), timed.language)
            if self.fail:
                raise RuntimeError("alignment failed")
            yield timed
        finally:
            self.closed = True


async def recognised(asr: FakeAsr, *, text_first: bool) -> list[Any]:
    """What the core is handed for one step."""
    engines = build_engines(Settings(engines="fake"))
    engines.asr = asr
    work = EngineWork(engines, Session(model="m", vad_chunk_ms=32, asr_rate=16000))
    handed: list[Any] = []
    request = RecognitionRequest(np.full(16000, 0.1, np.float32), language="en")
    work.recognise(Recognise("step", request, text_first=text_first), lambda _, r: handed.append(r))
    await work.recognition_idle()
    return handed


async def test_the_words_come_first_then_their_times() -> None:
    asr = StagedAsr()
    text, timed = await recognised(asr, text_first=True)
    assert text == RecognisedText("step", ("one", "two", "three"))
    assert isinstance(timed, Recognised) and timed.request_id == "step"
    assert [word.word for word in timed.transcript.words] == list(text.words)
    assert asr.closed


@pytest.mark.parametrize("text_first", [False, True])
async def test_an_engine_that_cannot_split_gives_the_timed_words_alone(text_first: bool) -> None:
    (timed,) = await recognised(FakeAsr(TEXT), text_first=text_first)
    assert isinstance(timed, Recognised) and timed.transcript.text == TEXT


async def test_a_step_not_asked_for_its_words_first_is_recognised_whole() -> None:
    (timed,) = await recognised(StagedAsr(), text_first=False)
    assert isinstance(timed, Recognised)


async def test_times_that_fail_fail_the_step_after_its_words() -> None:
    asr = StagedAsr(fail=True)
    text, failed = await recognised(asr, text_first=True)
    assert isinstance(text, RecognisedText)
    assert isinstance(failed, TranscriptionFailed) and failed.request_id == "step"
    assert asr.closed

"""The core takes the engines' facts from their interfaces: the VAD's chunk, the ASR's rate."""

from __future__ import annotations

import numpy as np
import pytest

from hark.engines.asr import Urgency

from .conftest import RATE, Driver, silence, voiced
from .test_core import manual


@pytest.mark.parametrize("asr_rate", [8000, 16000, 24000])
def test_recognition_gets_audio_at_the_asr_engines_rate(asr_rate: int) -> None:
    driver = Driver(asr_rate=asr_rate)
    manual(driver)
    driver.append(voiced(300))
    driver.send({"type": "input_audio_buffer.commit"})
    (action,) = driver.steps(Urgency.ANSWER)
    assert len(action.request.audio) == asr_rate * 300 // 1000
    assert action.request.audio.dtype == np.float32


@pytest.mark.parametrize("chunk_ms", [20, 32, 64])
def test_vad_chunks_and_the_turn_clock_follow_the_vad_engines_chunk(chunk_ms: int) -> None:
    driver = Driver(vad_chunk_ms=chunk_ms)
    for pcm in (silence(500), voiced(1000), silence(1000)):
        driver.stream(pcm)
    assert driver.vad_chunk_sizes == {RATE * chunk_ms // 1000}
    started = next(e for e in driver.events if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in driver.events if e["type"] == "input_audio_buffer.speech_stopped")
    # Speech from 500 ms (less the 300 ms of padding) to 1500 ms, then the 500 ms window,
    # each known to within a chunk.
    assert 200 - chunk_ms <= started["audio_start_ms"] <= 200 + chunk_ms
    assert 2000 <= stopped["audio_end_ms"] <= 2000 + 2 * chunk_ms

"""The input buffer's bound: audio past ``MAX_BUFFERED_S`` is dropped, counted and reported
once, and the sample clock keeps counting it."""

from __future__ import annotations

from typing import Any

import numpy as np

from hark.session.actions import CountDroppedAudio
from hark.session.input_buffer import MAX_BUFFERED_S, InputAudioBuffer
from tests.session.conftest import RATE, Driver, silence, voiced

MANUAL = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}


def errors(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event["error"] for event in events if event["type"] == "error"]


def dropped_samples(driver: Driver) -> list[int]:
    return [a.samples for a in driver.actions if isinstance(a, CountDroppedAudio)]


def test_the_buffer_keeps_the_first_audio_whole_and_the_clock_counts_the_rest() -> None:
    buffer = InputAudioBuffer(1000, start_ms=500.0, max_s=1)
    first = np.arange(800, dtype=np.int16)
    assert buffer.append(first) == 0
    # 300 more: 200 fit, 100 are dropped, and from then on every append is dropped whole
    # (a gap inside the kept audio would put later audio at the wrong time).
    assert buffer.append(np.arange(300, dtype=np.int16)) == 100
    assert buffer.overflowing
    assert buffer.append(np.arange(50, dtype=np.int16)) == 50
    assert buffer.samples == 1000
    assert buffer.end_ms == 500 + 1150
    taken = buffer.take_all()
    assert np.array_equal(taken[:800], first) and len(taken) == 1000
    # Emptied, it starts where the last dropped sample ended, and keeps audio again.
    assert not buffer.overflowing
    assert buffer.start_ms == 500 + 1150
    assert buffer.append(np.ones(10, np.int16)) == 0
    assert buffer.samples == 10


def test_trimming_past_the_kept_audio_empties_an_overflowing_buffer() -> None:
    """Under turn detection the buffer is trimmed, never taken whole, while nobody speaks:
    a few kept samples must not hold it full for ever."""
    buffer = InputAudioBuffer(1000, max_s=1)
    buffer.append(np.zeros(1200, np.int16))
    buffer.take(0, 990)
    assert buffer.samples == 10 and buffer.overflowing
    buffer.trim_before(1600)
    assert buffer.samples == 0 and not buffer.overflowing
    assert buffer.start_ms == 1200
    assert buffer.append(np.zeros(10, np.int16)) == 0


def test_a_manual_turn_past_the_bound_keeps_its_first_minutes_and_says_so_once() -> None:
    driver = Driver(audio_retention_s=2 * MAX_BUFFERED_S)
    driver.send(MANUAL)
    minute = voiced(60_000)
    new: list[dict[str, Any]] = []
    for _ in range(MAX_BUFFERED_S // 60):
        new += driver.append(minute, chunk_ms=60_000)
    assert errors(new) == [] and dropped_samples(driver) == []
    # Half a minute more than the bound, in two appends: one error, two counts.
    new = driver.append(voiced(30_000), chunk_ms=15_000)
    (error,) = errors(new)
    assert error["code"] == "input_audio_buffer_full"
    assert f"{MAX_BUFFERED_S} seconds" in error["message"]
    assert dropped_samples(driver) == [15 * RATE, 15 * RATE]
    # The session goes on: the commit holds the audio up to the bound.
    committed = driver.send({"type": "input_audio_buffer.commit"})
    assert [e["type"] for e in committed][:1] == ["input_audio_buffer.committed"]
    audio = driver.session.conversation.get(committed[0]["item_id"]).parts[0].audio
    assert audio is not None and len(audio) == MAX_BUFFERED_S * RATE
    # Emptied, the buffer takes audio again, and a new overflow is reported again.
    assert errors(driver.append(voiced(1000), chunk_ms=1000)) == []
    second = driver.send({"type": "input_audio_buffer.commit"})
    assert second[0]["type"] == "input_audio_buffer.committed"


def test_speech_without_end_keeps_the_clock_of_its_turn() -> None:
    """With server VAD a turn longer than the bound keeps its first minutes, and the stop
    is placed on the clock where it was heard, dropped audio included."""
    driver = Driver(audio_retention_s=2 * MAX_BUFFERED_S)
    talk_ms = (MAX_BUFFERED_S + 20) * 1000
    new = driver.append(voiced(talk_ms), chunk_ms=1000)
    (error,) = errors(new)
    assert error["code"] == "input_audio_buffer_full"
    new += driver.append(silence(2000), chunk_ms=100)
    started = next(e for e in new if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in new if e["type"] == "input_audio_buffer.speech_stopped")
    assert stopped["audio_end_ms"] >= talk_ms > started["audio_start_ms"]
    committed = next(e for e in new if e["type"] == "input_audio_buffer.committed")
    audio = driver.session.conversation.get(committed["item_id"]).parts[0].audio
    assert audio is not None and len(audio) <= MAX_BUFFERED_S * RATE
    # The next turn is heard where it is spoken.
    later = driver.append(voiced(1000), chunk_ms=100)
    restarted = next(e for e in later if e["type"] == "input_audio_buffer.speech_started")
    assert restarted["audio_start_ms"] >= talk_ms + 2000 - 500

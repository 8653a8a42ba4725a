"""Incremental recognition with Whisper: one window's words, timed and scored, and the
scheduler that batches the windows of several sessions."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines.asr import (
    AsrEngine,
    RecognitionRequest,
    TimedTranscript,
    TranscriptText,
    Urgency,
)
from hark.engines.asr.whisper import WhisperAsr, _restored
from tests.helpers.text import words

from .conftest import Say

pytestmark = pytest.mark.slow

RATE = 16000
# Bounds a hang, never speed.
LIVENESS_S = 60.0
LONG = "Could you tell me what the capital of France is, and how many people live there?"
KITCHEN = "Turn off the lights in the kitchen."
PHONE = "My phone number is four one five five five five one two three four."


@pytest.fixture(scope="module")
def asr() -> WhisperAsr:
    # One engine for the module: loading the model takes a second or two. One worker: the
    # batching and cancellation tests hold it busy so that the others' requests queue.
    return WhisperAsr(workers=1)


def silence(seconds: float) -> npt.NDArray[np.float32]:
    return np.zeros(int(seconds * RATE), dtype=np.float32)


def heard(timed: TimedTranscript) -> list[str]:
    return [w for word in timed.words for w in words(word.word)]


async def test_a_window_gives_its_words_in_order_timed_and_scored(
    asr: WhisperAsr, say: Say
) -> None:
    engine: AsrEngine = asr
    audio = np.concatenate((silence(1.0), say(LONG)))
    duration = audio.size / RATE
    timed = await engine.recognise(RecognitionRequest(audio, language="en"))
    assert timed.language == "en" and timed.duration == duration
    assert {"capital", "france", "people", "live"} <= set(heard(timed))
    assert heard(timed) == words(timed.text)
    times = [t for word in timed.words for t in (word.start, word.end)]
    assert times == sorted(times) and times[0] >= 0.0 and times[-1] <= duration
    # The words are where they were said: after the second of silence, "capital" before
    # "people", and the last word ends with the speech.
    at = {w: word for word in timed.words for w in words(word.word)}
    assert 1.0 <= at["capital"].start < at["people"].start
    assert duration - timed.words[-1].end <= 0.5
    for word in timed.words:
        assert word.probability is not None and 0.0 < word.probability <= 1.0
        assert word.word.startswith(" ")
    (segment,) = timed.segments
    assert segment.text == timed.text and segment.tokens
    assert (segment.start, segment.end) == (timed.words[0].start, timed.words[-1].end)


async def test_a_prompt_leaves_the_words_as_they_are(asr: WhisperAsr, say: Say) -> None:
    for text in (LONG, KITCHEN, PHONE):
        alone = await asr.recognise(RecognitionRequest(say(text)))
        prompted = await asr.recognise(
            RecognitionRequest(say(text), prompt="Tell me a joke about penguins, please.")
        )
        assert heard(prompted) == heard(alone), text


async def test_words_after_a_long_pause_keep_their_place(asr: WhisperAsr, say: Say) -> None:
    first, second = (
        say("My phone number is four one five,"),
        say("five five five, one two three four."),
    )
    audio = np.concatenate((first, silence(1.2), second))
    timed = await asr.recognise(RecognitionRequest(audio))
    # Whisper tiny ends its transcript at a long pause unless it is shortened ...
    digits = {"one": "1", "two": "2", "three": "3", "four": "4", "five": "5"}
    assert "".join(digits.get(w, w) for w in heard(timed)).endswith("5551234")
    # ... and the times are those of the audio as given, pause included.
    assert audio.size / RATE - timed.words[-1].end <= 0.5


def test_compacted_times_are_moved_back_around_the_removed_frames() -> None:
    # Frames 0-9 kept, 10-39 removed, 40-59 kept: 0.3 s taken out after 0.1 s.
    kept = np.concatenate((np.arange(10), np.arange(40, 60)))
    assert _restored(0.05, kept, end=False) == pytest.approx(0.05)
    assert _restored(0.10, kept, end=False) == pytest.approx(0.40)
    assert _restored(0.10, kept, end=True) == pytest.approx(0.10)
    assert _restored(0.15, kept, end=True) == pytest.approx(0.45)
    # Past the last whole frame (the samples short of one), time runs on.
    assert _restored(0.305, kept, end=True) == pytest.approx(0.605)


async def test_silence_and_overlong_windows(asr: WhisperAsr) -> None:
    quiet = await asr.recognise(RecognitionRequest(silence(2.0)))
    assert (quiet.segments, quiet.words, quiet.language, quiet.duration) == ((), (), "en", 2.0)
    with pytest.raises(ValueError):
        await asr.recognise(RecognitionRequest(silence(30.5)))
    with pytest.raises(ValueError):
        await asr.recognise(RecognitionRequest(silence(1.0), language="klingon"))


class Held:
    """Holds the scheduler's thread in a call until released, so that work queues."""

    def __init__(self, asr: WhisperAsr) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.task = asyncio.create_task(asr._call(self._hold, Urgency.ANSWER))

    def _hold(self) -> None:
        self.started.set()
        self.release.wait(LIVENESS_S)

    async def __aenter__(self) -> Held:
        assert await asyncio.to_thread(self.started.wait, LIVENESS_S)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        await self.task


async def queued() -> None:
    """Let the tasks just created run their first step: a recognition with the model
    loaded queues its window there."""
    await asyncio.sleep(0)


def record_batches(asr: WhisperAsr, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of windows of each batch the engine decodes from now on."""
    sizes: list[int] = []
    decode = asr._decode_windows

    def recorded(loaded: Any, windows: Sequence[Any]) -> Any:
        sizes.append(len(windows))
        return decode(loaded, windows)

    monkeypatch.setattr(asr, "_decode_windows", recorded)
    return sizes


async def test_a_batch_gives_each_window_the_words_it_has_alone(
    asr: WhisperAsr, say: Say, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = [
        RecognitionRequest(say(LONG)),
        RecognitionRequest(say(KITCHEN), prompt="Hi there."),
        RecognitionRequest(say(PHONE), urgency=Urgency.CAPTION),
        RecognitionRequest(np.concatenate((silence(0.7), say(KITCHEN))), prompt="Hello."),
        RecognitionRequest(say("Tell me a joke."), urgency=Urgency.SPECULATION),
    ]
    await asr.warmup()
    alone = [heard(await asr.recognise(request)) for request in requests]
    sizes = record_batches(asr, monkeypatch)
    async with Held(asr):
        tasks = [asyncio.create_task(asr.recognise(request)) for request in requests]
        await queued()
        assert asr.scheduler.waiting == len(requests)
    together = [heard(timed) for timed in await asyncio.gather(*tasks)]
    assert sizes == [len(requests)]
    assert together == alone
    assert all(alone)


async def test_cancelling_a_waiting_window_leaves_the_scheduler_free(
    asr: WhisperAsr, say: Say, monkeypatch: pytest.MonkeyPatch
) -> None:
    await asr.warmup()
    sizes = record_batches(asr, monkeypatch)
    async with Held(asr):
        given_up = asyncio.create_task(asr.recognise(RecognitionRequest(say(LONG))))
        await queued()
        assert asr.scheduler.waiting == 1
        given_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await given_up
        assert asr.scheduler.waiting == 0
    timed = await asr.recognise(RecognitionRequest(say(KITCHEN)))
    assert {"lights", "kitchen"} <= set(heard(timed))
    # Only the second window was decoded; nothing is left queued or running.
    assert sizes == [1]
    assert (asr.scheduler.waiting, asr.scheduler.running) == (0, 0)


async def test_cancelling_a_running_window_abandons_it(
    asr: WhisperAsr, say: Say, monkeypatch: pytest.MonkeyPatch
) -> None:
    await asr.warmup()
    running = threading.Event()
    go_on = threading.Event()
    decode = asr._decode_windows

    def held(loaded: Any, windows: Sequence[Any]) -> Any:
        running.set()
        go_on.wait(LIVENESS_S)
        return decode(loaded, windows)

    monkeypatch.setattr(asr, "_decode_windows", held)
    abandoned = asyncio.create_task(asr.recognise(RecognitionRequest(say(LONG))))
    assert await asyncio.to_thread(running.wait, LIVENESS_S)
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    monkeypatch.setattr(asr, "_decode_windows", decode)
    go_on.set()
    timed = await asr.recognise(RecognitionRequest(say(KITCHEN)))
    assert {"lights", "kitchen"} <= set(heard(timed))
    assert (asr.scheduler.waiting, asr.scheduler.running) == (0, 0)


async def test_two_workers_recognise_two_windows_at_once(say: Say) -> None:
    asr = WhisperAsr(workers=2)
    await asr.warmup()
    requests = [RecognitionRequest(say(KITCHEN)), RecognitionRequest(say(PHONE))]
    alone = [heard(await asr.recognise(request)) for request in requests]
    async with Held(asr):
        # The first worker is held: the second takes the next window and answers it.
        assert heard(await asyncio.wait_for(asr.recognise(requests[0]), LIVENESS_S)) == alone[0]
    assert heard(await asr.recognise(requests[1])) == alone[1]
    asr.close()


async def stages(asr: WhisperAsr, request: RecognitionRequest) -> list[Any]:
    return [stage async for stage in asr.recognise_stages(request)]


async def test_the_words_come_before_their_times_from_one_decode(
    asr: WhisperAsr, say: Say, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = [
        RecognitionRequest(np.concatenate((silence(0.6), say(LONG))), urgency=Urgency.DECISION),
        RecognitionRequest(say(KITCHEN), prompt="Hi there.", urgency=Urgency.DECISION),
        RecognitionRequest(np.concatenate((say(KITCHEN), silence(1.5), say(PHONE)))),
    ]
    await asr.warmup()
    for request in requests:
        alone = await asr.recognise(request)
        sizes = record_batches(asr, monkeypatch)
        text, timed = await stages(asr, request)
        monkeypatch.undo()
        assert sizes == [1]
        assert isinstance(text, TranscriptText) and isinstance(timed, TimedTranscript)
        assert list(text.words) == [word.word for word in timed.words]
        assert text.text == timed.text and text.language == timed.language
        assert timed == alone
        assert asr.kept_memories == 0


async def test_silence_gives_its_timed_transcript_alone(asr: WhisperAsr) -> None:
    (quiet,) = await stages(asr, RecognitionRequest(silence(2.0)))
    assert quiet == await asr.recognise(RecognitionRequest(silence(2.0)))
    assert quiet.segments == () and asr.kept_memories == 0


async def test_a_request_given_up_between_its_stages_lets_go_of_its_memory(
    asr: WhisperAsr, say: Say
) -> None:
    await asr.warmup()
    # Closed after the words: the encoder output kept for their times goes with it.
    iterator = asr.recognise_stages(RecognitionRequest(say(KITCHEN)))
    assert isinstance(await anext(iterator), TranscriptText)
    assert asr.kept_memories == 1
    await iterator.aclose()
    # The scheduler's thread lets go of the batch it handed out once the next one comes.
    await asr.recognise(RecognitionRequest(say(KITCHEN)))
    assert asr.kept_memories == 0
    # Cancelled while its alignment waits behind other work.
    iterator = asr.recognise_stages(RecognitionRequest(say(LONG)))
    assert isinstance(await anext(iterator), TranscriptText)
    async with Held(asr):
        aligning = asyncio.create_task(anext(iterator))
        await queued()
        assert asr.scheduler.waiting == 1 and asr.kept_memories == 1
        aligning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await aligning
        assert asr.scheduler.waiting == 0
    assert asr.kept_memories == 0
    assert (asr.scheduler.waiting, asr.scheduler.running) == (0, 0)

"""The batcher: batched VAD equals unbatched VAD, streams never share state, no caller waits
for another."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines.vad import VadEngine
from hark.engines.vad.batcher import (
    BatchedSileroVad,
    BatchedSileroVadStream,
    Batcher,
    BatcherClosedError,
)
from hark.engines.vad.silero import CHUNK_SAMPLES, SileroVad

# Generous: these bound hangs, never speed.
LIVENESS_S = 30.0


class Recorder:
    """A batch observer that keeps what it is told."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.backlogs: list[int] = []

    def batch(self, size: int, wait_s: float, run_s: float, backlog: int) -> None:
        self.sizes.append(size)
        self.backlogs.append(backlog)


def chunks_of(audio: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
    usable = len(audio) - len(audio) % CHUNK_SAMPLES
    return list(audio[:usable].reshape(-1, CHUNK_SAMPLES))


async def probabilities(stream: object, audio: npt.NDArray[np.float32]) -> list[float]:
    assert hasattr(stream, "probability")
    return [await stream.probability(chunk) for chunk in chunks_of(audio)]


@pytest.fixture
async def batched() -> AsyncIterator[BatchedSileroVad]:
    engine = BatchedSileroVad(max_batch=64, max_wait_ms=20)
    engine.batcher.observer = Recorder()
    await engine.warmup()
    yield engine
    await engine.aclose()


def signals(question: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
    """Different audio per stream, so that any mixing of state or rows shows."""
    rng = np.random.default_rng(7)
    gap = np.zeros(8000, dtype=np.float32)
    return [
        np.concatenate((gap, question, gap)),
        np.zeros(len(question) + 16000, dtype=np.float32),
        (0.02 * rng.standard_normal(len(question) + 16000)).astype(np.float32),
        np.concatenate((np.zeros(3 * CHUNK_SAMPLES + 100, np.float32), question, gap)),
        np.concatenate((gap, 0.3 * question, gap)).astype(np.float32),
        np.concatenate((question, question[::-1])),
    ]


def test_is_a_vad_engine() -> None:
    engine: VadEngine = BatchedSileroVad()
    assert (engine.sample_rate, engine.chunk_samples) == (16000, 512)


async def test_batched_equals_unbatched_row_for_row(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    reference = SileroVad()
    audio = signals(question)
    expected = [await probabilities(reference.open_stream(), a) for a in audio]
    results = await asyncio.wait_for(
        asyncio.gather(*(probabilities(batched.open_stream(), a) for a in audio)), LIVENESS_S
    )
    for got, want in zip(results, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    # The streams really were batched together, and the speech was heard.
    recorder = batched.batcher.observer
    assert isinstance(recorder, Recorder)
    assert max(recorder.sizes) == len(audio)
    assert max(results[0]) > 0.9 and max(results[1]) < 0.1


async def test_reset_forgets_the_stream(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    stream = batched.open_stream()
    await probabilities(stream, question[: 10 * CHUNK_SAMPLES])
    stream.reset()
    after_reset = await probabilities(stream, question)
    fresh = await probabilities(batched.open_stream(), question)
    np.testing.assert_allclose(after_reset, fresh, atol=1e-6)


async def test_a_cancelled_chunk_leaves_the_state_untouched(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    chunks = chunks_of(question)
    stream = batched.open_stream()
    # Whether or not its batch has run yet, the cancelled chunk must leave no trace.
    task = asyncio.create_task(stream.probability(chunks[0] * 0.5))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    got = [await stream.probability(chunk) for chunk in chunks]
    want = await probabilities(batched.open_stream(), question)
    np.testing.assert_allclose(got, want, atol=1e-6)


async def test_overlapping_calls_on_one_stream_are_refused(batched: BatchedSileroVad) -> None:
    stream: BatchedSileroVadStream = batched.open_stream()
    silence = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
    first = asyncio.create_task(stream.probability(silence))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="overlap"):
        await stream.probability(silence)
    assert await first < 0.1


async def test_a_chunk_of_the_wrong_shape_is_refused(batched: BatchedSileroVad) -> None:
    with pytest.raises(ValueError, match="512 samples"):
        await batched.open_stream().probability(np.zeros(100, dtype=np.float32))


# ------------------------------------------------------------------ the generic batcher


class Doubler:
    """A model that doubles numbers and remembers every batch it ran."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, items: list[int]) -> Sequence[int]:
        self.batches.append(list(items))
        return [2 * item for item in items]


async def test_each_caller_gets_its_own_result() -> None:
    model = Doubler()
    batcher: Batcher[int, int] = Batcher(model, max_batch=16, max_wait_ms=5)
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(i) for i in range(100))), LIVENESS_S
        )
    finally:
        batcher.close()
    assert results == [2 * i for i in range(100)]
    assert max(len(batch) for batch in model.batches) <= 16
    assert sorted(i for batch in model.batches for i in batch) == list(range(100))


async def test_a_batch_does_not_wait_for_a_silent_caller() -> None:
    model = Doubler()
    batcher: Batcher[int, int] = Batcher(model, max_batch=8, max_wait_ms=10)
    try:
        early = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(i) for i in range(3))), LIVENESS_S
        )
        # The fourth caller speaks only once the others are answered: a batcher that waited
        # for every caller would never answer them.
        late = await asyncio.wait_for(batcher.submit(3), LIVENESS_S)
    finally:
        batcher.close()
    assert (early, late) == ([0, 2, 4], 6)
    # How the first three were grouped depends on scheduling; the late one went alone.
    assert [3] in model.batches
    assert sorted(i for batch in model.batches if 3 not in batch for i in batch) == [0, 1, 2]


async def test_a_full_batch_leaves_before_the_deadline() -> None:
    model = Doubler()
    batcher: Batcher[int, int] = Batcher(model, max_batch=4, max_wait_ms=3_600_000)
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(i) for i in range(4))), LIVENESS_S
        )
    finally:
        batcher.close()
    assert results == [0, 2, 4, 6]


async def test_a_stalled_caller_does_not_hold_back_the_others() -> None:
    """A caller whose event loop is stuck gets its result later; the others get theirs now."""
    model = Doubler()
    batcher: Batcher[int, int] = Batcher(model, max_batch=8, max_wait_ms=5)
    submitted = threading.Event()
    release = threading.Event()
    stalled_result: list[int] = []

    async def stalled_caller() -> None:
        task = asyncio.create_task(batcher.submit(100))
        await asyncio.sleep(0)
        submitted.set()
        # Block this loop outright, as a session stuck in a long computation would.
        release.wait(LIVENESS_S)
        stalled_result.append(await task)

    thread = threading.Thread(target=asyncio.run, args=(stalled_caller(),))
    thread.start()
    try:
        assert await asyncio.to_thread(submitted.wait, LIVENESS_S)
        results = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(i) for i in range(20))), LIVENESS_S
        )
        assert results == [2 * i for i in range(20)]
        assert not stalled_result
    finally:
        release.set()
        await asyncio.to_thread(thread.join, LIVENESS_S)
        batcher.close()
    assert stalled_result == [200]


async def test_a_model_error_fails_that_batch_only() -> None:
    def flaky(items: list[int]) -> Sequence[int]:
        if 13 in items:
            raise ValueError("unlucky")
        return items

    batcher: Batcher[int, int] = Batcher(flaky, max_batch=1, max_wait_ms=0)
    try:
        with pytest.raises(ValueError, match="unlucky"):
            await asyncio.wait_for(batcher.submit(13), LIVENESS_S)
        assert await asyncio.wait_for(batcher.submit(12), LIVENESS_S) == 12
    finally:
        batcher.close()


async def test_a_closed_batcher_fails_waiting_and_new_items() -> None:
    started = threading.Event()
    proceed = threading.Event()

    def closes_while_running(items: list[int]) -> Sequence[int]:
        started.set()
        proceed.wait(LIVENESS_S)
        # Closed while this batch runs: it still finishes, the next one never starts.
        batcher.close()
        return items

    batcher: Batcher[int, int] = Batcher(closes_while_running, max_batch=8, max_wait_ms=0)
    running = asyncio.create_task(batcher.submit(1))
    assert await asyncio.to_thread(started.wait, LIVENESS_S)
    waiting = asyncio.create_task(batcher.submit(2))
    await asyncio.sleep(0)
    proceed.set()
    assert await asyncio.wait_for(running, LIVENESS_S) == 1
    with pytest.raises(BatcherClosedError):
        await asyncio.wait_for(waiting, LIVENESS_S)
    with pytest.raises(BatcherClosedError):
        await batcher.submit(3)


async def test_a_lone_caller_is_not_held_for_the_deadline() -> None:
    # Nobody else is submitting, so waiting an hour for company would gather nobody.
    batcher: Batcher[int, int] = Batcher(Doubler(), max_batch=8, max_wait_ms=3_600_000)
    try:
        for i in range(5):
            assert await asyncio.wait_for(batcher.submit(i), LIVENESS_S) == 2 * i
    finally:
        batcher.close()


async def test_the_observer_sees_every_batch() -> None:
    recorder = Recorder()
    batcher: Batcher[int, int] = Batcher(Doubler(), max_batch=5, observer=recorder)
    try:
        await asyncio.wait_for(asyncio.gather(*(batcher.submit(i) for i in range(12))), LIVENESS_S)
    finally:
        batcher.close()
    assert sum(recorder.sizes) == 12
    assert max(recorder.sizes) == 5

"""The batched VAD: it equals unbatched VAD, streams never share state, no stream or event loop
waits for another."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from hark.engines import ObservableEngine
from hark.engines.llm.failover import BackendObserver
from hark.engines.vad import Outcomes, VadEngine, silero_gemm
from hark.engines.vad.batcher import (
    VAD_WORTH_WAITING_ROWS,
    ArrivalRate,
    BatchedSileroVad,
    BatchedSileroVadStream,
    BatcherClosedError,
    BatchObserver,
)
from hark.engines.vad.delivery import DROPPED
from hark.engines.vad.resample import chunk_resampler
from hark.engines.vad.silero import (
    CHUNK_SAMPLES,
    SAMPLE_RATE,
    SileroVad,
    initial_states,
    model_path,
    run_batch,
)

from .tolerances import assert_probabilities_close, assert_sums_close

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


class Recording:
    """Metrics that hand a :class:`Recorder` to the VAD."""

    def __init__(self) -> None:
        self.recorder = Recorder()

    def batch_observer(self, model: str) -> BatchObserver:
        assert model == "vad"
        return self.recorder

    def llm_backend_observer(self) -> BackendObserver:
        raise AssertionError("the VAD has no LLM backends")

    def engine_restarted(self, engine: str) -> None:
        raise AssertionError("the VAD reports its restarts through hark.engines.health")


def observed(engine: BatchedSileroVad) -> Recorder:
    """What ``engine`` reports about its batches from now on."""
    assert isinstance(engine, ObservableEngine)
    metrics = Recording()
    engine.observe(metrics)
    return metrics.recorder


def chunks_of(audio: npt.NDArray[np.float32], size: int = CHUNK_SAMPLES) -> list[npt.NDArray]:
    usable = len(audio) - len(audio) % size
    return list(audio[:usable].reshape(-1, size))


async def probabilities(stream: object, audio: npt.NDArray[np.float32]) -> list[float]:
    assert hasattr(stream, "probability")
    return [await stream.probability(chunk) for chunk in chunks_of(audio)]


def as_int16(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]:
    return np.clip(np.rint(audio * 32768), -32768, 32767).astype(np.int16)


class Listener:
    """Collects one stream's results and says when ``expected`` of them have come."""

    def __init__(self, expected: int) -> None:
        self.results: list[tuple[float, int]] = []
        self.expected = expected
        self.done = asyncio.Event()

    def __call__(self, outcomes: Outcomes) -> None:
        assert threading.current_thread() is threading.main_thread()
        # A chunk the engine dropped or failed on is no result: the test waiting for it
        # runs into its liveness bound.
        self.results += [(p, epoch) for p, epoch in outcomes if isinstance(p, float)]
        if len(self.results) >= self.expected:
            self.done.set()

    @property
    def probabilities(self) -> list[float]:
        return [p for p, _ in self.results]


async def pushed(
    engine: BatchedSileroVad, audio: npt.NDArray, size: int = CHUNK_SAMPLES, epoch: int = 0
) -> list[float]:
    """Push all of ``audio`` at once, as a session sending a long append would."""
    chunks = chunks_of(audio, size)
    listener = Listener(len(chunks))
    stream = engine.open_stream(listener)
    for chunk in chunks:
        stream.push(chunk, epoch)
    await asyncio.wait_for(listener.done.wait(), LIVENESS_S)
    stream.close()
    return listener.probabilities


@pytest.fixture
async def batched() -> AsyncIterator[BatchedSileroVad]:
    engine = BatchedSileroVad(max_batch=64, max_wait_ms=20)
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
    assert engine.chunk_ms == 32


async def test_batched_equals_unbatched_row_for_row(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    reference = SileroVad()
    audio = signals(question)
    expected = [await probabilities(reference.open_stream(), a) for a in audio]
    recorder = observed(batched)
    results = await asyncio.gather(*(pushed(batched, a) for a in audio))
    for got, want in zip(results, expected, strict=True):
        assert_probabilities_close(got, want)
    # The streams really were batched together, and the speech was heard.
    assert max(recorder.sizes) == len(audio)
    assert max(results[0]) > 0.9 and max(results[1]) < 0.1


async def test_int16_chunks_give_the_float_results(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    audio = signals(question)[0]
    floats = await pushed(batched, audio)
    ints = await pushed(batched, as_int16(audio))
    np.testing.assert_allclose(ints, floats, atol=0.03)


@pytest.mark.parametrize("rate", [8000, 24000, 48000])
async def test_other_rates_are_resampled_in_the_batch(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32], rate: int
) -> None:
    gap = np.zeros(8000, dtype=np.float32)
    audio = np.concatenate((gap, question, gap))
    at_rate = soxr.resample(audio, 16000, rate).astype(np.float32)
    got = np.array(await pushed(batched, at_rate, rate * 32 // 1000))
    # The reference hears the same band: the audio at `rate` brought back to 16 kHz by soxr.
    back = soxr.resample(at_rate, rate, 16000).astype(np.float32)
    want = np.array(await probabilities(SileroVad().open_stream(), back))
    count = min(len(got), len(want))
    assert abs(len(got) - len(want)) <= 1
    assert np.abs(got[:count] - want[:count]).mean() < 0.02
    assert ((got[:count] > 0.5) == (want[:count] > 0.5)).mean() > 0.97
    assert got.max() > 0.9 and got[:5].max() < 0.1


async def test_the_rows_of_one_push_are_answered_together_as_if_pushed_one_by_one(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    audio = signals(question)[0]
    one_by_one = await pushed(batched, audio)
    rows = np.array(chunks_of(audio))
    listener = Listener(len(rows))
    # How many answers each call brought.
    sizes: list[int] = []

    def answered(outcomes: Outcomes) -> None:
        sizes.append(len(outcomes))
        listener(outcomes)

    stream = batched.open_stream(answered)
    for start in range(0, len(rows), 3):
        stream.push(rows[start : start + 3], 0)
        await asyncio.sleep(0.05)
    await asyncio.wait_for(listener.done.wait(), LIVENESS_S)
    stream.close()
    assert_probabilities_close(listener.probabilities, one_by_one)
    # Each push of three rows came back whole, in one call (the last push may hold fewer).
    assert sizes[:-1] == [3] * (len(sizes) - 1), sizes
    assert sum(sizes) == len(rows)


async def test_pushes_of_many_rows_at_several_rates_equal_one_chunk_at_a_time(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    # Streams at 8, 16 and 24 kHz push 1 to 6 rows at a time (beyond what one batch takes of
    # a stream) side by side, and start a new epoch halfway: a batch then holds streams with
    # different numbers of chunks, whose encoder rows run together and whose recurrent steps
    # run one after another. Each stream must hear what it hears one chunk at a time.
    streams = []
    for index, rate in enumerate((16000, 24000, 8000, 16000, 24000)):
        audio = signals(question)[index]
        at_rate = soxr.resample(audio, 16000, rate).astype(np.float32) if rate != 16000 else audio
        rows = np.array(chunks_of(at_rate, rate * 32 // 1000))
        half = len(rows) // 2
        one_by_one = await pushed(batched, rows[:half].reshape(-1), rows.shape[1])
        one_by_one += await pushed(batched, rows[half:].reshape(-1), rows.shape[1])
        streams.append((rows, half, one_by_one, index % 6 + 1))
    listeners = [Listener(len(rows)) for rows, *_ in streams]
    opened = [batched.open_stream(listener) for listener in listeners]
    offsets = [0] * len(streams)
    while any(offset < len(rows) for offset, (rows, *_) in zip(offsets, streams, strict=True)):
        for index, (rows, half, _, size) in enumerate(streams):
            start = offsets[index]
            if start >= len(rows):
                continue
            stop = min(start + size, half if start < half else len(rows))
            opened[index].push(rows[start:stop], 0 if start < half else 1)
            offsets[index] = stop
        await asyncio.sleep(0.01)
    for listener, stream, (_, half, one_by_one, _) in zip(listeners, opened, streams, strict=True):
        await asyncio.wait_for(listener.done.wait(), LIVENESS_S)
        stream.close()
        assert [epoch for _, epoch in listener.results] == [0] * half + [1] * (
            len(one_by_one) - half
        )
        assert_probabilities_close(listener.probabilities, one_by_one)


async def test_a_push_can_be_answered_in_one_call_with_the_misses_before_it(
    question: npt.NDArray[np.float32],
) -> None:
    # A queue of two: of a push of five rows, the first three are dropped as it is queued
    # (under the batcher's lock, so its thread takes none before), and their misses come
    # first, in the same call as the two answers.
    engine = BatchedSileroVad(max_batch=64, max_wait_ms=20, max_queued=2)
    await engine.warmup()
    rows = np.array(chunks_of(signals(question)[0]))[:8]
    one_by_one = await pushed(engine, rows[3:5].reshape(-1))
    calls: list[Outcomes] = []
    done = asyncio.Event()

    def outcomes(answers: Outcomes) -> None:
        assert threading.current_thread() is threading.main_thread()
        calls.append(list(answers))
        done.set()

    stream = engine.open_stream(outcomes)
    stream.push(rows[:5], 4)
    await asyncio.wait_for(done.wait(), LIVENESS_S)
    stream.close()
    await engine.aclose()
    (answers,) = calls
    assert [epoch for _, epoch in answers] == [4] * 5
    assert answers[:3] == [(DROPPED, 4)] * 3
    assert all(isinstance(p, float) for p, _ in answers[3:])
    assert_probabilities_close([p for p, _ in answers[3:] if isinstance(p, float)], one_by_one)


def test_the_resampler_keeps_the_speech_band() -> None:
    resampler = chunk_resampler(24000)
    t = np.arange(768 * 60) / 24000
    tone = np.sin(2 * np.pi * 1000 * t).astype(np.float32)
    alias = np.sin(2 * np.pi * 11000 * t).astype(np.float32)  # above 8 kHz: must be removed
    for signal, low, high in ((tone, 0.95, 1.05), (alias, 0.0, 0.05)):
        history = np.zeros(resampler.history, dtype=np.float32)
        out = []
        for chunk in signal.reshape(-1, 768):
            row = np.concatenate((history, chunk))[np.newaxis]
            out.append(resampler.run(row)[0])
            history = row[0, -resampler.history :]
        steady = np.concatenate(out)[1600:]
        amplitude = np.sqrt(2 * np.mean(steady**2))
        assert low <= amplitude <= high, (signal is tone, amplitude)


@pytest.mark.parametrize(
    ("rate", "target"),
    [(24000, 16000), (8000, 16000), (48000, 16000), (12000, 16000), (24000, 8000)],
)
def test_the_block_product_is_the_polyphase_filter(rate: int, target: int) -> None:
    """Output up*m + r of a row is phase (r*down) % up of the filter, applied from input
    sample down*m + (r*down) // up: the definition, evaluated one output at a time."""
    resampler = chunk_resampler(rate, target)
    generator = np.random.default_rng(rate)
    rows = generator.standard_normal((3, resampler.history + resampler.in_samples), np.float32)
    got = resampler.run(rows)
    up, down, width = resampler.up, resampler.down, resampler.taps.shape[1]
    want = np.empty_like(got)
    magnitude = np.empty(got.shape, np.float64)
    for j in range(resampler.out_samples):
        m, residue = divmod(j, up)
        start = down * m + residue * down // up
        taps = resampler.taps[residue * down % up]
        want[:, j] = rows[:, start : start + width] @ taps
        magnitude[:, j] = np.abs(rows[:, start : start + width]) @ np.abs(taps.astype(np.float64))
    assert_sums_close(got, want, terms=width, magnitude=magnitude)


async def test_the_8_khz_model_equals_running_it_chunk_by_chunk(
    question: npt.NDArray[np.float32],
) -> None:
    engine = BatchedSileroVad(model_rate=8000)
    await engine.warmup()
    try:
        gap = np.zeros(4000, dtype=np.float32)
        audio = np.concatenate((gap, soxr.resample(question, 16000, 8000), gap))
        audio = audio.astype(np.float32)
        got = await asyncio.gather(*(pushed(engine, a, 256) for a in (audio, 0.5 * audio)))
        # The reference: the model's 8 kHz branch called once per chunk, 32 samples of context.
        session = SileroVad().load()
        for result, signal in zip(got, (audio, 0.5 * audio), strict=True):
            state, context, want = initial_states(1), np.zeros(32, np.float32), []
            for chunk in chunks_of(signal.astype(np.float32), 256):
                window = np.concatenate((context, chunk))[np.newaxis]
                p, state = run_batch(session, window, state, 8000)
                want.append(float(p[0]))
                context = chunk[-32:]
            assert_probabilities_close(result, want)
        assert max(got[0]) > 0.9 and max(got[0][:4]) < 0.1
        # 24 kHz sessions are brought down to 8 kHz in the batch, and still heard.
        at_24k = soxr.resample(audio, 8000, 24000).astype(np.float32)
        from_24k = np.array(await pushed(engine, at_24k, 768))
        count = min(len(from_24k), len(got[0]))
        agree = ((from_24k[:count] > 0.5) == (np.array(got[0][:count]) > 0.5)).mean()
        assert agree > 0.95
    finally:
        await engine.aclose()


async def test_a_new_epoch_starts_afresh(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    chunks = chunks_of(question)
    listener = Listener(2 * len(chunks))
    stream = batched.open_stream(listener)
    for chunk in chunks:
        stream.push(chunk, 0)
    for chunk in chunks:
        stream.push(chunk, 1)
    await asyncio.wait_for(listener.done.wait(), LIVENESS_S)
    first, second = listener.results[: len(chunks)], listener.results[len(chunks) :]
    assert {e for _, e in first} == {0} and {e for _, e in second} == {1}
    # The second pass starts from fresh state, so it equals the first.
    assert_probabilities_close([p for p, _ in second], [p for p, _ in first])


async def test_a_closed_stream_gets_nothing_more_and_frees_its_row(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    chunks = chunks_of(question)
    listener = Listener(len(chunks))
    stream = batched.open_stream(listener)
    for chunk in chunks:
        stream.push(chunk, 0)
    stream.close()
    stream.push(chunks[0], 0)  # after close: ignored
    # A new stream reuses the row and starts clean: its results equal a fresh run's.
    fresh = await pushed(batched, question)
    assert_probabilities_close(fresh, await pushed(batched, question))
    await asyncio.sleep(0.05)
    assert len(listener.results) < len(chunks)


async def test_a_chunk_of_no_supported_rate_is_refused(batched: BatchedSileroVad) -> None:
    stream = batched.open_stream(Listener(1))
    with pytest.raises(ValueError, match="32 ms"):
        stream.push(np.zeros(101, dtype=np.float32), 0)
    with pytest.raises(ValueError, match="3125 Hz"):
        stream.push(np.zeros(100, dtype=np.float32), 0)
    with pytest.raises(ValueError):
        stream.push(np.zeros((2, 2, 512), dtype=np.float32), 0)
    with pytest.raises(ValueError):
        # A float64 chunk is what a caller without types could pass; it must be refused.
        untyped: Any = np.zeros(512, dtype=np.float64)
        stream.push(untyped, 0)
    # 44.1 kHz has no whole number of samples in 32 ms.
    with pytest.raises(ValueError):
        stream.push(np.zeros(1411, dtype=np.int16), 0)


class HeldModel:
    """Silero, but the batch after ``hold()`` waits in the model until ``release()``: what
    is pushed meanwhile waits for the thread whatever the machine's speed."""

    def __init__(self) -> None:
        self._model = silero_gemm.load(model_path())[SAMPLE_RATE]
        self._hold = False
        self.entered = threading.Event()
        self._released = threading.Event()

    def hold(self) -> None:
        self._hold = True

    def release(self) -> None:
        self._released.set()

    def encode(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if self._hold:
            self._hold = False
            self.entered.set()
            self._released.wait(LIVENESS_S)
        return self._model.encode(windows)

    def step(
        self, features: npt.NDArray[np.float32], states: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        return self._model.step(features, states)


async def test_a_slow_stream_does_not_hold_back_the_others(
    question: npt.NDArray[np.float32],
) -> None:
    # One stream pushes a long backlog at once; another pushes a chunk now and then. The
    # other's answers must not wait for the backlog to drain: each batch takes one chunk of
    # every stream that has one. The backlog's first batch is held in the model while the
    # other stream pushes, so that how far the thread got alone is not left to speed.
    model = HeldModel()
    engine = BatchedSileroVad(max_batch=8, max_wait_ms=5, model=model)
    recorder = observed(engine)
    await engine.warmup()
    try:
        backlog = chunks_of(np.tile(question, 8))
        busy = Listener(len(backlog))
        heavy = engine.open_stream(busy)
        model.hold()
        for chunk in backlog:
            heavy.push(chunk, 0)
        assert await asyncio.to_thread(model.entered.wait, LIVENESS_S)
        light = Listener(3)
        other: BatchedSileroVadStream = engine.open_stream(light)
        for chunk in chunks_of(question)[:3]:
            other.push(chunk, 0)
        model.release()
        await asyncio.wait_for(light.done.wait(), LIVENESS_S)
        await asyncio.wait_for(busy.done.wait(), LIVENESS_S)
    finally:
        model.release()
        # The thread has reported its last batch once it is stopped.
        await engine.aclose()
    # The warm-up's chunk; the backlog's first, alone; then the other stream's three chunks,
    # each beside one of the backlog's, and not after the rest of it.
    assert recorder.sizes == [1, 1, 2, 2, 2] + [1] * (len(backlog) - 4)


async def test_ready_results_are_handed_out_without_waiting_for_the_loop(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    # A busy loop runs the engine's wake-up callback late; a session handling input calls
    # deliver_ready first. Here the loop never runs at all between the pushes and the
    # results: they can only have come through deliver_ready, each stream's in order.
    chunks = chunks_of(question)[:6]
    first, second = Listener(len(chunks)), Listener(len(chunks))
    streams = [batched.open_stream(first), batched.open_stream(second)]
    for chunk in chunks:
        for stream in streams:
            stream.push(chunk, 3)
    deadline = time.monotonic() + LIVENESS_S
    while not (first.done.is_set() and second.done.is_set()) and time.monotonic() < deadline:
        time.sleep(0.005)  # noqa: ASYNC251 (blocks the loop, as a long pass over many sockets would)
        streams[1].deliver_ready()
    assert len(first.results) == len(second.results) == len(chunks)
    expected = await pushed(batched, np.concatenate(chunks))
    for listener in (first, second):
        assert {epoch for _, epoch in listener.results} == {3}
        assert_probabilities_close(listener.probabilities, expected)
    # The wake-up callbacks still queued find nothing left to hand out.
    await asyncio.sleep(0.05)
    assert len(first.results) == len(second.results) == len(chunks)
    for stream in streams:
        stream.close()


async def test_a_closed_engine_refuses_pushes() -> None:
    engine = BatchedSileroVad()
    await engine.warmup()
    stream = engine.open_stream(Listener(1))
    await engine.aclose()
    with pytest.raises(BatcherClosedError):
        stream.push(np.zeros(512, dtype=np.float32), 0)


async def test_a_batch_holds_at_most_max_batch_streams(
    question: npt.NDArray[np.float32],
) -> None:
    engine = BatchedSileroVad(max_batch=4, max_wait_ms=20)
    recorder = observed(engine)
    await engine.warmup()
    try:
        audio = signals(question)
        results = await asyncio.gather(*(pushed(engine, a) for a in audio))
    finally:
        # The thread has reported its last batch once it is stopped.
        await engine.aclose()
    assert max(recorder.sizes) == 4
    # The warm-up's chunk, then every chunk of every stream.
    assert sum(recorder.sizes) == 1 + sum(len(r) for r in results)


async def test_a_stalled_event_loop_does_not_hold_back_the_others(
    batched: BatchedSileroVad, question: npt.NDArray[np.float32]
) -> None:
    """A stream whose event loop is stuck gets its results later; the others get theirs now."""
    chunks = chunks_of(question)[:4]
    pushed_there = threading.Event()
    release = threading.Event()
    stalled: list[tuple[float, int]] = []

    async def stalled_loop() -> None:
        done = asyncio.Event()

        def heard(outcomes: Outcomes) -> None:
            stalled.extend((p, epoch) for p, epoch in outcomes if isinstance(p, float))
            if len(stalled) == len(chunks):
                done.set()

        stream = batched.open_stream(heard)
        for chunk in chunks:
            stream.push(chunk, 0)
        pushed_there.set()
        # Block this loop outright, as a loop stuck in a long computation would.
        release.wait(LIVENESS_S)
        await asyncio.wait_for(done.wait(), LIVENESS_S)
        stream.close()

    thread = threading.Thread(target=asyncio.run, args=(stalled_loop(),))
    thread.start()
    try:
        assert await asyncio.to_thread(pushed_there.wait, LIVENESS_S)
        here = await pushed(batched, question)
        assert len(here) == len(chunks_of(question))
        assert not stalled
    finally:
        release.set()
        await asyncio.to_thread(thread.join, LIVENESS_S)
    assert [p for p, _ in stalled] == pytest.approx(here[: len(chunks)], abs=1e-5)


def test_waiting_pays_only_for_enough_expected_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 4 sessions' rate (125 chunks a second) the VAD goes at once; at 200 sessions'
    (6 250 a second) it waits, until fewer than its threshold are still expected."""
    now = [100.0]
    monkeypatch.setattr("hark.engines.vad.batcher.time.monotonic", lambda: now[0])
    for per_second, waits in ((125, False), (6250, True)):
        rate = ArrivalRate()
        rate.count(int(per_second * 0.2))
        now[0] += 0.2
        rate.worth_waiting(now[0], VAD_WORTH_WAITING_ROWS)  # closes a 200 ms window
        rate.per_second = per_second
        remaining = rate.worth_waiting(now[0] + 0.010, VAD_WORTH_WAITING_ROWS)
        assert (remaining is not None) is waits, per_second
        # Fewer rows asked for, the same rate is worth waiting for.
        assert rate.worth_waiting(now[0] + 0.010, 1.0) is not None
        # Too close to the deadline for enough rows to join: go now.
        assert rate.worth_waiting(now[0] + 0.001, VAD_WORTH_WAITING_ROWS) is None


async def test_the_rest_of_a_push_goes_without_waiting_for_others(
    monkeypatch: pytest.MonkeyPatch, question: npt.NDArray[np.float32]
) -> None:
    """A session hears a push's answers only once its last row is answered, so the batches
    that carry the push's later rows leave at once, however long a batch may wait for others
    and however many are expected to come."""
    engine = BatchedSileroVad(max_batch=3, max_wait_ms=3_600_000)
    await engine.warmup()

    def always_worth_waiting(self: ArrivalRate, deadline: float, rows: float) -> float | None:
        remaining = deadline - time.monotonic()
        return remaining if remaining > 0 else None

    monkeypatch.setattr(ArrivalRate, "worth_waiting", always_worth_waiting)
    chunks = chunks_of(question)
    try:
        three = Listener(3)
        long_push = engine.open_stream(three)
        others = [engine.open_stream(Listener(1)) for _ in range(2)]
        # Three streams fill the first batch, which leaves at once; after it only the long
        # push's two rows are left, each alone in a batch that would otherwise wait an hour.
        long_push.push(np.stack(chunks[:3]), 0)
        for stream in others:
            stream.push(chunks[0], 0)
        await asyncio.wait_for(three.done.wait(), LIVENESS_S)
    finally:
        await engine.aclose()
    # And they are the answers the three chunks get one by one.
    reference = BatchedSileroVad(max_batch=3, max_wait_ms=0)
    await reference.warmup()
    try:
        alone = await pushed(reference, np.concatenate(chunks[:3]))
    finally:
        await reference.aclose()
    assert_probabilities_close(three.probabilities, alone)

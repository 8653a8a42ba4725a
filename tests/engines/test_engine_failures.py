"""Engines that fail: a VAD batch that raises, a stream the VAD falls behind on, and engine
threads killed by an exception in their work (issue 16, point 12).

Failures come through real seams: the VAD runs a wrapper of the real Silero model that raises
on command, and a scheduler's work raises what kills a thread. Nothing here is timed: each
test waits for the answers it expects (a liveness bound only stops a hung test).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines import health
from hark.engines.asr import AudioToTranscribe, Urgency
from hark.engines.asr.scheduler import AsrScheduler
from hark.engines.asr.whisper import WhisperAsr
from hark.engines.health import EngineThreadCrashedError
from hark.engines.scheduler import DueFirstScheduler
from hark.engines.stage_timeouts import StageTimeoutError, limit
from hark.engines.vad import Missed, Outcomes, silero_gemm
from hark.engines.vad.batcher import BatchedSileroVad, BatchObserver
from hark.engines.vad.silero import CHUNK_SAMPLES, SAMPLE_RATE, model_path
from hark.observability.metrics import Metrics

LIVENESS_S = 30.0


class ThreadKiller(BaseException):
    """Not an ``Exception``: what kills the engine thread that runs it."""


class FlakyVadModel:
    """The real Silero model at 16 kHz, that fails on command.

    While ``failing`` is set every batch raises ``RuntimeError(message)``; ``kill_next`` makes
    the next batch raise ``ThreadKiller``; with a ``gate``, each batch waits for it (after setting
    ``entered``), as a stalled model would. ``rows`` counts the chunks it has run or failed
    on (``wait_rows`` waits for a count).
    """

    def __init__(self) -> None:
        self.model = silero_gemm.load(model_path())[SAMPLE_RATE]
        self.failing = threading.Event()
        self.message = "the model is broken"
        self.kill_next = threading.Event()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.rows = 0
        self._ran = threading.Condition()

    def encode(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        # A batch's one encoder call, for all its chunks: where it fails or stalls.
        self.entered.set()
        try:
            if self.gate is not None:
                self.gate.wait(LIVENESS_S)
            if self.kill_next.is_set():
                self.kill_next.clear()
                raise ThreadKiller("killed by the test")
            if self.failing.is_set():
                raise RuntimeError(self.message)
            return self.model.encode(windows)
        finally:
            with self._ran:
                self.rows += len(windows)
                self._ran.notify_all()

    def step(
        self, features: npt.NDArray[np.float32], states: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        return self.model.step(features, states)

    def wait_rows(self, rows: int) -> bool:
        """Block until the model has run (or failed on) ``rows`` chunks in all."""
        with self._ran:
            return self._ran.wait_for(lambda: self.rows >= rows, LIVENESS_S)


class Answers:
    """What one stream was told, in order: a probability, or ``("missed", error)``."""

    def __init__(self) -> None:
        self.answers: list[tuple[float | str | None, int]] = []
        self._changed = asyncio.Event()

    def __call__(self, outcomes: Outcomes) -> None:
        for answer, epoch in outcomes:
            if isinstance(answer, Missed):
                error = answer.error
                self.answers.append((f"missed: {error}" if error is not None else None, epoch))
            else:
                self.answers.append((answer, epoch))
        self._changed.set()

    async def count(self, n: int) -> list[tuple[float | str | None, int]]:
        """Wait for ``n`` answers in all; return them."""
        async with asyncio.timeout(LIVENESS_S):
            while len(self.answers) < n:
                self._changed.clear()
                await self._changed.wait()
        return self.answers


def silence() -> npt.NDArray[np.int16]:
    return np.zeros(CHUNK_SAMPLES, dtype=np.int16)


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[BatchedSileroVad, FlakyVadModel]]:
    model = FlakyVadModel()
    engine = BatchedSileroVad(model=model, max_queued=4)
    await engine.warmup()
    yield engine, model
    if model.gate is not None:
        model.gate.set()
    await engine.aclose()
    assert "vad" not in health.degraded()


async def test_a_failed_vad_batch_answers_each_chunk_with_its_error_until_a_batch_succeeds(
    flaky: tuple[BatchedSileroVad, FlakyVadModel],
) -> None:
    engine, model = flaky
    first, second = Answers(), Answers()
    streams = [engine.open_stream(a) for a in (first, second)]
    model.failing.set()
    for stream in streams:
        stream.push(silence(), 0)
    for answers in (first, second):
        # Not silence: a miss that says why.
        assert await answers.count(1) == [("missed: RuntimeError: the model is broken", 0)]
    assert health.degraded()["vad"] == {"code": "engine_failed", "error": "RuntimeError"}

    model.failing.clear()
    streams[0].push(silence(), 0)
    answered = await first.count(2)
    assert isinstance(answered[1][0], float)
    assert "vad" not in health.degraded()
    for stream in streams:
        stream.close()


async def test_a_stream_the_vad_falls_behind_on_drops_its_oldest_chunks_as_misses(
    flaky: tuple[BatchedSileroVad, FlakyVadModel],
) -> None:
    engine, model = flaky
    answers = Answers()
    stream = engine.open_stream(answers)
    model.gate = threading.Event()
    model.entered.clear()
    stream.push(silence(), 0)
    # The model is now stuck on the first chunk; the stream may hold 4 more.
    assert await asyncio.to_thread(model.entered.wait, LIVENESS_S)
    for epoch in (0, 0, 0, 1, 1, 1, 1):
        stream.push(silence(), epoch)
    assert len(stream.queue) == 4
    model.gate.set()

    got = await answers.count(8)
    # Every chunk pushed is answered once, in order: the three oldest waiting were dropped
    # (answered as misses without an error), and the newest four analysed.
    assert [answer if not isinstance(answer, float) else "heard" for answer, _ in got] == [
        "heard",
        None,
        None,
        None,
        "heard",
        "heard",
        "heard",
        "heard",
    ]
    assert [epoch for _, epoch in got] == [0, 0, 0, 0, 1, 1, 1, 1]
    stream.close()


async def test_a_vad_thread_killed_by_its_work_is_started_again_and_serves(
    flaky: tuple[BatchedSileroVad, FlakyVadModel],
) -> None:
    engine, model = flaky
    metrics = Metrics()
    health.watch(metrics)
    answers = Answers()
    stream = engine.open_stream(answers)
    model.kill_next.set()
    stream.push(silence(), 0)
    assert await answers.count(1) == [("missed: ThreadKiller: killed by the test", 0)]
    assert engine.health.restarts == 1
    assert health.degraded()["vad"] == {"code": "engine_thread_died", "error": "ThreadKiller"}
    restarts = metrics.registry.get_sample_value(
        "hark_engine_thread_restarts_total", {"engine": "vad"}
    )
    assert restarts == 1

    # The thread that took the dead one's place answers the next chunk.
    stream.push(silence(), 0)
    answered = await answers.count(2)
    assert isinstance(answered[1][0], float)
    assert "vad" not in health.degraded()
    stream.close()


async def test_a_scheduler_thread_killed_by_its_work_fails_that_call_and_is_started_again() -> None:
    scheduler = DueFirstScheduler(workers=1, name="hark-doomed")

    def kill() -> int:
        raise ThreadKiller("killed by the test")

    def refuse() -> int:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        await scheduler.run(0.0, refuse)
    # An Exception fails its own call only.
    assert "doomed" not in health.degraded()

    with pytest.raises(EngineThreadCrashedError, match="ThreadKiller: killed by the test"):
        await scheduler.run(0.0, kill)
    assert health.degraded()["doomed"] == {"code": "engine_thread_died", "error": "ThreadKiller"}
    assert scheduler.health.restarts == 1

    assert await scheduler.run(0.0, lambda: 42) == 42
    assert "doomed" not in health.degraded()
    assert scheduler.threads == 1


async def test_an_asr_scheduler_thread_killed_by_a_batch_fails_it_and_is_started_again() -> None:
    def run_batch(requests: list[str]) -> list[str]:
        if "kill" in requests:
            raise ThreadKiller("killed by the test")
        return [request.upper() for request in requests]

    scheduler: AsrScheduler[str, str] = AsrScheduler(run_batch, name="hark-doomed-asr")
    try:
        with pytest.raises(EngineThreadCrashedError, match="ThreadKiller"):
            await scheduler.run("kill", Urgency.ANSWER)
        assert health.degraded()["doomed-asr"] == {
            "code": "engine_thread_died",
            "error": "ThreadKiller",
        }
        assert scheduler.health.restarts == 1
        assert scheduler.running == 0

        assert await scheduler.run("words", Urgency.ANSWER) == "WORDS"
        assert "doomed-asr" not in health.degraded()
    finally:
        scheduler.close()


class DoomedWhisper(WhisperAsr):
    """The real Whisper, whose next batch of windows kills its scheduler thread on command."""

    def __init__(self) -> None:
        super().__init__()
        self.kill_next = threading.Event()

    def _decode_windows(self, loaded: Any, windows: Any) -> Any:
        if self.kill_next.is_set():
            self.kill_next.clear()
            raise ThreadKiller("killed by the test")
        return super()._decode_windows(loaded, windows)


@pytest.mark.slow
async def test_a_whisper_thread_killed_by_a_batch_is_ready_again_once_readyz_probes_it() -> None:
    asr = DoomedWhisper()
    metrics = Metrics()
    health.watch(metrics)
    tone = (0.1 * np.sin(np.arange(8000, dtype=np.float32) * 2 * np.pi * 220 / 16000)).astype(
        np.float32
    )
    try:
        await asr.warmup()
        asr.kill_next.set()
        with pytest.raises(EngineThreadCrashedError, match="ThreadKiller: killed by the test"):
            async for _ in asr.transcribe(AudioToTranscribe(tone, language="en")):
                pass
        assert health.degraded()["whisper"] == {
            "code": "engine_thread_died",
            "error": "ThreadKiller",
        }
        restarts = metrics.registry.get_sample_value(
            "hark_engine_thread_restarts_total", {"engine": "whisper"}
        )
        assert restarts == 1

        # No session sends it work (a degraded worker gets none): the probe that /readyz
        # starts finds the new thread serving.
        probes = health.probe_degraded()
        assert probes
        async with asyncio.timeout(LIVENESS_S):
            await asyncio.gather(*probes)
        assert "whisper" not in health.degraded()
    finally:
        asr.close()


class BrokenMetrics(Metrics):
    """The server's metrics, whose VAD batch observer raises once: a bug in the batcher's own
    thread, after the batch's answers went out."""

    def batch_observer(self, model: str) -> BatchObserver:
        observer = super().batch_observer(model)
        broken = [True]

        class Observer:
            def batch(self, size: int, wait_s: float, run_s: float, backlog: int) -> None:
                if broken:
                    broken.clear()
                    raise RuntimeError("the observer is broken")
                observer.batch(size, wait_s, run_s, backlog)

        return Observer()


async def test_a_vad_thread_that_dies_after_answering_is_started_again(
    flaky: tuple[BatchedSileroVad, FlakyVadModel],
) -> None:
    engine, _ = flaky
    metrics = BrokenMetrics()
    engine.observe(metrics)
    answers = Answers()
    stream = engine.open_stream(answers)
    stream.push(silence(), 0)
    assert isinstance((await answers.count(1))[0][0], float)

    # Only a thread that took the dead one's place can answer this one.
    stream.push(silence(), 0)
    assert isinstance((await answers.count(2))[1][0], float)
    assert engine.health.restarts == 1
    assert "vad" not in health.degraded()
    stream.close()


def test_a_part_that_keeps_failing_is_logged_once_per_kind_of_failure_and_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="hark.engines.health")
    part = health.EngineHealth("doomed-part")
    try:
        for _ in range(3):
            part.failed(RuntimeError("the model is broken"))
        part.failed(ValueError("bad weights"))
        logged = [r.getMessage() for r in caplog.records]
        assert logged == [
            "the doomed-part engine is degraded (engine_failed): RuntimeError: the model is broken",
            "the doomed-part engine is degraded (engine_failed): ValueError: bad weights",
        ]
        # A thread that keeps dying before any success waits longer each time, up to a cap.
        delays = [part.restarted(ThreadKiller("again")) for _ in range(12)]
        assert delays[0] == 0.0
        assert all(a < b for a, b in itertools.pairwise(delays[:11]))
        assert delays[-1] == delays[-2] == health.restart_delay(100)
        assert health.degraded()["doomed-part"]["code"] == "engine_thread_died"
        # One success ends both: the next death waits no more.
        part.working()
        assert "doomed-part" not in health.degraded()
        assert part.restarted(ThreadKiller("again")) == 0.0
        part.failed(RuntimeError("the model is broken"))
        # Twelve deaths in a row were one line; after the success, each change is a new one.
        assert [r.getMessage().split("(")[1] for r in caplog.records[2:]] == [
            "engine_thread_died): ThreadKiller: again",
            "engine_thread_died): ThreadKiller: again",
            "engine_failed): RuntimeError: the model is broken",
        ]
    finally:
        part.close()


async def test_a_stage_limit_names_its_stage_and_lets_an_engines_own_timeout_through() -> None:
    with pytest.raises(StageTimeoutError, match="TTS clause timed out") as stalled:
        async with limit(0.01, "TTS clause"):
            await asyncio.Event().wait()
    assert stalled.value.stage == "TTS clause"

    # A timeout of the engine's own (a remote server's) is its error, not the stage limit's.
    with pytest.raises(TimeoutError, match="the server took too long") as own:
        async with limit(LIVENESS_S, "ASR request"):
            raise TimeoutError("the server took too long")
    assert not isinstance(own.value, StageTimeoutError)

"""``hark bench vad``: what one session's 32 ms VAD chunk costs, unbatched and batched.

Four measures, each as CPU time of this process per session-chunk (all threads counted, so
the figure is what a core pays, whatever the machine's other load does to wall time):

- ``model``: Silero alone through ONNX Runtime (``run_batch``) on a batch of B rows.
- ``matmul``: Silero alone as the batcher runs it, an FFT and a few matrix products over the
  whole batch (:mod:`hark.engines.vad.silero_gemm`), on the same B rows.
- ``unbatched``: B concurrent streams of ``SileroVad``, one model call per chunk in a thread
  (what every session cost before batching).
- ``batched``: B concurrent streams of ``BatchedSileroVad``, sharing model calls, fed what
  sessions feed it: 32 ms int16 chunks at 24 kHz, resampled in the batch.

A session sends one chunk every 32 ms, so a core carries at most 32 ms / cost sessions' VAD.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.bench.command import Bench, Result, config_from, list_option, listed
from hark.bench.report import BenchError
from hark.config.options import BenchOption
from hark.engines.vad import Outcomes, silero_gemm
from hark.engines.vad.batcher import VAD_MAX_WAIT_MS, BatchedSileroVad, BatchedSileroVadStream
from hark.engines.vad.silero import (
    CHUNK_SAMPLES,
    SAMPLE_RATE,
    WINDOW_SAMPLES,
    SileroVad,
    initial_states,
    load_session,
    model_path,
    run_batch,
)

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CHUNK_MS = CHUNK_SAMPLES * 1000 / SAMPLE_RATE


OPTIONS: tuple[BenchOption | str, ...] = (
    list_option(
        "batch_sizes",
        "comma-separated batch sizes, i.e. concurrent streams (default 1,2,4,…,256)",
        DEFAULT_BATCH_SIZES,
    ),
    BenchOption("seconds", "time spent on each measure (default 2)", float, 2.0),
    BenchOption(
        "max_wait_ms",
        f"the batcher's deadline (default {VAD_MAX_WAIT_MS:g})",
        float,
        VAD_MAX_WAIT_MS,
    ),
    "json",
)


@dataclass(frozen=True)
class VadBenchConfig:
    """What ``hark bench vad`` measures: its options."""

    batch_sizes: tuple[int, ...]
    seconds: float
    max_wait_ms: float

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> VadBenchConfig:
        """The config of the parsed options; ``BenchError`` when a batch size is wrong."""
        try:
            sizes = listed(options["batch_sizes"], int)
        except ValueError:
            raise BenchError("--batch-sizes takes integers, e.g. 1,8,64") from None
        if not sizes or min(sizes) < 1:
            raise BenchError("batch sizes must be at least 1")
        return config_from(cls, options, batch_sizes=sizes)


def run(config: VadBenchConfig) -> Result:
    """Measure; the report and its summary."""
    report = asyncio.run(measure(list(config.batch_sizes), config.seconds, config.max_wait_ms))
    return Result(report, summary(report))


BENCH = Bench("vad", OPTIONS, VadBenchConfig.from_options, run)
configure_parser, command = BENCH.configure_parser, BENCH.command


async def measure(batch_sizes: list[int], seconds: float, max_wait_ms: float) -> dict[str, Any]:
    """The four measures at every batch size; costs in CPU ms per session-chunk."""
    session = await asyncio.to_thread(load_session, 1)
    gemm = (await asyncio.to_thread(silero_gemm.load, model_path()))[SAMPLE_RATE]
    unbatched = SileroVad()
    batched = BatchedSileroVad(max_batch=max(batch_sizes), max_wait_ms=max_wait_ms)
    await unbatched.warmup()
    await batched.warmup()
    rows = []
    try:
        for size in batch_sizes:
            model = await asyncio.to_thread(
                _model_cost, functools.partial(run_batch, session), size, seconds
            )
            matmul = await asyncio.to_thread(_model_cost, gemm.run, size, seconds)
            plain = await _streams_cost(unbatched, size, seconds)
            shared = await _pushed_cost(batched, size, seconds)
            rows.append(
                {
                    "batch": size,
                    "model_ms": round(model, 4),
                    "matmul_ms": round(matmul, 4),
                    "unbatched_ms": round(plain, 4),
                    "batched_ms": round(shared, 4),
                    "unbatched_sessions_per_core": int(CHUNK_MS / plain),
                    "batched_sessions_per_core": int(CHUNK_MS / shared),
                }
            )
    finally:
        await batched.aclose()
    return {
        "benchmark": "vad",
        "unit": "CPU ms per session-chunk (32 ms of audio)",
        "max_wait_ms": max_wait_ms,
        "seconds_per_measure": seconds,
        "rows": rows,
    }


def summary(report: Mapping[str, Any]) -> str:
    """A table of the report for people."""
    lines = [
        f"VAD cost, {report['unit']}; sessions per core = 32 ms / cost",
        f"{'batch':>5} {'model':>8} {'matmul':>8} {'unbatched':>10} {'batched':>8}"
        f" {'sess/core unbatched':>20} {'batched':>8}",
    ]
    for row in report["rows"]:
        lines.append(
            f"{row['batch']:>5} {row['model_ms']:>8.3f} {row['matmul_ms']:>8.3f}"
            f" {row['unbatched_ms']:>10.3f}"
            f" {row['batched_ms']:>8.3f} {row['unbatched_sessions_per_core']:>20}"
            f" {row['batched_sessions_per_core']:>8}"
        )
    return "\n".join(lines)


def _noise(rows: int, samples: int, seed: int = 0) -> npt.NDArray[np.float32]:
    # The model's cost does not depend on the audio; quiet noise keeps it realistic anyway.
    return (0.01 * np.random.default_rng(seed).standard_normal((rows, samples))).astype(np.float32)


def _model_cost(run: Callable[[Any, Any], object], size: int, seconds: float) -> float:
    windows = _noise(size, WINDOW_SAMPLES)
    states = initial_states(size)
    run(windows, states)
    calls = 0
    cpu = time.process_time()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        run(windows, states)
        calls += 1
    return (time.process_time() - cpu) * 1000 / (calls * size)


async def _streams_cost(engine: SileroVad, streams: int, seconds: float) -> float:
    chunks = list(_noise(16, CHUNK_SAMPLES, seed=1))
    counts = [0] * streams
    stop = time.monotonic() + seconds

    async def feed(index: int) -> None:
        stream = engine.open_stream()
        while time.monotonic() < stop:
            await stream.probability(chunks[counts[index] % len(chunks)])
            counts[index] += 1

    cpu = time.process_time()
    await asyncio.gather(*(feed(i) for i in range(streams)))
    return (time.process_time() - cpu) * 1000 / max(1, sum(counts))


async def _pushed_cost(engine: BatchedSileroVad, streams: int, seconds: float) -> float:
    """Each stream pushes its next chunk when the last one is answered, as a session would
    if it spoke faster than real time."""
    rate = 24000
    chunks = list((_noise(16, rate * 32 // 1000, seed=1) * 32768).astype(np.int16))
    counts = [0] * streams
    stop = time.monotonic() + seconds
    finished = asyncio.get_running_loop().create_future()
    running = streams
    opened: list[BatchedSileroVadStream] = []

    def answered(index: int) -> None:
        nonlocal running
        counts[index] += 1
        if time.monotonic() < stop:
            opened[index].push(chunks[counts[index] % len(chunks)], 0)
            return
        running -= 1
        if running == 0 and not finished.done():
            finished.set_result(None)

    cpu = time.process_time()
    for index in range(streams):
        opened.append(engine.open_stream(functools.partial(_ignore_result, answered, index)))
    for stream in opened:
        stream.push(chunks[0], 0)
    await finished
    for stream in opened:
        stream.close()
    return (time.process_time() - cpu) * 1000 / max(1, sum(counts))


def _ignore_result(then: Callable[[int], None], index: int, outcomes: Outcomes) -> None:
    then(index)

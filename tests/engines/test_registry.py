"""The engine registry: tables of engines by name, presets, and engines observed by interface."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt

from hark.config import Settings
from hark.engines import EngineMetrics, ObservableEngine
from hark.engines.registry import build_engines
from hark.observability.metrics import Metrics


class BatchingTts:
    """A TTS that reports batches, as an engine sharing a model between sessions would."""

    sample_rate = 24000

    def __init__(self) -> None:
        self.observed_by: list[EngineMetrics] = []

    def observe(self, metrics: EngineMetrics) -> None:
        self.observed_by.append(metrics)
        metrics.batch_observer("tts").batch(size=3, wait_s=0.001, run_s=0.002, backlog=0)

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        yield np.zeros(10, dtype=np.int16)

    async def warmup(self) -> None:
        pass


def test_observe_hands_the_metrics_to_every_engine_that_reports() -> None:
    tts = BatchingTts()
    engines = dataclasses.replace(build_engines(Settings(engines="fake")), tts=tts)
    metrics = Metrics()
    assert isinstance(tts, ObservableEngine)
    assert not isinstance(engines.asr, ObservableEngine)

    engines.observe(metrics)

    assert tts.observed_by == [metrics]
    batches = metrics.registry.get_sample_value("hark_batcher_batch_size_count", {"model": "tts"})
    assert batches == 1

"""The engine registry: tables of engines by name, presets, and engines observed by interface."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from hark.cli import build_parser
from hark.config import Settings, load_settings
from hark.engines import EngineMetrics, ObservableEngine
from hark.engines.asr.openai import OpenAIAsr
from hark.engines.asr.whisper import WhisperAsr
from hark.engines.fake import FakeAsr, FakeLlm, FakeTts
from hark.engines.llm.failover import FailoverLlm
from hark.engines.llm.llama_cpp import LlamaCppLlm
from hark.engines.llm.openai_compatible import OpenAICompatibleLlm
from hark.engines.registry import (
    TTS_ENGINES,
    EngineUnavailableError,
    build_engines,
    engine_names,
)
from hark.engines.tts.hibari import HibariTts
from hark.engines.tts.openai import OpenAITts
from hark.engines.tts.piper import PiperTts
from hark.engines.vad.batcher import BatchedSileroVad
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


def test_the_presets_fill_in_every_kind() -> None:
    embedded = {"vad": "silero", "asr": "whisper", "llm": "llama_cpp", "tts": "hibari"}
    assert engine_names(Settings()) == embedded
    assert engine_names(Settings(engines="fake")) == {
        "vad": "silero",
        "asr": "fake",
        "llm": "fake",
        "tts": "fake",
    }
    engines = build_engines(Settings())
    assert isinstance(engines.vad, BatchedSileroVad)
    assert isinstance(engines.asr, WhisperAsr)
    assert isinstance(engines.llm, LlamaCppLlm)
    assert isinstance(engines.tts, HibariTts)
    fake = build_engines(Settings(engines="fake"))
    assert isinstance(fake.asr, FakeAsr)
    assert isinstance(fake.llm, FakeLlm)
    assert isinstance(fake.tts, FakeTts)


def test_an_engine_named_wins_over_the_preset() -> None:
    engines = build_engines(Settings(engines="fake", tts="piper"))
    assert isinstance(engines.tts, PiperTts)
    assert isinstance(engines.asr, FakeAsr)
    assert isinstance(build_engines(Settings(asr="fake")).asr, FakeAsr)


async def test_a_url_chooses_the_openai_engine_of_its_kind() -> None:
    one = build_engines(load_settings({"llm_url": "http://gpu-a/v1", "llm_model": "q"}, env={}))
    assert isinstance(one.llm, OpenAICompatibleLlm)
    assert one.llm.base_url == "http://gpu-a/v1"
    several = build_engines(
        load_settings({"llm_url": "http://gpu-a/v1,http://gpu-b/v1", "llm_model": "q"}, env={})
    )
    assert isinstance(several.llm, FailoverLlm)
    assert several.llm.backends == ("http://gpu-a/v1", "http://gpu-b/v1")
    # Each backend may stall for its share of the stage limits (30 s and 15 s by default).
    assert several.llm.stall_s == (15.0, 7.5)

    audio = build_engines(
        load_settings(
            {"asr_url": "http://asr/v1", "tts_url": "http://tts/v1/", "tts_model": "kokoro"},
            env={"HARK_ENGINES": "fake"},
        )
    )
    assert isinstance(audio.asr, OpenAIAsr)
    assert (audio.asr.base_url, audio.asr.model) == ("http://asr/v1", "whisper-1")
    assert isinstance(audio.tts, OpenAITts)
    assert (audio.tts.base_url, audio.tts.model) == ("http://tts/v1", "kokoro")
    assert isinstance(audio.llm, FakeLlm)
    for engines in (one, several, audio):
        await engines.aclose()


def test_an_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(EngineUnavailableError, match=r"no tts engine 'espeak'; known: fake, "):
        build_engines(Settings(tts="espeak"))


def test_a_missing_model_file_is_an_unavailable_engine(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailableError, match="hark never downloads models"):
        build_engines(Settings(asr_model=str(tmp_path)))


class SilentTts:
    """An engine added to the table by a test, as a new engine's module would be."""

    sample_rate = 16000

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        yield np.zeros(160, dtype=np.int16)

    async def warmup(self) -> None:
        pass


def test_an_engine_added_to_its_table_is_an_option_everywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(TTS_ENGINES, "silent", lambda settings, voices: SilentTts())
    options = vars(build_parser().parse_args(["serve", "--tts", "silent", "--engines", "fake"]))
    options = {k: v for k, v in options.items() if k not in ("command", "handler")}
    assert isinstance(build_engines(load_settings(options, env={})).tts, SilentTts)
    from_env = load_settings({}, env={"HARK_TTS": "silent"})
    assert isinstance(build_engines(from_env).tts, SilentTts)


async def test_the_vad_batcher_reports_its_batches_once_observed() -> None:
    engines = build_engines(Settings(engines="fake"))
    metrics = Metrics()
    try:
        engines.observe(metrics)
        # Warming up runs a chunk through the batcher: one batch.
        await engines.vad.warmup()
    finally:
        await engines.aclose()
    batches = metrics.registry.get_sample_value("hark_batcher_batch_size_count", {"model": "vad"})
    assert batches is not None and batches >= 1


@pytest.mark.parametrize("kind", ["asr", "llm", "tts"])
def test_a_remote_engine_without_its_url_is_unavailable(kind: str) -> None:
    # Settings made directly skip load_settings' check; the registry still says what is wrong.
    with pytest.raises(EngineUnavailableError, match=f"the openai {kind} engine needs {kind}_url"):
        build_engines(Settings(engines="fake", **{kind: "openai"}))  # type: ignore[arg-type]

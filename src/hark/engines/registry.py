"""The four engines a server shares between its sessions, and how settings choose them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hark.engines import EngineMetrics, ObservableEngine, health
from hark.engines.asr import AsrEngine
from hark.engines.llm import LlmEngine
from hark.engines.stage_timeouts import StageTimeouts
from hark.engines.tts import TtsEngine
from hark.engines.turn import EndOfTurnEngine
from hark.engines.vad import VadEngine

if TYPE_CHECKING:
    from hark.config import EngineSet, Settings

logger = logging.getLogger(__name__)


class EngineUnavailableError(RuntimeError):
    """An engine the settings ask for cannot be built (e.g. an optional package is missing)."""


@dataclass(slots=True)
class Engines:
    """One VAD, ASR, LLM and TTS engine, shared by every session of a server."""

    vad: VadEngine
    asr: AsrEngine
    llm: LlmEngine
    tts: TtsEngine
    # semantic_vad's judge of whether an utterance is complete (SmolLM2 + text cues).
    turn: EndOfTurnEngine
    # How long each stage may wait for its engine before that response (or transcription)
    # fails as stalled.
    timeouts: StageTimeouts = field(default_factory=StageTimeouts)

    async def warmup(self) -> None:
        """Load and run every engine once, all four at the same time.

        They are independent models whose loading happens in threads, so loading them
        together only overlaps waiting. The first failure cancels the others and is raised
        (inside an ``ExceptionGroup``).
        """
        async with asyncio.TaskGroup() as group:
            for name, engine in self._named():
                group.create_task(_timed_warmup(name, engine.warmup()))

    def observe(self, metrics: EngineMetrics) -> None:
        """Hand ``metrics`` to every engine that reports figures of its own, and count the
        restarts of every engine thread in it."""
        health.watch(metrics)
        for _, engine in self._named():
            if isinstance(engine, ObservableEngine):
                engine.observe(metrics)

    async def aclose(self) -> None:
        """Release what the engines hold (connections, threads) for those that hold any."""
        for name, engine in self._named():
            close = getattr(engine, "aclose", None)
            if close is None:
                continue
            try:
                await close()
            except Exception:
                logger.exception("closing the %s engine failed", name)

    def _named(
        self,
    ) -> list[tuple[str, VadEngine | AsrEngine | LlmEngine | TtsEngine | EndOfTurnEngine]]:
        return [
            ("vad", self.vad),
            ("asr", self.asr),
            ("llm", self.llm),
            ("tts", self.tts),
            ("turn", self.turn),
        ]


async def _timed_warmup(name: str, warmup: Awaitable[None]) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await warmup
    logger.info("%s engine ready in %.2f s", name, loop.time() - started)


# The name that, in the tables of the kinds that have one, is the engine using a remote
# OpenAI-style endpoint (``llm_url``, ``asr_url``, ``tts_url``).
REMOTE_ENGINE = "openai"


def _remote_url(url: str | None, kind: str) -> str:
    # load_settings refuses this too; Settings made directly (tests, embedding) skip it.
    if not url:
        raise EngineUnavailableError(f"the {REMOTE_ENGINE} {kind} engine needs {kind}_url")
    return url


def _silero_vad(settings: Settings) -> VadEngine:
    from hark.engines.vad.batcher import BatchedSileroVad

    # Batches the chunks of all the process's sessions into shared model calls.
    return BatchedSileroVad(model_rate=settings.vad_rate)


def _whisper_asr(settings: Settings) -> AsrEngine:
    from hark.engines.asr.whisper import WhisperAsr

    return WhisperAsr(model_path=settings.asr_model, device=settings.asr_device)


def _openai_asr(settings: Settings) -> AsrEngine:
    from hark.engines.asr.openai import DEFAULT_MODEL, OpenAIAsr

    return OpenAIAsr(
        _remote_url(settings.asr_url, "asr"),
        model=settings.asr_model or DEFAULT_MODEL,
        api_key=settings.asr_api_key,
    )


def _fake_asr(settings: Settings) -> AsrEngine:
    from hark.engines.fake import FakeAsr

    return FakeAsr()


def _llama_cpp_llm(settings: Settings) -> LlmEngine:
    from hark.engines.llm.llama_cpp import LlamaCppLlm

    return LlamaCppLlm(model_path=settings.llm_model_path)


def _openai_llm(settings: Settings) -> LlmEngine:
    first = _remote_url(next(iter(settings.llm_url), None), "llm")
    if len(settings.llm_url) > 1:
        from hark.engines.llm.failover import FailoverLlm

        # Each backend's share of the stage limits: all of them can be tried within them.
        shares = len(settings.llm_url)
        return FailoverLlm.for_urls(
            settings.llm_url,
            settings.llm_model_name,
            api_key=settings.llm_api_key,
            context_tokens=settings.llm_context_tokens,
            stall_s=(
                settings.llm_first_token_timeout / shares,
                settings.llm_token_timeout / shares,
            ),
        )
    from hark.engines.llm.openai_compatible import OpenAICompatibleLlm

    return OpenAICompatibleLlm(
        base_url=first,
        model=settings.llm_model_name,
        api_key=settings.llm_api_key,
        context_tokens=settings.llm_context_tokens,
    )


def _fake_llm(settings: Settings) -> LlmEngine:
    from hark.engines.fake import FakeLlm

    return FakeLlm()


def _extra_missing(extra: str, exc: RuntimeError) -> EngineUnavailableError:
    """The error of a TTS engine whose optional package (``hark[extra]``) is missing;
    ``exc`` is the engine's own, saying how to install it with uv."""
    return EngineUnavailableError(
        f"{exc}, or pip install 'hark[{extra}]'; --tts openai or --engines fake run without it"
    )


def _piper_tts(settings: Settings, voices: Sequence[str]) -> TtsEngine:
    from hark.engines.tts.piper import PiperTts

    try:
        return PiperTts(model_path=settings.tts_model, voices=voices)
    except RuntimeError as exc:
        # Piper is GPL-3.0 and therefore an optional extra; its absence is a setup choice.
        raise _extra_missing("piper", exc) from exc


def _hibari_tts(settings: Settings, voices: Sequence[str]) -> TtsEngine:
    from hark.engines.tts.hibari import HibariTts

    try:
        return HibariTts(voice=settings.tts_model, voices=voices)
    except ValueError as exc:
        # A voice hibari does not know (its message lists those it does).
        raise EngineUnavailableError(str(exc)) from exc


def _openai_tts(settings: Settings, voices: Sequence[str]) -> TtsEngine:
    from hark.engines.tts.openai import DEFAULT_MODEL, OpenAITts

    return OpenAITts(
        _remote_url(settings.tts_url, "tts"),
        model=settings.tts_model or DEFAULT_MODEL,
        api_key=settings.tts_api_key,
        voices=voices,
    )


def _mapped_voices(tts: TtsEngine, settings: Settings) -> TtsEngine:
    """``tts`` behind the operator's ``--voice-map``, whose voices it must have."""
    from hark.engines.tts.voice_map import MappedVoices, VoiceMapError

    try:
        return MappedVoices(tts, dict(settings.voice_map))
    except VoiceMapError as exc:
        raise EngineUnavailableError(str(exc)) from exc


def _fake_tts(settings: Settings, voices: Sequence[str]) -> TtsEngine:
    from hark.engines.fake import FakeTts

    return FakeTts()


# One table per kind: an engine's name (``--asr NAME``) and how settings make it. A factory
# imports its engine's module itself, so that only the engines chosen are imported. A TTS
# factory also takes the voice names sessions accept (OpenAI's), which the engine maps onto
# its own voices: an engine knows nothing of the protocol that names them.
VAD_ENGINES: dict[str, Callable[[Settings], VadEngine]] = {"silero": _silero_vad}
ASR_ENGINES: dict[str, Callable[[Settings], AsrEngine]] = {
    "whisper": _whisper_asr,
    REMOTE_ENGINE: _openai_asr,
    "fake": _fake_asr,
}
LLM_ENGINES: dict[str, Callable[[Settings], LlmEngine]] = {
    "llama_cpp": _llama_cpp_llm,
    REMOTE_ENGINE: _openai_llm,
    "fake": _fake_llm,
}
TTS_ENGINES: dict[str, Callable[[Settings, Sequence[str]], TtsEngine]] = {
    "piper": _piper_tts,
    "hibari": _hibari_tts,
    REMOTE_ENGINE: _openai_tts,
    "fake": _fake_tts,
}
ENGINE_TABLES: dict[str, Mapping[str, Callable[..., object]]] = {
    "vad": VAD_ENGINES,
    "asr": ASR_ENGINES,
    "llm": LLM_ENGINES,
    "tts": TTS_ENGINES,
}
# What ``--engines`` fills in for each kind not named. The VAD is real in every preset: it is
# cheap, and turn detection is only meaningful with it.
PRESETS: dict[EngineSet, dict[str, str]] = {
    "embedded": {"vad": "silero", "asr": "whisper", "llm": "llama_cpp", "tts": "hibari"},
    "fake": {"vad": "silero", "asr": "fake", "llm": "fake", "tts": "fake"},
}


def engine_names(settings: Settings) -> dict[str, str]:
    """The engine of each kind that ``settings`` choose: the one named, else ``openai`` for a
    kind whose URL is given, else the preset's.

    Raises ``EngineUnavailableError`` for a name no table knows, listing the known ones.
    """
    names: dict[str, str] = {}
    for kind, table in ENGINE_TABLES.items():
        name = getattr(settings, kind)
        if name is None:
            url = getattr(settings, f"{kind}_url", None)
            name = REMOTE_ENGINE if url else PRESETS[settings.engines][kind]
        if name not in table:
            raise EngineUnavailableError(
                f"no {kind} engine {name!r}; known: {', '.join(sorted(table))}"
            )
        names[kind] = name
    return names


def build_engines(settings: Settings, *, voices: Sequence[str] = ()) -> Engines:
    """The engines ``settings`` choose (``engine_names``); nothing is loaded until ``warmup``.
    ``voices``: the voice names sessions accept, which the TTS engine maps onto its own
    (``hark serve`` passes OpenAI's; without them a name the engine lacks gets its default).

    The presets: ``embedded``, Silero VAD, Whisper, llama.cpp and hibari (with ``llm_url``, an
    OpenAI-compatible LLM; several URLs fail over between them); ``fake``, the real Silero VAD
    with fake ASR, LLM and TTS, for protocol tests and overhead benchmarks.
    Raises ``EngineUnavailableError`` when an engine is unknown, or an optional package or a
    model file is missing.
    """
    from hark.engines.turn.llama_cpp import LlamaCppEndOfTurn

    names = engine_names(settings)
    try:
        tts = TTS_ENGINES[names["tts"]](settings, voices)
        if settings.voice_map:
            tts = _mapped_voices(tts, settings)
        return Engines(
            vad=VAD_ENGINES[names["vad"]](settings),
            asr=ASR_ENGINES[names["asr"]](settings),
            llm=LLM_ENGINES[names["llm"]](settings),
            tts=tts,
            # Real with every engine set, like the VAD: turn-taking is what fakes test.
            turn=LlamaCppEndOfTurn(),
            timeouts=StageTimeouts(
                llm_first_token=settings.llm_first_token_timeout,
                llm_token_gap=settings.llm_token_timeout,
                tts_clause=settings.tts_clause_timeout,
                asr_request=settings.asr_timeout,
            ),
        )
    except FileNotFoundError as exc:
        raise EngineUnavailableError(str(exc)) from exc

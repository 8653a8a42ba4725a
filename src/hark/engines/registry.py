"""The four engines a server shares between its sessions, and how settings choose them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hark.engines import EngineMetrics, ObservableEngine
from hark.engines.asr import AsrEngine
from hark.engines.llm import LlmEngine
from hark.engines.tts import TtsEngine
from hark.engines.turn import EndOfTurnEngine
from hark.engines.vad import VadEngine

if TYPE_CHECKING:
    from hark.config import Settings

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
        """Hand ``metrics`` to every engine that reports figures of its own."""
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


def build_engines(settings: Settings) -> Engines:
    """The engines ``settings.engines`` names; nothing is loaded until ``warmup``.

    ``embedded``: Silero VAD, Whisper, llama.cpp (or an OpenAI-compatible endpoint when
    ``llm_url`` is set; several fail over between them) and Piper. ``fake``: the real Silero
    VAD with fake ASR, LLM and TTS, for protocol tests and overhead benchmarks. Either way the
    VAD batches the chunks of all the process's sessions into shared model calls
    (``BatchedSileroVad``).
    Raises ``EngineUnavailableError`` when an optional package or a model file is missing.
    """
    from hark.engines.turn.llama_cpp import LlamaCppEndOfTurn
    from hark.engines.vad.batcher import BatchedSileroVad

    # Real in every engine set, like the VAD: turn-taking is what the fakes are there to test.
    turn = LlamaCppEndOfTurn()
    if settings.engines == "fake":
        from hark.engines.fake import FakeAsr, FakeLlm, FakeTts

        return Engines(
            vad=BatchedSileroVad(model_rate=settings.vad_rate),
            asr=FakeAsr(),
            llm=FakeLlm(),
            tts=FakeTts(),
            turn=turn,
        )

    from hark.engines.tts.piper import PiperTts

    try:
        tts = PiperTts()
    except RuntimeError as exc:
        # Piper is GPL-3.0 and therefore an optional extra; its absence is a setup choice.
        raise EngineUnavailableError(
            f"{exc}, or pip install 'hark[piper]'; --engines fake runs without it"
        ) from exc

    from hark.engines.asr.whisper import WhisperAsr

    try:
        asr = WhisperAsr(model_path=settings.asr_model, device=settings.asr_device)
        llm: LlmEngine
        if len(settings.llm_url) > 1:
            from hark.engines.llm.failover import FailoverLlm

            llm = FailoverLlm.for_urls(
                settings.llm_url, settings.llm_model_name, api_key=settings.llm_api_key
            )
        elif settings.llm_url:
            from hark.engines.llm.openai_compatible import OpenAICompatibleLlm

            llm = OpenAICompatibleLlm(
                base_url=settings.llm_url[0],
                model=settings.llm_model_name,
                api_key=settings.llm_api_key,
            )
        else:
            from hark.engines.llm.llama_cpp import LlamaCppLlm

            llm = LlamaCppLlm(model_path=settings.llm_model_path)
    except FileNotFoundError as exc:
        raise EngineUnavailableError(str(exc)) from exc

    vad = BatchedSileroVad(model_rate=settings.vad_rate)
    return Engines(vad=vad, asr=asr, llm=llm, tts=tts, turn=turn)

"""Fake engines: instant, deterministic stand-ins for protocol tests and overhead benchmarks.

They do no real recognition, reasoning or synthesis and are never hark's default. The VAD
has no fake: it is cheap, and turn detection is only meaningful with the real one.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from hark.engines.asr import (
    AudioToTranscribe,
    RecognitionRequest,
    TimedSegment,
    TimedTranscript,
    TimedWord,
    TranscriptText,
)
from hark.engines.llm import (
    Finished,
    FunctionTool,
    GenerationRequest,
    LlmEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
)


class FakeAsr:
    """Hears the same ``transcript`` in any audio, silence and empty buffers included.

    Timed, the transcript's words share the audio evenly, one segment per sentence; the
    language is the one asked for, else ``en`` (where detection is held to languages without
    ``en``, the first of them). Recognised, every window holds the whole transcript so timed,
    each word certain (probability 1).
    """

    sample_rate = 16000

    def __init__(self, transcript: str = "What is the capital of France?") -> None:
        self.transcript = transcript

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        """Yield the fixed transcript as one delta, whatever the audio."""
        yield self.transcript

    async def transcribe_timed(self, request: AudioToTranscribe) -> TimedTranscript:
        """What ``transcribe`` hears, with made-up but consistent times."""
        # Through transcribe, so that a subclass's hearing is timed too.
        text = "".join([delta async for delta in self.transcribe(request)])
        duration = request.audio.size / self.sample_rate
        heard = text.split()
        step = duration / len(heard) if heard else 0.0
        timed = [
            TimedWord(word=word, start=index * step, end=(index + 1) * step)
            for index, word in enumerate(heard)
        ]
        segments: list[TimedSegment] = []
        first = 0
        for index, word in enumerate(heard):
            if index == len(heard) - 1 or word.endswith((".", "?", "!")):
                segments.append(
                    TimedSegment(
                        start=timed[first].start,
                        end=timed[index].end,
                        text=" ".join(heard[first : index + 1]),
                    )
                )
                first = index + 1
        return TimedTranscript(
            segments=tuple(segments),
            language=request.language.split("-")[0].lower() if request.language else "en",
            duration=duration,
            words=tuple(timed) if request.words else (),
        )

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        """What ``transcribe_timed`` hears in the window, with word times, each word certain."""
        language = request.language or _detected(request.languages)
        timed = await self.transcribe_timed(
            AudioToTranscribe(request.audio, language, request.prompt, words=True)
        )
        return replace(timed, words=tuple(replace(w, probability=1.0) for w in timed.words))

    async def recognise_stages(
        self, request: RecognitionRequest
    ) -> AsyncGenerator[TranscriptText | TimedTranscript, None]:
        """``recognise``'s transcript alone: the fake knows its words' times at once."""
        yield await self.recognise(request)

    async def detect_language(
        self, audio: npt.NDArray[np.float32], *, languages: Sequence[str] = ()
    ) -> str | None:
        """``en``, or the first of ``languages`` when they leave it out."""
        return _detected(languages)

    async def warmup(self) -> None:
        """Nothing to load."""


def _detected(languages: Sequence[str]) -> str:
    codes = [code.split("-")[0].lower() for code in languages]
    return "en" if not codes or "en" in codes else codes[0]


class FakeLlm:
    """Streams a fixed ``reply`` word by word, or calls a tool when the request forces one.

    One word is one token: ``max_tokens`` cuts the reply after that many words (finish
    reason ``length``) and token counts are word counts. With ``tool_choice`` ``required``
    (the first tool) or ``function`` (the named one) it calls that tool instead, with
    arguments made from its JSON schema: every required property gets a placeholder of its
    type (an enum its first value). ``max_tokens`` does not cut tool-call arguments.
    """

    def __init__(self, reply: str = "The capital of France is Paris.") -> None:
        self.reply = reply

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        """Stream the reply or the forced tool call; the last event is ``Finished``."""
        prompt_tokens = sum(_count_words(message.content) for message in request.messages)
        tool = _forced_tool(request)
        if tool is not None:
            call_id = f"call_{uuid.uuid4().hex[:16]}"
            # Function parameters are always an object, even when the schema leaves it out.
            arguments = json.dumps(_placeholder({"type": "object", **tool.parameters}))
            yield ToolCallStarted(call_id=call_id, name=tool.name)
            pieces = re.split(r"(?<= )", arguments)
            for piece in pieces:
                await asyncio.sleep(0)
                yield ToolCallArgumentsDelta(call_id=call_id, delta=piece)
            yield ToolCallFinished(call_id=call_id, arguments=arguments)
            yield Finished("tool_calls", prompt_tokens=prompt_tokens, completion_tokens=len(pieces))
            return
        words = self.reply.split()
        limit = len(words) if request.max_tokens is None else min(request.max_tokens, len(words))
        for index, word in enumerate(words[:limit]):
            await asyncio.sleep(0)
            yield TextDelta(word if index == 0 else f" {word}")
        reason: Literal["stop", "length"] = "length" if limit < len(words) else "stop"
        yield Finished(reason, prompt_tokens=prompt_tokens, completion_tokens=limit)

    async def prefill(self, request: GenerationRequest) -> None:
        """The scripted reply needs no prompt."""

    async def warmup(self) -> None:
        """Nothing to load."""


class FakeTts:
    """Speaks any text as a 440 Hz tone lasting as long as saying it would (0.4 s a word).

    The tone comes in 100 ms chunks at ``sample_rate``; ``speed`` shortens or lengthens it
    in proportion; empty text gives no audio.
    """

    seconds_per_word = 0.4
    chunk_seconds = 0.1
    frequency = 440.0
    amplitude = 0.2

    def __init__(self, sample_rate: int = 24000) -> None:
        self.sample_rate = sample_rate
        # One second of the tone holds a whole number of cycles, so it repeats seamlessly:
        # chunks are cut from it instead of computing sines for every reply (the fake TTS
        # should cost nothing in overhead benchmarks).
        t = np.arange(sample_rate) / sample_rate
        wave = self.amplitude * 32767 * np.sin(2 * np.pi * self.frequency * t)
        # A second more than a chunk, so that every chunk is one slice of it.
        self._wave = np.tile(wave.astype(np.int16), 2 + int(self.chunk_seconds))

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        """Yield the tone for ``text`` in 100 ms int16 chunks (the last one may be shorter)."""
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        total = round(_count_words(text) * self.seconds_per_word / speed * self.sample_rate)
        step = round(self.chunk_seconds * self.sample_rate)
        for start in range(0, total, step):
            # Cutting at the absolute sample keeps the phase continuous across chunks.
            offset = start % self.sample_rate
            await asyncio.sleep(0)
            yield self._wave[offset : offset + min(step, total - start)].copy()

    async def warmup(self) -> None:
        """Nothing to load."""


def _count_words(text: str) -> int:
    return len(text.split())


def _forced_tool(request: GenerationRequest) -> FunctionTool | None:
    choice = request.tool_choice
    if choice.mode not in ("required", "function"):
        return None
    if not request.tools:
        raise ValueError(f"tool_choice {choice.mode!r} needs at least one tool")
    if choice.mode == "required":
        return request.tools[0]
    for tool in request.tools:
        if tool.name == choice.name:
            return tool
    raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")


_PLACEHOLDERS: dict[str, Any] = {
    "string": "example",
    "integer": 0,
    "number": 0.0,
    "boolean": False,
    "array": [],
    "null": None,
}


def _placeholder(schema: dict[str, Any]) -> Any:
    """A value that satisfies the type and enum constraints of a JSON schema, minimally."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: _placeholder(properties.get(name, {})) for name in schema.get("required", [])}
    return _PLACEHOLDERS.get(kind, "example")

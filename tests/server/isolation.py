"""Engines for isolation tests: what a session gets back depends on what it sent, so a
session that received another's results can tell."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable
from typing import Any

import numpy as np

from hark.engines.asr import AudioToTranscribe
from hark.engines.fake import FakeAsr, FakeLlm
from hark.engines.llm import Finished, GenerationRequest, LlmEvent, TextDelta

# The ids a session's events carry (IdGenerator's: a prefix and 22 base-62 digits).
_ID = re.compile(r"\b(?:sess|item|resp|event|call)_[A-Za-z0-9]{20,}")


class PitchAsr(FakeAsr):
    """Hears a tone's pitch: ``"<hertz> hertz"``, to the nearest 10 Hz."""

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        """The dominant frequency of the audio in words."""
        await asyncio.sleep(0)
        spectrum = np.abs(np.fft.rfft(request.audio))
        hertz = 10 * round(float(np.argmax(spectrum)) * self.sample_rate / request.audio.size / 10)
        yield f"{hertz} hertz"


class EchoLlm(FakeLlm):
    """Says the last user message back, word by word."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        """Echo the last user message."""
        last = next(m.content for m in reversed(request.messages) if m.role == "user")
        words = last.split()
        for index, word in enumerate(words):
            await asyncio.sleep(0)
            yield TextDelta(word if index == 0 else f" {word}")
        yield Finished("stop", prompt_tokens=len(words), completion_tokens=len(words))


def ids_in(texts: Iterable[str]) -> set[str]:
    """Every session, item, response, event and call id in ``texts``."""
    return {found for text in texts for found in _ID.findall(text)}


def own_ids(events: Iterable[dict[str, Any]]) -> set[str]:
    """The session, item and response ids a session's events name as their subject."""
    found: set[str] = set()
    for event in events:
        for key in ("item_id", "response_id", "previous_item_id"):
            if event.get(key):
                found.add(event[key])
        for key in ("session", "item", "response"):
            if isinstance(event.get(key), dict) and event[key].get("id"):
                found.add(event[key]["id"])
    return found

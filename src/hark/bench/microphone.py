"""A real-time microphone for the WebSocket benches: 20 ms chunks of 24 kHz PCM on an
absolute schedule, silence between utterances, and when each chunk of an utterance left.

Chunks follow an absolute schedule, so the stream never drifts from real time; a chunk
that is late (a busy machine) goes out at once, as a real microphone's buffer would.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable

import numpy as np
import numpy.typing as npt

from hark.bench.spoken_questions import RATE

CHUNK_S = 0.02
CHUNK = round(RATE * CHUNK_S)


class Utterance:
    """Audio being said: when each of its chunks was sent (``perf_counter`` seconds), and
    ``finished`` (the time its last chunk was sent) once it has all gone."""

    def __init__(self, pcm: npt.NDArray[np.int16]) -> None:
        self.pcm = pcm
        self.sent: list[float] = []
        self.finished: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def sent_at(self, sample: int) -> float | None:
        """When the chunk holding ``sample`` was sent (a sample past the end: the last
        chunk), or None while it has not been."""
        index = min(sample, len(self.pcm) - 1) // CHUNK
        return self.sent[index] if index < len(self.sent) else None

    def at(self, sample: int) -> float:
        """``sent_at`` of an utterance that has been said: always a time."""
        sent = self.sent_at(sample)
        if sent is None:
            raise RuntimeError(f"sample {sample} has not been said yet")
        return sent


class Microphone:
    """Streams chunks through ``append`` (the SDK connection's
    ``input_audio_buffer.append``, which takes ``audio=``): silence, or what it is told to
    say."""

    def __init__(self, append: Callable[..., Awaitable[None]]) -> None:
        self._append = append
        self._utterance: Utterance | None = None
        self._position = 0
        self._silence = bytes(2 * CHUNK)

    def say(self, pcm: npt.NDArray[np.int16]) -> Utterance:
        """Start saying ``pcm`` (24 kHz) at the next chunk."""
        if self._utterance is not None:
            raise RuntimeError("already saying something")
        self._utterance = Utterance(pcm)
        self._position = 0
        return self._utterance

    async def run(self) -> None:
        """Stream until cancelled."""
        start = time.perf_counter()
        chunks = 0
        while True:
            utterance = self._utterance
            if utterance is None:
                chunk = self._silence
            else:
                pcm = utterance.pcm[self._position : self._position + CHUNK]
                chunk = pcm.astype("<i2").tobytes().ljust(2 * CHUNK, b"\0")
            await self._append(audio=base64.b64encode(chunk).decode("ascii"))
            if utterance is not None:
                now = time.perf_counter()
                utterance.sent.append(now)
                self._position += CHUNK
                if self._position >= len(utterance.pcm):
                    self._utterance = None
                    utterance.finished.set_result(now)
            chunks += 1
            delay = start + chunks * CHUNK_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)

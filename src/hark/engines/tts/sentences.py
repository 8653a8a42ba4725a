"""What the local synthesisers share: a model loaded once, and one sentence per model call.

Piper and hibari render a sentence in one call that holds a core for tens to hundreds of
milliseconds. Every session's sentences go through one ``DueFirstScheduler``, so that a
reply's first words (someone waits for them in silence) overtake sentences that will only
play seconds from now, and a stream closed mid-reply renders nothing more.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from hark.engines.scheduler import DueFirstScheduler

_M = TypeVar("_M")

# Renders the next sentence of a reply, or says (None) that there is none left. Its argument
# says whether the listener already waits for that sentence (its due time has passed): an
# engine may then spend more cores on it.
SentenceReader = Callable[[bool], npt.NDArray[np.int16] | None]


class SentenceTts(ABC, Generic[_M]):
    """A ``TtsEngine`` that renders sentences with a model of type ``_M`` on worker threads.

    ``name`` names the threads and the engine's health (``hark-<name>``); ``threads`` caps
    the model's own threads per call; ``workers`` render sentences at once (by default half
    the cores). The model loads on ``warmup`` or on first use.
    """

    sample_rate: int

    def __init__(self, name: str, threads: int, workers: int | None) -> None:
        self._threads = threads
        self._model: _M | None = None
        self._load_lock = threading.Lock()
        self._queue = DueFirstScheduler(workers, name=f"hark-{name}")

    @abstractmethod
    def _load_model(self) -> _M:
        """Load the model (on a worker thread, once)."""

    @abstractmethod
    def _reader(self, model: _M, text: str, voice: str | None, speed: float) -> SentenceReader:
        """What renders ``text``'s sentences one call at a time, on the worker threads."""

    def _load(self) -> _M:
        # Several sessions may ask at once; the model loads only once.
        with self._load_lock:
            if self._model is None:
                self._model = self._load_model()
            return self._model

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        """Speak ``text``; yields one int16 chunk per sentence at ``sample_rate``.

        ``speed`` above 1 speaks faster. ``slack_s``: how long the listener has audio for
        before this (see :class:`hark.engines.tts.TtsEngine`); each later sentence is due
        when the ones before it will have played. Cancelling stops before the next sentence
        (the one being rendered completes unseen).
        """
        if not text.strip():
            return
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        model = self._model if self._model is not None else await asyncio.to_thread(self._load)
        read = self._reader(model, text, voice, speed)
        due = time.monotonic() + max(0.0, slack_s)
        while (
            audio := await self._queue.run(due, functools.partial(_late, read, due))
        ) is not None:
            due += audio.size / self.sample_rate
            if audio.size:
                yield audio

    async def warmup(self) -> None:
        """Load the voice and speak once, so that the first real request is fast."""
        async for _ in self.synthesize("Hello."):
            pass


def _late(read: SentenceReader, due: float) -> npt.NDArray[np.int16] | None:
    """``read`` the next sentence, saying whether its listener already waits for it."""
    return read(time.monotonic() >= due)

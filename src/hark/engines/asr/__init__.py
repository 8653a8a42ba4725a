"""Speech recognition: 16 kHz audio in, text out, streamed segment by segment, or timed.

``transcribe`` is what a session uses: text deltas as soon as they are known.
``transcribe_timed`` is what OpenAI's transcription API needs: the whole transcript at once,
cut into segments with their times in the audio, optionally each word's times, and the
language heard.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class TimedWord:
    """A word and where it was said, in seconds from the start of the audio."""

    word: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class TimedSegment:
    """A stretch of the transcript and where it was said, in seconds from the start.

    ``text`` is stripped. The decoder's details are ``None`` where the engine does not know
    them: ``seek`` (the decoding window's start in 10 ms frames), ``tokens``,
    ``avg_logprob``, ``compression_ratio``, ``no_speech_prob`` and ``temperature``.
    """

    start: float
    end: float
    text: str
    seek: int | None = None
    tokens: tuple[int, ...] | None = None
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None
    temperature: float | None = None


@dataclass(frozen=True, slots=True)
class TimedTranscript:
    """A whole transcript with its times.

    ``segments`` in order (none for silence); ``words`` in order, filled only when asked
    for; ``language`` as the engine names it (an ISO-639-1 code for hark's own engines),
    ``None`` when nothing determined it; ``duration``: seconds of audio heard.
    """

    segments: tuple[TimedSegment, ...]
    language: str | None
    duration: float
    words: tuple[TimedWord, ...] = ()

    @property
    def text(self) -> str:
        """The segments' texts joined by spaces."""
        return " ".join(segment.text for segment in self.segments if segment.text)


class AsrEngine(Protocol):
    """A speech recogniser."""

    sample_rate: int

    def transcribe(
        self,
        audio: npt.NDArray[np.float32],
        *,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsyncIterator[str]:
        """Transcribe mono float32 audio at ``sample_rate``; yields text deltas in order.

        The concatenation of the deltas is the whole transcript (deltas carry their own
        leading spaces). Cancelling the iteration stops the work.
        """
        ...

    async def transcribe_timed(
        self,
        audio: npt.NDArray[np.float32],
        *,
        language: str | None = None,
        prompt: str | None = None,
        words: bool = False,
    ) -> TimedTranscript:
        """Transcribe mono float32 audio at ``sample_rate`` with segment times, and word
        times when ``words`` is true.

        Times are seconds from the start of ``audio``, within ``[0, duration]``, segments
        and words in order. ``language`` and ``prompt`` mean what they mean for
        ``transcribe``; a ``ValueError`` refuses audio or a language the engine cannot take.
        Cancelling stops the work.
        """
        ...

    async def warmup(self) -> None:
        """Load the model and run it once."""
        ...

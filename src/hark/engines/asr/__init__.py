"""Speech recognition: 16 kHz audio in, text out, streamed segment by segment, or timed.

``transcribe`` gives text deltas as soon as they are known (an item's audio, recognised
whole). ``transcribe_timed`` is what OpenAI's transcription API needs: the whole transcript
at once, cut into segments with their times in the audio, optionally each word's times,
and the language heard. Both take an ``AudioToTranscribe``. ``recognise`` is one step of
incremental recognition (a ``RecognitionRequest``): a window of a turn still being spoken,
decoded with every word's times and probability, run by the engine's scheduler in the
order of its ``Urgency``. ``recognise_stages`` is the same step for a caller who can act on
the words before their times (``TranscriptText``) and wants them as soon as they are known.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class TimedWord:
    """A word and where it was said, in seconds from the start of the audio.

    ``word`` carries its own leading space as the decoder produced it; ``probability`` is
    the decoder's confidence in the word (the product of its tokens' probabilities), or
    ``None`` where the engine does not know it.
    """

    word: str
    start: float
    end: float
    probability: float | None = None


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


@dataclass(frozen=True, slots=True)
class TranscriptText:
    """A recognition's words before their times (``AsrEngine.recognise_stages``).

    ``words``: the words of the timed transcript that follows, in order, each as its
    ``TimedWord.word`` will be (leading space included); ``language`` as in
    ``TimedTranscript``.
    """

    words: tuple[str, ...]
    language: str | None

    @property
    def text(self) -> str:
        """The words joined by single spaces."""
        return " ".join(word.strip() for word in self.words if word.strip())


class Urgency(IntEnum):
    """Which recognition work an engine's scheduler runs first (lowest first)."""

    # Somebody waits for these words: a turn has ended, an item or a file is transcribed.
    ANSWER = 0
    # A pause whose words decide whether the turn ends (semantic_vad judges them): the
    # answer waits for the decision, so it goes before anybody's captions.
    DECISION = 1
    # Live captions of a turn still being spoken.
    CAPTION = 2
    # A pause that may or may not end the turn: useful only if it does.
    SPECULATION = 3
    # The times of words already delivered (a deciding pause's words go to the end-of-turn
    # model before their times are aligned): nobody waits for them while the verdict and the
    # reply's prompt compute, so they wait while another model computes what someone waits
    # for (``hark.engines.asr.scheduler.DEFER_LIMIT_S`` at most).
    TIMES = 4


@dataclass(frozen=True, slots=True)
class AudioToTranscribe:
    """Audio to transcribe whole: an item's, or a file's.

    ``audio``: mono float32 at the engine's ``sample_rate``, of any length. ``language``: an
    ISO-639-1 code (a region, ``en-US``, is dropped), or ``None`` to let the engine tell.
    ``prompt``: text said before this audio, or words the client expects, which the decoder
    continues from. ``words``: ``transcribe_timed`` times each word too (``transcribe``
    gives text alone).
    """

    audio: npt.NDArray[np.float32]
    language: str | None = None
    prompt: str | None = None
    words: bool = False


@dataclass(frozen=True, slots=True)
class RecognitionRequest:
    """One window of audio to decode with word times.

    ``audio``: mono float32 at the engine's ``sample_rate``, at most 30 s. ``prompt``: the
    text said before this audio (words already committed, after any prompt of the
    client's), which the decoder continues from. ``language``: an ISO-639-1 code, or
    ``None`` to let the engine tell; ``languages``: with ``language`` ``None``, the codes the
    engine may tell (the most probable of them is heard), any when empty.
    """

    audio: npt.NDArray[np.float32]
    prompt: str | None = None
    language: str | None = None
    urgency: Urgency = Urgency.ANSWER
    languages: tuple[str, ...] = ()


class AsrEngine(Protocol):
    """A speech recogniser."""

    sample_rate: int

    def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        """Transcribe ``request.audio``; yields text deltas in order.

        The concatenation of the deltas is the whole transcript (deltas carry their own
        leading spaces). A ``ValueError`` refuses audio or a language the engine cannot
        take. Cancelling the iteration stops the work.
        """
        ...

    async def transcribe_timed(self, request: AudioToTranscribe) -> TimedTranscript:
        """Transcribe ``request.audio`` with segment times, and word times when
        ``request.words`` is true.

        Times are seconds from the start of the audio, within ``[0, duration]``, segments
        and words in order. A ``ValueError`` refuses audio or a language the engine cannot
        take. Cancelling stops the work.
        """
        ...

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        """Decode ``request.audio`` with segment and word times (``words`` always filled,
        each with its ``probability`` where the engine knows it).

        Runs when the engine's scheduler reaches it by ``request.urgency``; cancelling the
        awaiting task drops the request if it still waits and abandons it if it runs. A
        ``ValueError`` refuses audio or a language the engine cannot take.
        """
        ...

    def recognise_stages(
        self, request: RecognitionRequest
    ) -> AsyncGenerator[TranscriptText | TimedTranscript, None]:
        """``recognise``'s result, with its words first where the engine knows them sooner
        than their times: a ``TranscriptText`` of the same decode (never a second one), then
        the ``TimedTranscript`` ``recognise`` would give, always last and always given. An
        engine that times its words as it decodes them gives the timed transcript alone.
        Cancelling or closing the iteration drops what the engine kept for the times.
        """
        ...

    async def detect_language(
        self, audio: npt.NDArray[np.float32], *, languages: Sequence[str] = ()
    ) -> str | None:
        """The language spoken in mono float32 audio at ``sample_rate`` (its first 30 s):
        the most probable of ``languages`` (ISO-639-1 codes; any the engine knows when
        empty), as an ISO-639-1 code. ``None`` when the engine cannot tell before it
        transcribes (then ``transcribe`` with no language detects it as it can), or hears no
        speech. A ``ValueError`` refuses audio or a language the engine cannot take.
        """
        ...

    async def warmup(self) -> None:
        """Load the model and run it once."""
        ...

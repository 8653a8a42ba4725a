"""LocalAgreement: when the words of a turn still being spoken may be shown.

A turn is recognised in steps, each a window of its audio from a start point to the turn's
current end. Whisper's last words in a window are often wrong (a word cut in half, a guess
the next second of audio overturns), so a word is committed only once ``agreement``
successive hypotheses agree on it and on every word before it, and a committed word is never
taken back. Words are compared normalised (case and punctuation aside) and committed with the
newest hypothesis' spelling. When the window grows past a few seconds, its start moves up to
the end of committed words (keeping a second of them to hear again), so a step decodes a
short stretch of audio however long the turn; the committed words before the window are
the prompt. At the turn's end a final step commits its whole hypothesis.

Sans-I/O: hypotheses in, committed words out, times in seconds from the turn's start.
Macháček, Dabre and Bojar, "Turning Whisper into Real-Time Transcription System" (2023)
describe the policy.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hark.engines.asr import TimedTranscript, TimedWord

DelayName = Literal["minimal", "low", "medium", "high", "xhigh"]


@dataclass(frozen=True, slots=True)
class Delay:
    """How often the turn is recognised (seconds of new audio between steps) and how many
    successive hypotheses must agree on a word before it is committed."""

    step_s: float
    agreement: int


# The transcription ``delay`` a client asks for: a shorter step shows words sooner and costs
# more decoding; more agreeing hypotheses revise less and show words later.
DELAYS: dict[DelayName, Delay] = {
    "minimal": Delay(0.4, 2),
    "low": Delay(0.6, 2),
    "medium": Delay(1.0, 2),
    "high": Delay(1.5, 3),
    "xhigh": Delay(2.0, 3),
}
DEFAULT_DELAY: DelayName = "low"

# Past this length the window's start moves up to a committed word's end, keeping
# ``OVERLAP_S`` of committed speech in the window. A step's cost grows with its window
# (Whisper tiny.en: about 0.08 s and 0.013 s a window-second), so a window bounded this tight
# makes a long turn cost per second of speech what a short one does; the committed text
# before the window is the prompt, which keeps Whisper on course across the cut.
TRIM_AFTER_S = 4.0
# The committed words the window keeps: heard again, they tie the new hypothesis to the
# committed text (``tail``), and a word cut at the window's start is one already committed.
OVERLAP_S = 1.0
# Past this, with nothing committed (hypotheses that never settle, or too few of them: a busy
# host whose steps fall behind real time), the words that end well before the window's end
# are committed as they stand. It bounds the audio any step decodes, the last of a turn
# included, so a 40 s turn's end costs what a short one's does on a host that cannot keep
# up (at 26 s, Whisper's own limit less a margin, such a turn's end decoded 25 s and more).
HARD_LIMIT_S = 8.0
_HARD_MARGIN_S = 2.0
# A word of a new hypothesis that starts this close before the end of the committed words
# is taken as new (word times are approximate); one that starts earlier was committed.
_TIME_TOLERANCE_S = 0.1
# A word that starts this long before the words before it ends were said is a repeat.
_BACKWARDS_S = 0.5
# At the seam, a hypothesis may repeat up to this many committed words: they are dropped.
_MAX_REPEAT = 5
# The prompt carries at most this many characters of committed text (Whisper reads at most
# 224 tokens of prompt, and a longer prompt costs every step).
PROMPT_CHARS = 200


def normalise(word: str) -> str:
    """A word as the policy compares it: lower case, letters and digits only."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", word).casefold() if ch.isalnum())


def text_of(words: Sequence[TimedWord]) -> str:
    """Words joined by single spaces."""
    return " ".join(w.word.strip() for w in words if w.word.strip())


class LocalAgreement:
    """The commit policy of one turn."""

    def __init__(self, agreement: int = 2) -> None:
        """``agreement``: how many successive hypotheses must agree (at least 2)."""
        if agreement < 2:
            raise ValueError("agreement needs at least two hypotheses")
        self._agreement = agreement
        self.committed: list[TimedWord] = []
        # Where the next window starts, seconds from the turn's start.
        self.window_start = 0.0
        # The uncommitted words of the last ``agreement - 1`` hypotheses, newest last.
        self._tails: list[list[TimedWord]] = []

    @property
    def committed_end(self) -> float:
        """Where the last committed word ends (the turn's start when none is)."""
        return self.committed[-1].end if self.committed else 0.0

    def prompt(self) -> str:
        """The committed words before the window: the context the next step continues."""
        before = [w for w in self.committed if w.end <= self.window_start + _TIME_TOLERANCE_S]
        text = text_of(before)
        if len(text) <= PROMPT_CHARS:
            return text
        cut = text.find(" ", len(text) - PROMPT_CHARS)
        return text[cut + 1 :] if cut >= 0 else text[-PROMPT_CHARS:]

    def tail(self, transcript: TimedTranscript, window_start: float) -> list[TimedWord]:
        """The words of ``transcript`` (a window starting at ``window_start``) after the
        committed ones, on the turn's clock; nothing changes."""
        words = [
            TimedWord(w.word, w.start + window_start, w.end + window_start, w.probability)
            for w in transcript.words
            if w.word.strip()
        ]
        new = self._after_committed([w.word for w in words], window_start)
        if new is not None:
            return self._in_order(words[new:], words[new - 1].end)
        limit = self.committed_end - _TIME_TOLERANCE_S
        new_words = [w for w in words if w.start > limit] if self.committed else words
        if new_words and self.committed and new_words[0].start - self.committed_end < 1.0:
            new_words = new_words[self._seam_repeat([w.word for w in new_words]) :]
        return self._in_order(new_words, self.committed_end)

    def tail_words(self, words: Sequence[str], window_start: float) -> list[str]:
        """``tail`` of a window's words before their times (``TranscriptText.words``): the
        same words where the committed ones are heard again as ``tail`` finds them; where
        ``tail`` needs the times (the committed words not heard again, a decoder that
        loops), the words after any committed ones repeated at the window's start, which the
        timed words may yet correct."""
        heard = [word for word in words if word.strip()]
        new = self._after_committed(heard, window_start)
        if new is not None:
            return heard[new:]
        return heard[self._seam_repeat(heard) :] if self.committed else heard

    def _after_committed(self, words: Sequence[str], window_start: float) -> int | None:
        """Where the new words of a window's ``words`` begin, when the committed words it
        holds are heard again; ``None`` when they are not."""
        inside = [w for w in self.committed if w.end > window_start + _TIME_TOLERANCE_S]
        keys = [normalise(w.word) for w in inside]
        heard = [normalise(word) for word in words]
        if inside and heard[: len(inside)] == keys:
            # The window heard the committed words it holds again, as they were: what follows
            # is new, whatever its times (the decoder times a word at a window's end poorly,
            # and a committed word may have taken the start of the next).
            return len(inside)
        # The window's first words may be cut at its start or heard otherwise: the last
        # committed words (two or more), heard again where they should be, still mark where
        # the new words begin.
        for count in range(min(_MAX_REPEAT, len(keys)), 1, -1):
            for at in range(len(keys) - count + 2):
                if heard[at : at + count] == keys[-count:]:
                    return at + count
        return None

    def _seam_repeat(self, words: Sequence[str]) -> int:
        """How many of the last committed words ``words`` begin with: the decoder may hear
        them again at the window's seam."""
        committed = [normalise(w.word) for w in self.committed[-_MAX_REPEAT:]]
        for count in range(min(_MAX_REPEAT, len(committed), len(words)), 0, -1):
            if committed[-count:] == [normalise(word) for word in words[:count]]:
                return count
        return 0

    def _in_order(self, words: list[TimedWord], since: float) -> list[TimedWord]:
        """``words`` (after the committed ones, which this hypothesis has end at ``since``) up
        to the first that goes back in time: a decoder that loops repeats earlier audio's
        words, timed where they were said. The committed words' own times are not the
        measure: one timed at a window's end may have taken the start of the next."""
        last = since
        for index, word in enumerate(words):
            if word.start < last - _BACKWARDS_S:
                return words[:index]
            last = max(last, word.end)
        return words

    def hypothesis(
        self, transcript: TimedTranscript, window_start: float, window_end: float
    ) -> list[TimedWord]:
        """A step's hypothesis of the window ``[window_start, window_end)``: returns the words
        it commits (possibly none), and moves the next window's start when it is long."""
        tail = self.tail(transcript, window_start)
        commit: list[TimedWord] = []
        if len(self._tails) + 1 >= self._agreement:
            for index, word in enumerate(tail):
                key = normalise(word.word)
                if all(
                    index < len(old) and normalise(old[index].word) == key for old in self._tails
                ):
                    commit.append(word)
                else:
                    break
        self._commit(commit)
        self._tails = [*self._tails, tail][-(self._agreement - 1) :]
        self._tails = [old[len(commit) :] for old in self._tails]
        if window_end - self.window_start > HARD_LIMIT_S:
            forced = [w for w in self._tails[-1] if w.end <= window_end - _HARD_MARGIN_S]
            self._commit(forced)
            commit += forced
            self._tails = [old[len(forced) :] for old in self._tails]
        self._trim(window_end)
        if window_end - self.window_start > HARD_LIMIT_S:
            # No words there to commit (silence, noise): the window still moves on, to where
            # the words not yet committed begin, or short of the margin.
            rest = self._tails[-1] if self._tails else []
            start = min(window_end - _HARD_MARGIN_S, rest[0].start if rest else window_end)
            if start > self.window_start:
                self._move_start(start)
        return commit

    def finish(self, transcript: TimedTranscript, window_start: float) -> list[TimedWord]:
        """The final step's hypothesis, of the window up to the turn's end: all of its words
        after the committed ones are committed, and returned."""
        tail = self.tail(transcript, window_start)
        self._commit(tail)
        self._tails = []
        return tail

    def settle(
        self, transcript: TimedTranscript, window_start: float, window_end: float
    ) -> list[TimedWord]:
        """The hypothesis of a window that stops short of the audio there is (a backlog
        longer than the engine hears): its words that end a margin before the window's end
        are committed as they stand (the decoder heard them with plenty of audio after), the
        next window starts after them, and they are returned."""
        tail = self.tail(transcript, window_start)
        settled = [w for w in tail if w.end <= window_end - _HARD_MARGIN_S]
        self._commit(settled)
        self._tails = []
        # The next window starts after the settled words, or short of the margin if the
        # window held none (silence, noise): it always moves on.
        start = settled[-1].end if settled else window_end - _HARD_MARGIN_S
        self._move_start(max(start, self.window_start + _TIME_TOLERANCE_S))
        return settled

    def accept(self, words: Sequence[TimedWord]) -> None:
        """Commit ``words`` as they stand (the rest of a hypothesis already read with
        ``tail``, which the turn ended on)."""
        self._commit(words)
        self._tails = []

    def _commit(self, words: Sequence[TimedWord]) -> None:
        self.committed.extend(words)

    def _trim(self, window_end: float) -> None:
        """Move the window's start up to committed words once the window is long."""
        if window_end - self.window_start <= TRIM_AFTER_S or not self.committed:
            return
        limit = self.committed_end - OVERLAP_S
        cut = next(
            (w for w in reversed(self.committed) if w.end <= limit),
            None,
        )
        if cut is not None and cut.end > self.window_start:
            self._move_start(cut.end)

    def _move_start(self, start: float) -> None:
        self.window_start = start

"""Turn detection: speech start, pauses and turn end decided from VAD probabilities.

Everything runs on the sample clock. A pause is a run of silence inside speech; it becomes the
end of the turn once it lasts ``silence_ms``. ``semantic_vad`` changes ``silence_ms`` during a
pause, once it knows how complete the utterance sounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hark.session.turn_policy import TurnPolicy

# Speech must last this long before it counts: a click or a breath does not interrupt.
MIN_SPEECH_MS = 64
# Silero's usual hysteresis: once speaking, probability must fall this far below the threshold.
HYSTERESIS = 0.15

TurnEventKind = Literal["speech_started", "pause_started", "pause_ended", "speech_stopped"]


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """A decision at ``ms`` on the session clock.

    ``speech_started``: ``ms`` is where the turn's audio starts (prefix padding included).
    ``pause_started``: silence began at ``ms``. ``pause_ended``: speech resumed at ``ms``.
    ``speech_stopped``: the turn ended at ``ms`` (the silence window included).
    """

    kind: TurnEventKind
    ms: float


class TurnDetector:
    """Feeds on (chunk time, speech probability) and decides where turns start and end."""

    def __init__(self, policy: TurnPolicy) -> None:
        self.threshold = policy.threshold
        self.prefix_padding_ms = policy.prefix_padding_ms
        self.silence_ms = policy.silence_ms
        self.default_silence_ms = self.silence_ms
        self.off_threshold = max(0.01, self.threshold - HYSTERESIS)
        self.speaking = False
        self._onset: float | None = None
        self.pause_from: float | None = None

    def reset(self) -> None:
        """Back to silence, forgetting any speech in progress."""
        self.speaking = False
        self._onset = None
        self.pause_from = None
        self.silence_ms = self.default_silence_ms

    def feed(self, start_ms: float, end_ms: float, probability: float) -> TurnEvent | None:
        """One VAD chunk ``[start_ms, end_ms)``; returns a decision when one is made."""
        if not self.speaking:
            if probability >= self.threshold:
                if self._onset is None:
                    self._onset = start_ms
                if end_ms - self._onset >= MIN_SPEECH_MS:
                    self.speaking = True
                    self.pause_from = None
                    onset = max(0.0, self._onset - self.prefix_padding_ms)
                    return TurnEvent("speech_started", onset)
            else:
                self._onset = None
            return None
        if probability >= self.off_threshold:
            if self.pause_from is not None:
                self.pause_from = None
                self.silence_ms = self.default_silence_ms
                return TurnEvent("pause_ended", start_ms)
            return None
        if self.pause_from is None:
            self.pause_from = start_ms
            if self.silence_ms > end_ms - start_ms:
                return TurnEvent("pause_started", start_ms)
        return self.check(end_ms)

    def check(self, now_ms: float) -> TurnEvent | None:
        """End the turn if the pause has lasted ``silence_ms`` by ``now_ms``."""
        pause_from = self.pause_from
        if self.speaking and pause_from is not None and now_ms - pause_from >= self.silence_ms:
            self.reset()
            return TurnEvent("speech_stopped", now_ms)
        return None

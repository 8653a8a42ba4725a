"""Turn detection: speech start and end decided from VAD probabilities on the sample clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hark.protocol.session_config import SemanticVad, ServerVad

# Until the semantic end-of-turn model lands, semantic_vad is served by the VAD with a silence
# window that follows its eagerness.
SEMANTIC_SILENCE_MS = {"high": 300, "medium": 600, "auto": 600, "low": 1000}
# Speech must last this long before it counts: a click or a breath does not interrupt.
MIN_SPEECH_MS = 64
# Silero's usual hysteresis: once speaking, probability must fall this far below the threshold.
HYSTERESIS = 0.15


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """Speech started at ``ms`` (prefix padding included), or the turn ended at ``ms``."""

    kind: Literal["speech_started", "speech_stopped"]
    ms: float


class TurnDetector:
    """Feeds on (chunk time, speech probability) and decides where turns start and end."""

    def __init__(self, config: ServerVad | SemanticVad) -> None:
        if isinstance(config, ServerVad):
            self.threshold = config.threshold
            self.prefix_padding_ms = config.prefix_padding_ms
            self.silence_ms = config.silence_duration_ms
        else:
            self.threshold = 0.5
            self.prefix_padding_ms = 300
            self.silence_ms = SEMANTIC_SILENCE_MS[config.eagerness]
        self.off_threshold = max(0.01, self.threshold - HYSTERESIS)
        self.speaking = False
        self._onset: float | None = None
        self._silence_from: float | None = None

    def reset(self) -> None:
        """Back to silence, forgetting any speech in progress."""
        self.speaking = False
        self._onset = None
        self._silence_from = None

    def feed(self, start_ms: float, end_ms: float, probability: float) -> TurnEvent | None:
        """One VAD chunk ``[start_ms, end_ms)``; returns a decision when one is made."""
        if not self.speaking:
            if probability >= self.threshold:
                if self._onset is None:
                    self._onset = start_ms
                if end_ms - self._onset >= MIN_SPEECH_MS:
                    self.speaking = True
                    self._silence_from = None
                    return TurnEvent(
                        "speech_started", max(0.0, self._onset - self.prefix_padding_ms)
                    )
            else:
                self._onset = None
            return None
        if probability >= self.off_threshold:
            self._silence_from = None
            return None
        if self._silence_from is None:
            self._silence_from = start_ms
        if end_ms - self._silence_from >= self.silence_ms:
            self.speaking = False
            self._onset = None
            self._silence_from = None
            return TurnEvent("speech_stopped", end_ms)
        return None

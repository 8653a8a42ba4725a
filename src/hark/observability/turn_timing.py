"""Per-response stage timings, measured by the session's driver on a monotonic clock.

Every stage is a moment on one clock (seconds, ``time.monotonic``); durations are taken from
the end of the user's turn, the moment the server decided the turn was over
(``input_audio_buffer.speech_stopped``). A response that was cancelled or discarded reports no
time to first audio.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The stages of a turn, in the order they happen.
STAGES = (
    "transcript",  # the final transcript of the user's turn is known
    "llm_first_token",  # the LLM produced its first token for the reply
    "first_clause",  # the first clause was handed to the TTS
    "tts_first_audio",  # the TTS produced the first audio
    "first_audio_sent",  # the first reply audio left the server (delta event or media frame)
)


@dataclass(slots=True)
class TurnTimings:
    """When each stage of one response happened (monotonic seconds; None if it did not)."""

    response_id: str
    # When the turn ended (speech_stopped decided); None for responses not caused by a turn.
    turn_end: float | None = None
    # The server's estimate of the user's last voiced sample (turn end minus the silence wait).
    last_voiced: float | None = None
    stages: dict[str, float] = field(default_factory=dict)
    status: str = "in_progress"

    def mark(self, stage: str, at: float) -> None:
        """Record the first time ``stage`` happened."""
        self.stages.setdefault(stage, at)

    def since_turn_end_ms(self) -> dict[str, float]:
        """Each stage's delay after the end of the turn, in ms (empty without a turn end).

        A stage that happened before the turn ended (speculative work) counts as 0 ms.
        """
        if self.turn_end is None:
            return {}
        return {
            stage: round(max(0.0, at - self.turn_end) * 1000, 1)
            for stage, at in self.stages.items()
            if stage in STAGES
        }

    @property
    def e2a_ms(self) -> float | None:
        """End of turn → first audio sent, for a response that was heard (completed, or cut
        by its token limit) and was caused by a turn."""
        if self.status not in ("completed", "incomplete") or self.turn_end is None:
            return None
        sent = self.stages.get("first_audio_sent")
        return None if sent is None else round(max(0.0, sent - self.turn_end) * 1000, 1)

    @property
    def v2v_ms(self) -> float | None:
        """Server-side estimate of voice-to-voice: last voiced sample → first audio sent."""
        if self.e2a_ms is None or self.last_voiced is None or self.turn_end is None:
            return None
        return round(self.e2a_ms + (self.turn_end - self.last_voiced) * 1000, 1)

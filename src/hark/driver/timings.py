"""Per-response stage marks: when each response of a session reached each stage.

The runner follows the turn through the events the core emits and the engines' results, and
marks them here on a monotonic clock; a finished response's ``TurnTimings`` go to the
metrics, the log and, for a client that opted in, a ``hark.turn_timings`` event.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from hark.observability.turn_timing import TurnTimings

# The opt-in (session ``include``) for a ``hark.turn_timings`` event after each response.
TIMINGS_INCLUDE = "hark.turn_timings"


class ResponseTimings:
    """The stage marks of one session's responses under way."""

    __slots__ = ("_now", "_running", "_turn_end")

    def __init__(self, now: Callable[[], float]) -> None:
        """``now``: the monotonic clock the marks are read on."""
        self._now = now
        self._running: dict[str, TurnTimings] = {}
        # When the last turn ended, and how long its speaker had been silent by then (ms).
        self._turn_end: tuple[float, float] | None = None

    def turn_ended(self, waited_ms: float) -> None:
        """The user's turn ended now, ``waited_ms`` after their last voiced audio."""
        self._turn_end = (self._now(), waited_ms)

    def created(self, response_id: str) -> None:
        """A response began: its timings start from the turn that ended last, if any."""
        timings = TurnTimings(response_id)
        if self._turn_end is not None:
            ended, waited_ms = self._turn_end
            timings.turn_end = ended
            timings.last_voiced = ended - waited_ms / 1000
            self._turn_end = None
        self._running[response_id] = timings

    def mark(self, response_id: str, stage: str, at: float | None = None) -> None:
        """``stage`` of a response was reached now, or ``at``; the first mark counts."""
        timings = self._running.get(response_id)
        if timings is not None:
            timings.mark(stage, self._now() if at is None else at)

    def adopt(self, response_id: str, started: float, marks: Mapping[str, float]) -> None:
        """A response took over a speculative reply started at ``started``, whose stages
        were reached at ``marks``."""
        timings = self._running.get(response_id)
        if timings is not None:
            timings.mark("transcript", started)
            for stage, at in marks.items():
                timings.mark(stage, at)

    def done(self, response_id: str) -> TurnTimings | None:
        """A response ended: its timings, no longer kept."""
        return self._running.pop(response_id, None)


def timings_event(event_id: str, response_id: str, timings: TurnTimings) -> str:
    """The ``hark.turn_timings`` event of a finished response, serialised."""
    body: dict[str, Any] = {
        "type": TIMINGS_INCLUDE,
        "event_id": event_id,
        "response_id": response_id,
        "e2a_ms": timings.e2a_ms,
        "v2v_ms": timings.v2v_ms,
        "stages_ms": timings.since_turn_end_ms(),
    }
    return json.dumps(body)

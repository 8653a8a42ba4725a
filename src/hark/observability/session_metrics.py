"""What one session reports to the process's metrics; its runner calls it as things happen.

Event counts are kept here and handed to Prometheus in bulk (every ``FLUSH_EVERY`` counts,
at each turn and when the session ends): a labelled Prometheus counter costs a few
microseconds, and a session streaming 20 ms of audio per event sends fifty events a second.
Histograms that see one value per turn are written at once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

from hark.observability.turn_timing import STAGES, TurnTimings
from hark.protocol.client_events import CLIENT_EVENT_TYPES
from hark.protocol.server_events import Error, ServerEvent

if TYPE_CHECKING:
    from hark.observability.metrics import Metrics

# A VAD chunk answered later than this after its audio arrived means the VAD is falling
# behind real time (a 32 ms chunk plus a batch's wait normally take a few ms).
LATE_AFTER_SECONDS = 0.1
# Counts held locally before they are handed to Prometheus.
FLUSH_EVERY = 200
# Client event types outside the protocol are counted under one label, so that a client
# cannot create series at will.
UNKNOWN_TYPE = "unknown"
_KNOWN_CLIENT_TYPES = frozenset(CLIENT_EVENT_TYPES)
# Event classes to their ``type``: looked up once per class, not once per event.
_TAGS: dict[type[ServerEvent], str] = {}


@dataclass(slots=True, eq=False)
class SessionMetrics:
    """The metrics of one session, from ``Metrics.session(transport, session_id)``.

    ``SessionMetrics.disabled()`` accepts the same calls and records nothing. ``clock`` is the
    monotonic clock that the ``arrived`` arguments come from (``time.monotonic``).
    """

    metrics: Metrics | None
    transport: str
    session_id: str | None = None
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    _client: Counter[str] = field(default_factory=Counter, init=False, repr=False)
    _server: Counter[str] = field(default_factory=Counter, init=False, repr=False)
    _vad_chunks: int = field(default=0, init=False, repr=False)
    _vad_late: int = field(default=0, init=False, repr=False)
    _held: int = field(default=0, init=False, repr=False)
    _started_at: float | None = field(default=None, init=False, repr=False)
    _ended: bool = field(default=False, init=False, repr=False)

    @classmethod
    def disabled(cls) -> SessionMetrics:
        """An observer that records nothing (for runners without metrics, e.g. in tests)."""
        return cls(None, "none")

    def started(self) -> None:
        """The session began (its ``session.created`` is queued)."""
        if self.metrics is None or self._started_at is not None:
            return
        self._started_at = self.clock()
        self.metrics.sessions_started.labels(self.transport).inc()
        self.metrics.sessions_active.labels(self.transport).inc()

    def ended(self, reason: str) -> None:
        """The session is over; ``reason`` is a short fixed word (``client_closed``,
        ``expired``, ``server_shutdown``, ``error``…). Only the first call counts."""
        if self.metrics is None or self._started_at is None or self._ended:
            return
        self._ended = True
        self.flush()
        m = self.metrics
        m.sessions_ended.labels(self.transport, reason).inc()
        m.sessions_active.labels(self.transport).dec()
        m.session_duration.labels(self.transport).observe(self.clock() - self._started_at)

    def client_event(self, type: str) -> None:
        """A client event of ``type`` was received (unknown types count as ``unknown``)."""
        if self.metrics is None:
            return
        self._client[type if type in _KNOWN_CLIENT_TYPES else UNKNOWN_TYPE] += 1
        self._hold()

    def server_event(self, event: ServerEvent) -> None:
        """A server event was queued for the client; an ``error`` also counts by its code."""
        if self.metrics is None:
            return
        kind = type(event)
        tag = _TAGS.get(kind)
        if tag is None:
            tag = _TAGS[kind] = str(kind.__struct_config__.tag)
        self._server[tag] += 1
        if isinstance(event, Error):
            self.metrics.errors.labels(event.error.code or "none").inc()
        self._hold()

    def vad_chunk(self, arrived: float, now: float | None = None) -> None:
        """The VAD answered (at ``now``, else the clock's time) for a chunk whose last sample
        arrived at ``arrived``."""
        if self.metrics is None:
            return
        self._vad_chunks += 1
        if (self.clock() if now is None else now) - arrived > LATE_AFTER_SECONDS:
            self._vad_late += 1
        self._hold()

    def vad_chunk_dropped(self) -> None:
        """The VAD dropped a chunk unanswered: it fell too far behind (rare, so not held)."""
        if self.metrics is not None:
            self.metrics.vad_chunks_dropped.inc()

    def input_throttled(self, seconds: float) -> None:
        """The client's input went unread for ``seconds``: the session had used its input
        budget (``hark.transports.input_budget``)."""
        if self.metrics is not None:
            self.metrics.input_throttled.labels(self.transport).inc(seconds)

    def vad_decision(self, decision: str, arrived: float) -> None:
        """Turn detection decided ``decision`` (``speech_started`` / ``speech_stopped``) on the
        VAD result of a chunk whose last sample arrived at ``arrived``."""
        if self.metrics is None:
            return
        lag = max(0.0, self.clock() - arrived)
        self.metrics.vad_decision_lag.labels(decision).observe(lag)

    def audio_late(self, chunks: int = 1) -> None:
        """Input media frames that arrived too late to use (a jitter buffer's late frames)."""
        if self.metrics is not None and chunks > 0:
            self.metrics.audio_late.labels(self.transport).inc(chunks)

    def audio_dropped(self, chunks: int = 1) -> None:
        """Input audio chunks dropped before the session got them (a queue overflowed)."""
        if self.metrics is not None and chunks > 0:
            self.metrics.audio_dropped.labels(self.transport).inc(chunks)

    def turn(self, timings: TurnTimings) -> None:
        """A response finished: its stage timings, E2A and V2V (and a trace when enabled)."""
        m = self.metrics
        if m is None:
            return
        m.responses.labels(timings.status).inc()
        if timings.turn_end is not None:
            for stage in STAGES:
                at = timings.stages.get(stage)
                if at is not None:
                    m.turn_stage.labels(stage).observe(max(0.0, at - timings.turn_end))
        if timings.e2a_ms is not None:
            m.e2a.observe(timings.e2a_ms / 1000)
        if timings.v2v_ms is not None:
            m.v2v.observe(timings.v2v_ms / 1000)
        if m.tracer is not None:
            m.tracer.record(timings, session_id=self.session_id, transport=self.transport)
        self.flush()

    def flush(self) -> None:
        """Hand the counts held here to Prometheus."""
        m = self.metrics
        if m is None or self._held == 0:
            return
        for type, count in self._client.items():
            m.client_events.labels(type).inc(count)
        for type, count in self._server.items():
            m.server_events.labels(type).inc(count)
        if self._vad_chunks:
            m.vad_chunks.inc(self._vad_chunks)
        if self._vad_late:
            m.vad_chunks_late.inc(self._vad_late)
        self._client.clear()
        self._server.clear()
        self._vad_chunks = self._vad_late = self._held = 0

    def _hold(self) -> None:
        self._held += 1
        if self._held >= FLUSH_EVERY:
            self.flush()

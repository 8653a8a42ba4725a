"""Prometheus metrics: what the server is doing, how fast, and what it costs.

One ``Metrics`` per process, on its own ``CollectorRegistry``. With several worker processes
(``hark serve --workers N``) the parent sets ``PROMETHEUS_MULTIPROC_DIR`` before the workers
start; every worker then writes its figures to files there and a scrape of any worker
returns the sum over the whole server (prometheus_client's multiprocess mode). Gauges say
how they combine: ``livesum`` (active sessions), ``livemax`` (event-loop lag) or ``liveall``
(one series per worker ``pid``: memory, file descriptors).

Sessions report through a ``SessionMetrics`` (``Metrics.session``), which counts events
locally and hands them over in bulk: a labelled counter costs microseconds, and a busy
process sees tens of thousands of audio appends a second.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from hark.observability.loop_lag import monitor_loop_lag
from hark.observability.session_metrics import SessionMetrics

if TYPE_CHECKING:
    from hark.engines.llm.failover import BackendObserver, BackendState
    from hark.engines.vad.batcher import BatchObserver
    from hark.observability.tracing import TurnTracer

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds. Turn stages span a few ms (fake engines) to seconds (a slow LLM).
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)  # fmt: skip
# Seconds. A VAD decision should follow its audio within a batch deadline plus a model call.
DECISION_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
)  # fmt: skip
LOOP_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1)
BATCH_RUN_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
SESSION_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)

# How often the background task reads memory and file descriptors.
PROCESS_SAMPLE_SECONDS = 1.0
# How often the event loop's lag is measured.
LOOP_LAG_INTERVAL_SECONDS = 0.1


class Metrics:
    """Every series hark exports, on its own registry.

    ``multiprocess_dir`` is the directory of prometheus_client's multiprocess mode; by
    default ``$PROMETHEUS_MULTIPROC_DIR`` when set (it must be set before prometheus_client
    is first imported, which ``hark serve --workers`` does). ``tracer``, when given, gets
    every finished turn as a trace.
    """

    def __init__(
        self, *, multiprocess_dir: str | None = None, tracer: TurnTracer | None = None
    ) -> None:
        self.multiprocess_dir = multiprocess_dir or os.environ.get(MULTIPROC_ENV) or None
        # A ``_created`` timestamp beside every counter and histogram doubles the series a
        # scrape carries for nothing a dashboard uses (the switch is process-wide).
        disable_created_metrics()
        self.tracer = tracer
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        self.sessions_active = Gauge(
            "hark_sessions_active",
            "Sessions open now, by transport.",
            ["transport"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.sessions_started = Counter(
            "hark_sessions_started", "Sessions started, by transport.", ["transport"], registry=r
        )
        self.sessions_ended = Counter(
            "hark_sessions_ended",
            "Sessions ended, by transport and reason.",
            ["transport", "reason"],
            registry=r,
        )
        self.session_duration = Histogram(
            "hark_session_duration_seconds",
            "How long sessions lasted.",
            ["transport"],
            buckets=SESSION_DURATION_BUCKETS,
            registry=r,
        )
        self.client_events = Counter(
            "hark_client_events", "Client events received, by type.", ["type"], registry=r
        )
        self.server_events = Counter(
            "hark_server_events", "Server events sent, by type.", ["type"], registry=r
        )
        self.errors = Counter(
            "hark_errors", "Error events sent to clients, by error code.", ["code"], registry=r
        )
        self.turn_stage = Histogram(
            "hark_turn_stage_seconds",
            "When each stage of a response happened, after the end of the user's turn.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2a = Histogram(
            "hark_e2a_seconds",
            "End of the user's turn to the first reply audio sent (completed responses).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.v2v = Histogram(
            "hark_v2v_seconds",
            "The user's last voiced sample to the first reply audio sent (server's estimate).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.responses = Counter(
            "hark_responses", "Responses finished, by status.", ["status"], registry=r
        )
        self.vad_decision_lag = Histogram(
            "hark_vad_decision_lag_seconds",
            "From the arrival of the audio a VAD decision was made on to the decision.",
            ["decision"],
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.vad_chunks = Counter(
            "hark_vad_chunks", "VAD chunks (32 ms of audio) analysed.", registry=r
        )
        self.vad_chunks_late = Counter(
            "hark_vad_chunks_late",
            "VAD chunks analysed more than 100 ms after their audio arrived.",
            registry=r,
        )
        self.vad_chunks_dropped = Counter(
            "hark_vad_chunks_dropped",
            "VAD chunks dropped unanalysed: a stream's queue was full (the VAD fell behind).",
            registry=r,
        )
        self.engine_restarts = Counter(
            "hark_engine_thread_restarts",
            "Engine threads (VAD batcher, schedulers, the LLM's) started again after dying.",
            ["engine"],
            registry=r,
        )
        self.audio_late = Counter(
            "hark_audio_chunks_late",
            "Input media frames that arrived too late to be played in order.",
            ["transport"],
            registry=r,
        )
        self.audio_dropped = Counter(
            "hark_audio_chunks_dropped",
            "Input audio chunks dropped before the session got them.",
            ["transport"],
            registry=r,
        )
        self.input_throttled = Counter(
            "hark_input_throttled_seconds",
            "Time clients' input went unread: their sessions had used their share of the "
            "event loop (a client sending faster than it is answered), by transport.",
            ["transport"],
            registry=r,
        )
        self.loop_lag = Histogram(
            "hark_event_loop_lag_seconds",
            "How late the event loop ran a timer.",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.loop_lag_max = Gauge(
            "hark_event_loop_lag_max_seconds",
            "The largest event-loop lag in the last second.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.batch_queue = Gauge(
            "hark_batcher_queue_depth",
            "Items left waiting when a batch started, by model.",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.batch_size = Histogram(
            "hark_batcher_batch_size",
            "Rows per batched model call, by model.",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_wait = Histogram(
            "hark_batcher_wait_seconds",
            "How long the oldest item of a batch waited for it, by model.",
            ["model"],
            buckets=BATCH_WAIT_BUCKETS,
            registry=r,
        )
        self.batch_run = Histogram(
            "hark_batcher_run_seconds",
            "How long a batched model call took, by model.",
            ["model"],
            buckets=BATCH_RUN_BUCKETS,
            registry=r,
        )
        self.resident_memory = Gauge(
            "hark_process_resident_memory_bytes",
            "Resident memory of each server process.",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.open_fds = Gauge(
            "hark_process_open_fds",
            "Open file descriptors of each server process.",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.llm_backend_requests = Counter(
            "hark_llm_backend_requests",
            "Generation requests sent to each LLM backend (retries and continuations too).",
            ["backend"],
            registry=r,
        )
        self.llm_backend_failures = Counter(
            "hark_llm_backend_failures",
            "Generation requests that failed on each LLM backend.",
            ["backend"],
            registry=r,
        )
        self.llm_backend_failovers = Counter(
            "hark_llm_backend_failovers",
            "Responses that moved from each LLM backend to another after it failed.",
            ["backend"],
            registry=r,
        )
        self.llm_backend_state = Gauge(
            "hark_llm_backend_state",
            "1 for each LLM backend's state (healthy, unknown, unhealthy), 0 for the others; "
            "summed over the workers.",
            ["backend", "state"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.cluster_store_up = Gauge(
            "hark_cluster_store_up",
            "1 while the worker's last heartbeat reached the cluster store, else 0.",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.placements = Counter(
            "hark_call_placements",
            "New WebRTC calls by where placement put them (here, or another worker).",
            ["where"],
            registry=r,
        )
        self.forwarded = Counter(
            "hark_forwarded_requests",
            "Requests passed to the worker that owns their call, by kind (offer, hangup, "
            "sideband, accept, reject, refer) and outcome (ok, unreachable).",
            ["kind", "outcome"],
            registry=r,
        )
        self._lag_lock = threading.Lock()
        self._lag_window_max = 0.0

    def session(self, transport: str, session_id: str | None = None) -> SessionMetrics:
        """A new observer for one session on ``transport`` (``websocket``, ``webrtc``, ``sip``)."""
        return SessionMetrics(self, transport, session_id)

    def batch_observer(self, model: str) -> BatchObserver:
        """An observer of the batches a batching engine of ``model`` (e.g. ``vad``) runs."""
        return _BatchMetrics(self, model)

    def llm_backend_observer(self) -> BackendObserver:
        """An observer for a ``FailoverLlm``'s backends."""
        return _LlmBackendMetrics(self)

    def engine_restarted(self, engine: str) -> None:
        """A thread of ``engine`` died and was started again (``hark.engines.health``)."""
        self.engine_restarts.labels(engine).inc()

    def observe_loop_lag(self, seconds: float) -> None:
        """One measure of the event loop's lag."""
        self.loop_lag.observe(seconds)
        with self._lag_lock:
            self._lag_window_max = max(self._lag_window_max, seconds)

    def sample_process(self) -> None:
        """Record this process's memory, open file descriptors and recent loop lag."""
        rss = resident_memory_bytes()
        if rss is not None:
            self.resident_memory.set(rss)
        fds = open_fd_count()
        if fds is not None:
            self.open_fds.set(fds)
        with self._lag_lock:
            lag, self._lag_window_max = self._lag_window_max, 0.0
        self.loop_lag_max.set(lag)

    async def run_background(self) -> None:
        """Measure loop lag and sample the process until cancelled (run it as a task)."""
        lag = asyncio.create_task(
            monitor_loop_lag(self.observe_loop_lag, LOOP_LAG_INTERVAL_SECONDS), name="loop-lag"
        )
        try:
            while True:
                self.sample_process()
                await asyncio.sleep(PROCESS_SAMPLE_SECONDS)
        finally:
            lag.cancel()
            await asyncio.wait([lag])

    def exposition(self) -> bytes:
        """The text of a scrape: this process, or every worker in multiprocess mode."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self.multiprocess_dir)
        return generate_latest(merged)


class _BatchMetrics:
    """Feeds a batcher's reports into the batcher series of one model."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._queue = metrics.batch_queue.labels(model)
        self._size = metrics.batch_size.labels(model)
        self._wait = metrics.batch_wait.labels(model)
        self._run = metrics.batch_run.labels(model)

    def batch(self, size: int, wait_s: float, run_s: float, backlog: int) -> None:
        self._size.observe(size)
        self._wait.observe(wait_s)
        self._run.observe(run_s)
        self._queue.set(backlog)


class _LlmBackendMetrics:
    """Feeds a ``FailoverLlm``'s reports into the per-backend LLM series."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def request(self, backend: str) -> None:
        self._metrics.llm_backend_requests.labels(backend).inc()

    def failure(self, backend: str) -> None:
        self._metrics.llm_backend_failures.labels(backend).inc()

    def failover(self, backend: str) -> None:
        self._metrics.llm_backend_failovers.labels(backend).inc()

    def state(self, backend: str, state: BackendState) -> None:
        from hark.engines.llm.failover import BACKEND_STATES

        for each in BACKEND_STATES:
            self._metrics.llm_backend_state.labels(backend, each).set(1 if each == state else 0)


def resident_memory_bytes() -> int | None:
    """This process's resident set size, from ``/proc`` (None where there is no ``/proc``)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def open_fd_count() -> int | None:
    """How many file descriptors this process has open (None where there is no ``/proc``)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None

"""Metrics: every series is exported, sessions report what they see, nothing is lost."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hark.engines.vad import Outcomes
from hark.engines.vad.batcher import BatchedSileroVad
from hark.observability.loop_lag import monitor_loop_lag
from hark.observability.metrics import Metrics
from hark.observability.session_metrics import FLUSH_EVERY, LATE_AFTER_SECONDS, SessionMetrics
from hark.observability.turn_timing import TurnTimings
from hark.protocol import server_events as se

SERIES = (
    "hark_sessions_active",
    "hark_sessions_started_total",
    "hark_sessions_ended_total",
    "hark_session_duration_seconds",
    "hark_client_events_total",
    "hark_server_events_total",
    "hark_errors_total",
    "hark_turn_stage_seconds",
    "hark_e2a_seconds",
    "hark_v2v_seconds",
    "hark_responses_total",
    "hark_vad_decision_lag_seconds",
    "hark_vad_chunks_total",
    "hark_vad_chunks_late_total",
    "hark_audio_chunks_late_total",
    "hark_audio_chunks_dropped_total",
    "hark_event_loop_lag_seconds",
    "hark_event_loop_lag_max_seconds",
    "hark_batcher_queue_depth",
    "hark_batcher_batch_size",
    "hark_batcher_wait_seconds",
    "hark_batcher_run_seconds",
    "hark_process_resident_memory_bytes",
    "hark_process_open_fds",
    "hark_cluster_store_up",
    "hark_call_placements_total",
    "hark_forwarded_requests_total",
    "hark_llm_backend_requests_total",
    "hark_llm_backend_failures_total",
    "hark_llm_backend_failovers_total",
    "hark_llm_backend_state",
)


def scrape(metrics: Metrics) -> dict[str, float]:
    """``{'name{k="v",…}': value}`` of one exposition."""
    flat: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            flat[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return flat


def an_error(code: str | None) -> se.Error:
    detail = se.ErrorDetail(
        type="invalid_request_error", code=code, message="bad", param=None, event_id=None
    )
    return se.Error(error=detail)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_every_series_is_exported() -> None:
    metrics = Metrics()
    session = metrics.session("websocket", "sess_1")
    session.started()
    session.client_event("input_audio_buffer.append")
    session.server_event(se.SessionCreated(session={}))
    session.server_event(an_error("invalid_value"))
    session.vad_chunk(time.monotonic())
    session.vad_decision("speech_stopped", time.monotonic())
    session.audio_late(1)
    session.audio_dropped(1)
    session.turn(completed_turn())
    session.ended("client_closed")
    metrics.batch_observer("vad").batch(4, 0.002, 0.001, 0)
    metrics.observe_loop_lag(0.001)
    metrics.sample_process()
    metrics.cluster_store_up.set(1)
    metrics.placements.labels("here").inc()
    metrics.forwarded.labels("hangup", "ok").inc()
    for counter in (
        metrics.llm_backend_requests,
        metrics.llm_backend_failures,
        metrics.llm_backend_failovers,
    ):
        counter.labels("http://gpu-1:8000/v1").inc()
    metrics.llm_backend_state.labels("http://gpu-1:8000/v1", "healthy").set(1)
    names = {name.split("{")[0] for name in scrape(metrics)}
    for series in SERIES:
        assert any(name == series or name.startswith(series + "_") for name in names), series


def test_a_session_counts_its_life() -> None:
    metrics = Metrics()
    clock = FakeClock()
    session = SessionMetrics(metrics, "websocket", "sess_1", clock=clock)
    session.started()
    session.started()
    assert scrape(metrics)['hark_sessions_active{transport="websocket"}'] == 1
    clock.now += 42
    session.ended("client_closed")
    session.ended("expired")
    values = scrape(metrics)
    assert values['hark_sessions_active{transport="websocket"}'] == 0
    assert values['hark_sessions_started_total{transport="websocket"}'] == 1
    assert values['hark_sessions_ended_total{reason="client_closed",transport="websocket"}'] == 1
    assert 'hark_sessions_ended_total{reason="expired",transport="websocket"}' not in values
    assert values['hark_session_duration_seconds_sum{transport="websocket"}'] == 42


def test_event_counts_are_held_then_handed_over() -> None:
    metrics = Metrics()
    session = metrics.session("websocket")
    session.started()
    for _ in range(FLUSH_EVERY - 1):
        session.client_event("input_audio_buffer.append")
    key = 'hark_client_events_total{type="input_audio_buffer.append"}'
    assert key not in scrape(metrics)
    session.client_event("input_audio_buffer.append")
    assert scrape(metrics)[key] == FLUSH_EVERY
    session.server_event(an_error("invalid_value"))
    session.server_event(an_error(None))
    session.server_event(an_error("invalid_value"))
    session.client_event("no.such.event")
    session.ended("client_closed")
    values = scrape(metrics)
    assert values['hark_server_events_total{type="error"}'] == 3
    assert values['hark_errors_total{code="invalid_value"}'] == 2
    assert values['hark_errors_total{code="none"}'] == 1
    assert values['hark_client_events_total{type="unknown"}'] == 1
    assert 'hark_client_events_total{type="no.such.event"}' not in values


def test_late_vad_chunks_and_decision_lag() -> None:
    metrics = Metrics()
    clock = FakeClock()
    session = SessionMetrics(metrics, "websocket", clock=clock)
    session.started()
    session.vad_chunk(clock.now - 0.01)
    session.vad_chunk(clock.now - LATE_AFTER_SECONDS - 0.05)
    session.vad_decision("speech_stopped", clock.now - 0.03)
    session.ended("client_closed")
    values = scrape(metrics)
    assert values["hark_vad_chunks_total"] == 2
    assert values["hark_vad_chunks_late_total"] == 1
    assert values['hark_vad_decision_lag_seconds_count{decision="speech_stopped"}'] == 1
    assert values['hark_vad_decision_lag_seconds_sum{decision="speech_stopped"}'] == (
        pytest.approx(0.03)
    )
    assert values['hark_vad_decision_lag_seconds_bucket{decision="speech_stopped",le="0.02"}'] == 0
    assert values['hark_vad_decision_lag_seconds_bucket{decision="speech_stopped",le="0.05"}'] == 1


def completed_turn() -> TurnTimings:
    timings = TurnTimings("resp_1", turn_end=10.0, last_voiced=9.5, status="completed")
    for offset, stage in ((0.1, "transcript"), (0.2, "llm_first_token"), (0.3, "first_clause")):
        timings.mark(stage, 10.0 + offset)
    timings.mark("tts_first_audio", 10.35)
    timings.mark("first_audio_sent", 10.4)
    return timings


def test_a_turn_gives_stage_latencies_e2a_and_v2v() -> None:
    metrics = Metrics()
    session = metrics.session("websocket")
    session.turn(completed_turn())
    cancelled = TurnTimings("resp_2", turn_end=20.0, status="cancelled")
    cancelled.mark("transcript", 19.9)
    session.turn(cancelled)
    values = scrape(metrics)
    assert values["hark_e2a_seconds_count"] == 1
    assert values["hark_e2a_seconds_sum"] == pytest.approx(0.4)
    assert values["hark_v2v_seconds_sum"] == pytest.approx(0.9)
    assert values['hark_turn_stage_seconds_sum{stage="first_clause"}'] == pytest.approx(0.3)
    # Work done before the turn ended counts as no wait at all.
    assert values['hark_turn_stage_seconds_sum{stage="transcript"}'] == pytest.approx(0.1)
    assert values['hark_turn_stage_seconds_count{stage="transcript"}'] == 2
    assert values['hark_responses_total{status="completed"}'] == 1
    assert values['hark_responses_total{status="cancelled"}'] == 1


def test_a_disabled_session_records_nothing() -> None:
    session = SessionMetrics.disabled()
    session.started()
    for _ in range(3 * FLUSH_EVERY + 1):
        session.client_event("input_audio_buffer.append")
        session.server_event(an_error("x"))
        session.vad_chunk(0.0)
    session.vad_decision("speech_stopped", 0.0)
    session.turn(completed_turn())
    session.audio_dropped(3)
    session.ended("client_closed")
    # With no registry to hand counts to, holding them would only grow for the whole session.
    assert session._held == 0
    assert not session._client and not session._server
    assert session._vad_chunks == session._vad_late == 0


async def test_batchers_report_their_batches() -> None:
    metrics = Metrics()
    vad = BatchedSileroVad(max_batch=8, max_wait_ms=1)
    vad.observe(metrics)
    await vad.warmup()
    done = asyncio.Event()
    results: list[float] = []

    def heard(outcomes: Outcomes) -> None:
        results.extend(p for p, _ in outcomes if isinstance(p, float))
        if len(results) == 20:
            done.set()

    streams = [vad.open_stream(heard) for _ in range(4)]
    try:
        for _ in range(5):
            for stream in streams:
                stream.push(np.zeros(512, dtype=np.int16), 0)
        await asyncio.wait_for(done.wait(), 30)
    finally:
        for stream in streams:
            stream.close()
        # The thread has reported its last batch once it is stopped.
        await vad.aclose()
    values = scrape(metrics)
    # The warm-up's chunk, then the streams' 20.
    assert values['hark_batcher_batch_size_sum{model="vad"}'] == 21
    # A stream's chunks go one per batch, each after the state the one before leaves.
    assert values['hark_batcher_batch_size_count{model="vad"}'] >= 6
    assert values['hark_batcher_wait_seconds_count{model="vad"}'] >= 6
    assert 'hark_batcher_queue_depth{model="vad"}' in values


def test_the_process_is_sampled() -> None:
    metrics = Metrics()
    metrics.observe_loop_lag(0.25)
    metrics.sample_process()
    values = scrape(metrics)
    assert values["hark_process_resident_memory_bytes"] > 10 * 2**20
    assert values["hark_process_open_fds"] >= 3
    assert values["hark_event_loop_lag_max_seconds"] == 0.25
    # The maximum is of the last window only.
    metrics.sample_process()
    assert scrape(metrics)["hark_event_loop_lag_max_seconds"] == 0


async def test_a_blocked_loop_shows_as_lag() -> None:
    lags: list[float] = []
    monitor = asyncio.create_task(monitor_loop_lag(lags.append, interval_s=0.02))
    await asyncio.sleep(0.05)
    # Block the loop outright, as a synchronous call in a coroutine would.
    time.sleep(0.3)  # noqa: ASYNC251
    await asyncio.sleep(0.05)
    monitor.cancel()
    with pytest.raises(asyncio.CancelledError):
        await monitor
    assert max(lags) >= 0.25


async def test_the_background_task_samples_and_stops() -> None:
    metrics = Metrics()
    task = asyncio.create_task(metrics.run_background())
    # However slow the machine, the task samples and measures the loop; wait until it has.
    async with asyncio.timeout(30):
        while True:
            if scrape(metrics).get("hark_event_loop_lag_seconds_count", 0) >= 1:
                break
            await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    values = scrape(metrics)
    assert values["hark_process_open_fds"] > 0
    assert values["hark_event_loop_lag_seconds_count"] >= 1

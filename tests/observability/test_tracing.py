"""Turn traces: a span per turn with a span per stage, on the times the stages happened."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

pytest.importorskip("opentelemetry.sdk", reason="the 'otel' extra is not installed")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hark.observability.metrics import Metrics
from hark.observability.tracing import TurnTracer, traces_url
from hark.observability.turn_timing import TurnTimings


def a_turn(now: float) -> TurnTimings:
    timings = TurnTimings("resp_7", turn_end=now - 1.0, last_voiced=now - 1.5, status="completed")
    # The transcript was ready before the turn ended (speculative recognition).
    timings.mark("transcript", now - 1.1)
    timings.mark("llm_first_token", now - 0.8)
    timings.mark("first_clause", now - 0.7)
    timings.mark("tts_first_audio", now - 0.6)
    timings.mark("first_audio_sent", now - 0.55)
    return timings


def test_a_turn_is_a_span_with_a_child_per_stage() -> None:
    exporter = InMemorySpanExporter()
    tracer = TurnTracer(exporter=exporter)
    timings = a_turn(time.monotonic())
    tracer.record(timings, session_id="sess_1", transport="websocket")
    assert tracer.force_flush()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {
        "turn",
        "end_of_turn",
        "transcript",
        "llm_first_token",
        "first_clause",
        "tts_first_audio",
        "first_audio_sent",
    }
    root = spans["turn"]
    assert root.parent is None
    assert root.attributes is not None
    assert root.attributes["hark.session_id"] == "sess_1"
    assert root.attributes["hark.e2a_ms"] == timings.e2a_ms
    children = [span for name, span in spans.items() if name != "turn"]
    assert root.start_time is not None and root.end_time is not None
    for span in children:
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.context.trace_id == root.context.trace_id
        assert span.start_time is not None and span.end_time is not None
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time

    def ms(span_name: str) -> float:
        span = spans[span_name]
        assert span.start_time is not None and span.end_time is not None
        return (span.end_time - span.start_time) / 1e6

    assert ms("end_of_turn") == pytest.approx(500, abs=0.01)
    assert ms("llm_first_token") == pytest.approx(200, abs=0.01)
    assert ms("first_audio_sent") == pytest.approx(50, abs=0.01)
    assert spans["llm_first_token"].start_time == spans["end_of_turn"].end_time
    # The turn spans from the last voiced sample to the first audio sent, on the wall clock.
    assert (root.end_time - root.start_time) / 1e6 == pytest.approx(950, abs=0.01)
    assert abs(root.end_time / 1e9 - (time.time() - 0.55)) < 5
    tracer.shutdown()


def test_session_metrics_send_turns_to_the_tracer() -> None:
    exporter = InMemorySpanExporter()
    tracer = TurnTracer(exporter=exporter)
    metrics = Metrics(tracer=tracer)
    metrics.session("websocket", "sess_2").turn(a_turn(time.monotonic()))
    tracer.force_flush()
    assert [s.name for s in exporter.get_finished_spans()].count("turn") == 1
    tracer.shutdown()


def test_traces_url() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
    with pytest.raises(ValueError):
        traces_url("collector:4318")


async def test_spans_reach_an_otlp_collector_over_http() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[bytes] = []
    arrived = asyncio.Event()

    async def collect(request: web.Request) -> web.Response:
        received.append(await request.read())
        arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        tracer = TurnTracer(f"http://{host}:{port}")
        tracer.record(a_turn(time.monotonic()), session_id="sess_3")
        # The exporter posts from its own thread, with blocking I/O.
        await asyncio.to_thread(tracer.force_flush)
        await asyncio.wait_for(arrived.wait(), 30)
        await asyncio.to_thread(tracer.shutdown)
    finally:
        await runner.cleanup()
    request = ExportTraceServiceRequest()
    request.ParseFromString(received[0])
    names = {
        span.name
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    }
    assert {"turn", "end_of_turn", "first_audio_sent"} <= names
    service = {
        attribute.value.string_value
        for resource in request.resource_spans
        for attribute in resource.resource.attributes
        if attribute.key == "service.name"
    }
    assert service == {"hark"}

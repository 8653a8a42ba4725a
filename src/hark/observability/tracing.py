"""OpenTelemetry traces of turns, built after the fact from a finished ``TurnTimings``.

Off by default; ``hark serve --otel-endpoint URL`` sends them over OTLP/HTTP (protobuf) to a
collector (``URL/v1/traces`` when the URL has no path). Each response is one ``turn`` span
with a child span per stage, laid end to end on the real times the stages happened:
``end_of_turn`` (the user's last voiced sample to the turn decision), then ``transcript``,
``llm_first_token``, ``first_clause``, ``tts_first_audio`` and ``first_audio_sent``, each
from the stage before it. The spans are built when the response ends, so tracing costs the
live path nothing; they are exported in the background. Needs the ``otel`` extra.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from hark.observability.turn_timing import STAGES, TurnTimings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

SERVICE_NAME = "hark"
TRACES_PATH = "/v1/traces"


class TracingUnavailableError(RuntimeError):
    """Tracing was asked for but the OpenTelemetry SDK is not installed."""


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector: ``/v1/traces`` added to a URL without a path."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the OTLP endpoint must be an http(s) URL, not {endpoint!r}")
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + TRACES_PATH
    return endpoint


class TurnTracer:
    """Turns ``TurnTimings`` into spans and exports them.

    ``endpoint`` is the collector's OTLP/HTTP URL; ``exporter`` replaces the OTLP exporter
    (tests pass an in-memory one). Raises ``TracingUnavailableError`` without the SDK.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        exporter: SpanExporter | None = None,
        service_name: str = SERVICE_NAME,
    ) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise TracingUnavailableError(
                "traces need OpenTelemetry: pip install 'hark[otel]'"
            ) from exc
        if exporter is None:
            if endpoint is None:
                raise ValueError("a TurnTracer needs an endpoint or an exporter")
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError as exc:
                raise TracingUnavailableError(
                    "traces need the OTLP exporter: pip install 'hark[otel]'"
                ) from exc
            exporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
        # A provider of our own, not the global one: hark must not change what an
        # application embedding it has set up.
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("hark")
        self._set_span_in_context = trace.set_span_in_context

    def record(
        self,
        timings: TurnTimings,
        *,
        session_id: str | None = None,
        transport: str | None = None,
    ) -> None:
        """Queue the spans of one finished response for export."""
        # The timings are on the monotonic clock; spans want the wall clock in ns.
        offset_ns = time.time_ns() - time.monotonic_ns()

        def ns(moment: float) -> int:
            return round(moment * 1e9) + offset_ns

        marks = [(stage, timings.stages[stage]) for stage in STAGES if stage in timings.stages]
        moments = [at for _, at in marks]
        for moment in (timings.turn_end, timings.last_voiced):
            if moment is not None:
                moments.append(moment)
        if not moments:
            return
        attributes: dict[str, Any] = {
            "hark.response_id": timings.response_id,
            "hark.response_status": timings.status,
        }
        if session_id is not None:
            attributes["hark.session_id"] = session_id
        if transport is not None:
            attributes["hark.transport"] = transport
        if timings.e2a_ms is not None:
            attributes["hark.e2a_ms"] = timings.e2a_ms
        if timings.v2v_ms is not None:
            attributes["hark.v2v_ms"] = timings.v2v_ms
        root = self._tracer.start_span("turn", attributes=attributes, start_time=ns(min(moments)))
        context = self._set_span_in_context(root)

        def child(name: str, start: float, end: float) -> None:
            span = self._tracer.start_span(name, context=context, start_time=ns(start))
            span.end(end_time=ns(end))

        if timings.last_voiced is not None and timings.turn_end is not None:
            child("end_of_turn", timings.last_voiced, timings.turn_end)
        boundary = timings.turn_end if timings.turn_end is not None else min(moments)
        for stage, at in marks:
            # Work done speculatively, before the turn ended, is a span ending where it did.
            child(stage, min(boundary, at), at)
            boundary = max(boundary, at)
        root.end(end_time=ns(max(moments)))

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is queued now; True when it all went."""
        return bool(self._provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        """Export what is queued and stop the exporter's thread."""
        self._provider.shutdown()

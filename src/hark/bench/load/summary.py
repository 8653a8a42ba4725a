"""The result of a ``hark bench load`` run: the JSON report, its verdict and its summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hark import __version__
from hark.bench.load.config import LoadConfig
from hark.bench.load.results import Results
from hark.bench.load.server_metrics import Sample, quantile_ms, server_figures
from hark.bench.report import percentiles, rounded


def _distribution(values: Sequence[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        **percentiles(values, (50, 95, 99), digits=1),
        "max": rounded(max(values) if values else None),
    }


def build_report(
    config: LoadConfig,
    results: Results,
    *,
    samples: Sequence[Sample],
    timeline: list[dict[str, Any]],
    metrics_url: str,
    server_cpu: Mapping[str, Any] | None = None,
    load: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """The run as JSON: parameters, client figures, server figures, the timeline."""
    good = [s for s in samples if s.values is not None]
    server: dict[str, Any] = {"scrapes": len(good), "url": metrics_url}
    if good:
        first, last = good[0].values, good[-1].values
        assert first is not None and last is not None
        server["end"] = server_figures(last, first)
        for decision in ("speech_stopped", "speech_started"):
            server[f"vad_decision_lag_{decision}_ms"] = {
                f"p{q}": quantile_ms(
                    q, last, first, "hark_vad_decision_lag_seconds", decision=decision
                )
                for q in (50, 95, 99)
            }
        steady = [p for p in timeline if p["t_s"] >= config.ramp_s]
        for key in ("rss_mib", "open_fds"):
            series = [p[key] for p in steady if p.get(key) is not None]
            if series:
                # Memory settles while the first calls fill up; a leak shows as growth over
                # the second half.
                server[f"{key}_steady"] = {
                    "first": series[0],
                    "mid": series[len(series) // 2],
                    "last": series[-1],
                    "min": min(series),
                    "max": max(series),
                }
    elif samples:
        server["error"] = samples[-1].error
    if server_cpu is not None:
        server["cpu"] = dict(server_cpu)
    failed_calls = sum(results.failures.values())
    return {
        "benchmark": "load",
        "hark_version": __version__,
        "parameters": config.parameters(),
        "load_average_1m": dict(load or {}),
        "client": {
            "calls_started": results.calls_started,
            "calls_completed": results.calls_completed,
            "calls_failed": failed_calls,
            "failures": dict(results.failures),
            "errors": dict(results.errors),
            "questions": results.questions,
            "turns_expected": results.turns_expected,
            "turns_detected": results.turns_detected,
            "missed_turns": results.missed_turns,
            "responses": dict(results.responses),
            "vad_decision_lag_ms": _distribution([lag for _, lag in results.vad_lag]),
            "speech_end_lag_ms": _distribution([lag for _, lag in results.speech_end_lag]),
            "transcripts": results.transcripts,
            "e2a_ms": _distribution([e2a for _, e2a in results.e2a]),
            "v2v_ms": _distribution(results.v2v),
            "server_e2a_ms": _distribution(results.server_e2a),
            "server_v2v_ms": _distribution(results.server_v2v),
            "send_lag_ms": {
                "p50": results.send_lag_percentile(50),
                "p99": results.send_lag_percentile(99),
                "max": round(results.send_lag_max, 1),
            },
        },
        "server": server,
        "timeline": timeline,
    }


def passed(report: Mapping[str, Any]) -> bool:
    """No failed call and no missed turn."""
    client = report["client"]
    return bool(client["calls_failed"] == 0 and client["missed_turns"] == 0)


def format_summary(report: Mapping[str, Any]) -> str:
    """The report for people: a few lines."""
    p = report["parameters"]
    c = report["client"]
    s = report["server"]

    def dist(d: Mapping[str, Any]) -> str:
        if not d["count"]:
            return "none"
        return f"p50 {d['p50']}  p95 {d['p95']}  p99 {d['p99']}  max {d['max']} ms (n={d['count']})"

    lines = [
        f"hark bench load: {p['sessions']} callers, ramp {p['ramp_s']:g} s, "
        f"then {p['duration_s']:g} s, {p['chunk_ms']} ms chunks, {p['url']}",
        f"calls: {c['calls_started']} started, {c['calls_completed']} completed, "
        f"{c['calls_failed']} failed {c['failures'] or ''}",
        f"turns: {c['questions']} questions asked, {c['turns_expected']} due, "
        f"{c['turns_detected']} detected, {c['missed_turns']} missed; responses {c['responses']}",
        f"VAD decision lag: {dist(c['vad_decision_lag_ms'])}",
        f"speech end lag:   {dist(c['speech_end_lag_ms'])}",
        f"E2A (client):     {dist(c['e2a_ms'])}",
        f"V2V (client):     {dist(c['v2v_ms'])}",
        *([f"transcripts completed: {c['transcripts']}"] if p.get("transcribe") else []),
        f"generator send lag: p50 {c['send_lag_ms']['p50']}  p99 {c['send_lag_ms']['p99']}  "
        f"max {c['send_lag_ms']['max']} ms",
    ]
    end = s.get("end")
    if end:
        lines.append(
            f"server: VAD chunks {end['vad_chunks']} ({end['vad_chunks_late']} late), "
            f"audio dropped {end['audio_dropped']}, errors {end['errors']}, "
            f"mean batch {end.get('batch_mean')}, loop lag p99 {end.get('loop_lag_p99_ms')} ms"
        )
        stopped = s.get("vad_decision_lag_speech_stopped_ms", {})
        if stopped.get("p99") is not None:
            lines.append(
                f"server VAD decision lag (speech_stopped): p50 {stopped['p50']}  "
                f"p99 {stopped['p99']} ms"
            )
        for key, unit in (("rss_mib", "MiB"), ("open_fds", "")):
            steady = s.get(f"{key}_steady")
            if steady:
                lines.append(
                    f"{key} after the ramp: {steady['first']} → {steady['last']} {unit} "
                    f"(min {steady['min']}, max {steady['max']}); second half "
                    f"{steady['mid']} → {steady['last']}"
                )
    elif "error" in s:
        lines.append(f"server /metrics unavailable: {s['error']}")
    cpu = s.get("cpu")
    if cpu:
        lines.append(
            f"server CPU after the ramp: {cpu['cores']} cores, "
            f"{cpu['ms_per_session_second']} ms per session-second"
        )
    load = report.get("load_average_1m", {})
    lines.append(f"load average (1 min): {load.get('before')} before, {load.get('after')} after")
    lines.append("PASS" if passed(report) else "FAIL")
    return "\n".join(lines)

"""The benches an A/B run can take, how each is run, and the figures it takes from each one's
JSON report.

Each bench but ``relay`` is a client (``hark bench …`` from B's environment) against a
``hark serve`` of the commit measured; ``relay`` starts its own relay process from the code
it runs in, so it is run from each commit's own environment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hark.bench.ab.table import Figure

# How long a serve + bench run may take before it is given up as n/a.
TIMEOUT_S = 1800.0
QUICK_TIMEOUT_S = 300.0
# The SIP server's options; a commit whose `hark serve` lacks one of them has no SIP bench.
SIP_SERVE_OPTIONS = ("--sip-host", "--sip-port", "--sip-advertise-ip", "--rtp-ports")


@dataclass(frozen=True)
class Settings:
    """What the benches are asked to do, from the command line."""

    quick: bool = False
    # hark bench load: callers at once, seconds after the ramp, ms of audio per append.
    sessions: int | None = None
    duration_s: float | None = None
    chunk_ms: int = 100
    # hark bench latency: questions per run.
    turns: int | None = None

    @property
    def load_sessions(self) -> int:
        """Callers of ``hark bench load``: 200 (``--quick``: 20) unless told."""
        return self.sessions if self.sessions is not None else (20 if self.quick else 200)

    @property
    def load_duration_s(self) -> float:
        """Seconds of ``hark bench load`` after its ramp: 60 (``--quick``: 10) unless told."""
        if self.duration_s is not None:
            return self.duration_s
        return 10.0 if self.quick else 60.0

    @property
    def load_ramp_s(self) -> float:
        """The ramp: a caller every 0.11 s, as the documented 200 callers in 22 s."""
        return float(max(2, round(self.load_sessions * 0.11)))

    @property
    def latency_turns(self) -> int:
        """Questions of ``hark bench latency``: 20 (``--quick``: 4) unless told."""
        return self.turns if self.turns is not None else (4 if self.quick else 20)

    @property
    def timeout_s(self) -> float:
        """How long one run may take."""
        return QUICK_TIMEOUT_S if self.quick else TIMEOUT_S


@dataclass(frozen=True)
class Server:
    """The ``hark serve`` a client run talks to."""

    port: int
    pid: int
    sip_port: int | None = None

    @property
    def ws(self) -> str:
        """Its WebSocket root."""
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        """Its HTTP root."""
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Bench:
    """One bench of an A/B run."""

    name: str
    # The `hark bench` subcommand.
    command: str
    summary: str
    figures: tuple[Figure, ...]
    # `hark serve`'s engines; None: the bench starts what it measures itself (relay).
    engines: str | None
    # Server on the server CPU and client on the client CPU (the capacity benches); the
    # latency benches, whose models use both cores, and relay, which pins its own relay
    # process, run unpinned.
    pinned: bool

    @property
    def needs_server(self) -> bool:
        """Whether the run starts a ``hark serve`` for the bench."""
        return self.engines is not None

    @property
    def own_client(self) -> bool:
        """Whether each commit runs its own bench code (the relay bench measures it)."""
        return not self.needs_server


def _ms(key: str, label: str, floor: float, better: str = "lower") -> Figure:
    return Figure(key, label, "ms", "lower" if better == "lower" else "higher", floor)


def _latency(vad: str, label: str) -> Bench:
    name = f"latency-{vad}"
    return Bench(
        name=name,
        command="latency",
        summary=f"hark bench latency --vad {vad}: V2V and E2A, embedded models",
        figures=(
            _ms(f"{name}.v2v_p50", f"{label}: V2V p50", 20),
            _ms(f"{name}.v2v_p95", f"{label}: V2V p95", 20),
            _ms(f"{name}.e2a_p50", f"{label}: E2A p50", 20),
            _ms(f"{name}.e2a_p95", f"{label}: E2A p95", 20),
            Figure(f"{name}.failed", f"{label}: turns not answered", "", "lower"),
        ),
        engines="embedded",
        pinned=False,
    )


def _overhead(name: str, summary: str, *figures: Figure) -> Bench:
    """A bench of the server's own cost (fake engines, pinned), run by ``hark bench <name>``."""
    return Bench(name, name, summary, figures, engines="fake", pinned=True)


def _capacity(name: str, knee: str, *setup: Figure) -> Bench:
    """A ``--capacity`` bench: calls carried while ``knee`` holds, the server's CPU per call
    there, the ``setup`` timings, calls that failed to set up."""
    return _overhead(
        name,
        f"hark bench {name} --capacity, fake engines",
        Figure(f"{name}.calls", f"{name}: calls carried ({knee})", "", "higher"),
        _ms(f"{name}.cpu_per_call_s", f"{name}: server CPU per call-second at the knee", 0.3),
        *setup,
        Figure(f"{name}.failures", f"{name}: calls failed to set up", "", "lower"),
    )


BENCHES: dict[str, Bench] = {
    bench.name: bench
    for bench in (
        _latency("server", "latency server_vad 500 ms"),
        _latency("semantic", "latency semantic_vad"),
        _overhead(
            "load",
            "hark bench load at a fixed number of callers, fake engines",
            _ms("load.vad_lag_p50", "load: VAD decision lag p50 (callers)", 2),
            _ms("load.vad_lag_p99", "load: VAD decision lag p99 (callers)", 5),
            _ms("load.server_stopped_p99", "load: speech_stopped decision p99 (server)", 5),
            _ms("load.loop_lag_p99", "load: server event loop lag p99", 2),
            _ms("load.cpu_per_session_s", "load: server CPU per session-second", 0.1),
            Figure("load.failures", "load: failed calls + missed turns", "", "lower"),
        ),
        _capacity(
            "webrtc",
            "p99 lateness ≤ 20 ms",
            _ms("webrtc.first_audio_p50", "webrtc: POST → first reply audio p50", 5),
            _ms("webrtc.answer_p50", "webrtc: POST → SDP answer p50", 2),
        ),
        _capacity(
            "sip", "p99 jitter ≤ 10 ms", _ms("sip.invite_200_p50", "sip: INVITE → 200 OK p50", 0.5)
        ),
        Bench(
            name="relay",
            command="relay",
            summary="hark bench relay: datagrams per core, latency added",
            figures=(
                Figure("relay.pps_per_core", "relay: datagrams/s per core", "", "higher"),
                Figure("relay.added_p50", "relay: round trip added p50", "µs", "lower", 10),
                Figure("relay.added_p99", "relay: round trip added p99", "µs", "lower", 20),
            ),
            engines=None,
            pinned=False,
        ),
    )
}
DEFAULT_BENCHES = tuple(BENCHES)


def serve_arguments(bench: Bench, port: int, sip_port: int | None) -> list[str]:
    """``hark serve``'s arguments for ``bench`` (a commit's server may know only some of the
    optional ones: see ``known_arguments``)."""
    assert bench.engines is not None
    arguments = ["--host", "127.0.0.1", "--port", str(port), "--engines", bench.engines]
    arguments += ["--rtc-port", "0"]
    if sip_port is None:
        arguments.append("--no-sip")
    else:
        arguments += ["--sip-host", "127.0.0.1", "--sip-port", str(sip_port)]
        arguments += ["--sip-advertise-ip", "127.0.0.1", "--rtp-ports", "0"]
        # The bench calls from one address, far faster than a stranger may (10 a second).
        arguments += ["--sip-invite-rate", "100000"]
    return arguments


# Options of ``serve_arguments`` that an older ``hark serve`` may lack: a WebRTC port, SIP to
# turn off, a limit on INVITEs.
_OPTIONAL_WITH_VALUE = ("--rtc-port", "--sip-invite-rate")
_OPTIONAL_FLAGS = ("--no-sip",)


def known_arguments(arguments: list[str], help_text: str) -> list[str]:
    """``arguments`` without the optional ones a commit's ``hark serve --help`` does not list
    (an older server has no WebRTC port, no SIP to turn off, no INVITE rate)."""
    kept: list[str] = []
    rest = iter(arguments)
    for argument in rest:
        if argument in _OPTIONAL_WITH_VALUE and argument not in help_text:
            next(rest, None)  # and its value
        elif argument not in _OPTIONAL_FLAGS or argument in help_text:
            kept.append(argument)
    return kept


def client_arguments(bench: Bench, settings: Settings, server: Server | None) -> list[str]:
    """``hark bench <command>``'s arguments, without ``--json``."""
    quick = settings.quick
    if bench.command == "relay":
        return ["--seconds", "2", "--pings", "500"] if quick else []
    assert server is not None
    if bench.command == "latency":
        vad = bench.name.removeprefix("latency-")
        arguments = ["--url", server.ws, "--turns", str(settings.latency_turns), "--vad", vad]
        return arguments + (["--silence-ms", "500"] if vad == "server" else [])
    if bench.command == "load":
        return [
            "--url", server.ws,
            "--sessions", str(settings.load_sessions),
            "--ramp", f"{settings.load_ramp_s:g}",
            "--duration", f"{settings.load_duration_s:g}",
            "--chunk-ms", str(settings.chunk_ms),
            "--quiet",
        ]  # fmt: skip
    if bench.command == "webrtc":
        arguments = ["--url", server.http, "--capacity", "--server-pid", str(server.pid)]
        if quick:
            return [*arguments, "--calls", "5", "--step", "8", "--max-calls", "24", "--hold", "3"]
        return [*arguments, "--calls", "20", "--step", "4"]
    if bench.command == "sip":
        assert server.sip_port is not None
        arguments = ["--sip", f"127.0.0.1:{server.sip_port}", "--capacity"]
        arguments += ["--server-pid", str(server.pid)]
        if quick:
            return [*arguments, "--calls", "10", "--step", "20", "--max-calls", "40", "--hold", "3"]
        return [*arguments, "--calls", "50", "--step", "20", "--max-calls", "260", "--hold", "5"]
    raise ValueError(f"no such bench: {bench.name}")


def _get(report: Mapping[str, Any], *path: str) -> float | None:
    """The number at ``path`` in ``report``; None when absent, null or NaN."""
    value: Any = report
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


def _knee(steps: Any, calls: float | None, key: str) -> float | None:
    """``key`` of the capacity step at ``calls`` (the figure's step)."""
    if calls is None or not isinstance(steps, list):
        return None
    for step in steps:
        if isinstance(step, Mapping) and step.get("calls") == calls:
            return _get(step, key)
    return None


def _capacity_figures(
    name: str, report: Mapping[str, Any], cpu_key: str, **setup: float | None
) -> dict[str, float | None]:
    """The figures of a ``_capacity`` bench's report: the server's ``cpu_key`` at the step of
    the calls carried, and the ``setup`` ones (named without the ``name.``)."""
    calls = _get(report, "capacity", "calls_carried")
    steps = report.get("capacity", {}).get("steps")
    return {
        f"{name}.calls": calls,
        f"{name}.cpu_per_call_s": _knee(steps, calls, cpu_key),
        **{f"{name}.{key}": value for key, value in setup.items()},
        f"{name}.failures": _get(report, "setup", "failures"),
    }


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def extract(
    bench: Bench, report: Mapping[str, Any], settings: Settings, server_cpu_s: float | None
) -> dict[str, float | None]:
    """The figures of ``bench`` from its JSON ``report``; ``server_cpu_s``: the CPU time the
    server used over the run, where the A/B run measured it."""
    name = bench.name
    if bench.command == "latency":
        summary = report.get("summary", {})
        return {
            f"{name}.v2v_p50": _get(summary, "v2v_ms", "p50"),
            f"{name}.v2v_p95": _get(summary, "v2v_ms", "p95"),
            f"{name}.e2a_p50": _get(summary, "e2a_ms", "p50"),
            f"{name}.e2a_p95": _get(summary, "e2a_ms", "p95"),
            f"{name}.failed": _get(summary, "failed"),
        }
    if bench.command == "load":
        client = report.get("client", {})
        session_seconds = settings.load_sessions * (
            settings.load_duration_s + settings.load_ramp_s / 2
        )
        return {
            "load.vad_lag_p50": _get(client, "vad_decision_lag_ms", "p50"),
            "load.vad_lag_p99": _get(client, "vad_decision_lag_ms", "p99"),
            "load.server_stopped_p99": _get(
                report, "server", "vad_decision_lag_speech_stopped_ms", "p99"
            ),
            "load.loop_lag_p99": _get(report, "server", "end", "loop_lag_p99_ms"),
            "load.cpu_per_session_s": (
                None if server_cpu_s is None else server_cpu_s * 1000 / session_seconds
            ),
            "load.failures": _sum(_get(client, "calls_failed"), _get(client, "missed_turns")),
        }
    if bench.command == "webrtc":
        return _capacity_figures(
            "webrtc",
            report,
            "server_ms_per_call_second",
            first_audio_p50=_get(report, "setup", "percentiles", "first_audio_ms", "p50"),
            answer_p50=_get(report, "setup", "percentiles", "answer_ms", "p50"),
        )
    if bench.command == "sip":
        return _capacity_figures(
            "sip",
            report,
            "server_cpu_ms_per_call_s",
            invite_200_p50=_get(report, "setup", "invite_to_200_ms", "p50"),
        )
    if bench.command == "relay":
        return {
            "relay.pps_per_core": _get(report, "pps_per_core"),
            "relay.added_p50": _get(report, "round_trip_us", "added", "p50"),
            "relay.added_p99": _get(report, "round_trip_us", "added", "p99"),
        }
    raise ValueError(f"no such bench: {bench.name}")

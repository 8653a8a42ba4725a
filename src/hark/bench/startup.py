"""``hark bench startup``: how long each ``hark`` command takes from exec until it does its
work: the time a restart costs (a relay that crashed, a worker started again, a rollout).

Each command is started once unmeasured (to warm the caches), then ``--runs`` times, one
run at a time, each timed from just before the exec until:

- ``hark --help``, ``hark serve --help``, ``hark relay --help``: it exits;
- ``hark relay``: it forwards its first datagram. The bench registers a worker of its own
  (a UDP socket) in the Redis of ``--redis-url`` and sends a STUN binding request, with a
  routing hint signed for that worker, to the relay's port every 5 ms; the clock stops when
  one reaches the worker. Without a Redis URL the relay is left out;
- ``hark serve --engines fake``: ``/readyz`` answers 200 (asked every 5 ms). The fake
  engines load only the VAD model, so this is the server's own start-up.

Each run also reports the CPU seconds the command's processes had used by then, which
other work on the machine stretches less than the wall time. Everything runs on loopback,
on free ports, without the caller's ``HARK_*`` variables. The bench contacts only the
processes it starts and the Redis it is given, where it leaves nothing behind (the worker
it registered and the relay's flows are deleted after each run).
``--hark`` names the command that runs hark, e.g. another checkout's code for an A/B:
``--hark "env PYTHONPATH=/tmp/base/src hark"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import secrets
import select
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hark.bench.command import Bench, Result, config_from
from hark.bench.report import BenchError, cpu_seconds_if_running, load_average
from hark.config.options import BenchOption

# Bounds a hang, never what is measured.
LIMIT_S = 120.0
POLL_S = 0.005
STOP_S = 20.0


OPTIONS: tuple[BenchOption | str, ...] = (
    BenchOption("runs", "starts of each command (default 5)", int, 5),
    BenchOption(
        "redis_url",
        "a Redis for the relay's runs (default $HARK_REDIS_URL; without one the relay "
        "is left out). A scratch database is best: the bench registers a worker there for "
        "the time of each run",
        str,
        os.environ.get("HARK_REDIS_URL"),
        metavar="URL",
    ),
    BenchOption(
        "hark",
        "the command that runs hark, split like a shell would (default: the hark beside "
        "this Python, else python -m hark.cli)",
        metavar="COMMAND",
    ),
    "json",
)


@dataclass(frozen=True)
class StartupBenchConfig:
    """What ``hark bench startup`` measures: its options."""

    hark: tuple[str, ...]
    runs: int
    redis_url: str | None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> StartupBenchConfig:
        """The config of the parsed options; ``BenchError`` when ``--runs`` is below 1."""
        hark = shlex.split(options["hark"]) if options.get("hark") else default_hark()
        config = config_from(cls, options, hark=tuple(hark))
        if config.runs < 1:
            raise BenchError("--runs must be at least 1")
        return config


def run(config: StartupBenchConfig) -> Result:
    """Start each command; the report and its summary."""
    report = measure(list(config.hark), runs=config.runs, redis_url=config.redis_url)
    return Result(report, summary(report))


BENCH = Bench("startup", OPTIONS, StartupBenchConfig.from_options, run)
configure_parser, command = BENCH.configure_parser, BENCH.command


def default_hark() -> list[str]:
    """The ``hark`` script installed beside this interpreter, else ``python -m hark.cli``."""
    script = Path(sys.executable).with_name("hark")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hark.cli"]


def measure(hark: list[str], *, runs: int, redis_url: str | None) -> dict[str, Any]:
    """Start each command ``runs`` times; the report as a dict."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("HARK_")}
    measures: list[tuple[str, Callable[[], Timing]]] = [
        ("hark --help", lambda: until_exit([*hark, "--help"], env)),
        ("hark serve --help", lambda: until_exit([*hark, "serve", "--help"], env)),
        ("hark relay --help", lambda: until_exit([*hark, "relay", "--help"], env)),
    ]
    if redis_url:
        measures.append(("hark relay", lambda: until_forwarded(hark, env, redis_url)))
    measures.append(("hark serve --engines fake", lambda: until_ready(hark, env)))
    load = load_average()
    commands = {}
    for name, measure in measures:
        # One start first, not counted: it fills the page cache, and the bytecode cache
        # where Python writes one, as every start but a machine's first finds them.
        measure()
        timings = [measure() for _ in range(runs)]
        seconds = [timing.wall_s for timing in timings]
        cpu = [timing.cpu_s for timing in timings]
        commands[name] = {
            "median_s": round(statistics.median(seconds), 3),
            "min_s": round(min(seconds), 3),
            "max_s": round(max(seconds), 3),
            "runs_s": [round(s, 3) for s in seconds],
            "cpu_median_s": round(statistics.median(cpu), 3),
            "cpu_runs_s": [round(s, 3) for s in cpu],
        }
    return {
        "benchmark": "startup",
        "hark": shlex.join(hark),
        "runs": runs,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": {"before": load, "after": load_average()},
        "relay": "measured" if redis_url else "left out: no --redis-url",
        "commands": commands,
    }


def summary(report: dict[str, Any]) -> str:
    """The report for people."""
    load = report["load_average"]
    lines = [
        f"{report['hark']}: seconds from exec, median (min–max) of {report['runs']} runs, "
        f"{report['cpus']} CPUs, load average {load['before']} → {load['after']}; and the "
        "CPU seconds its processes used by then (median)",
    ]
    until = {
        "hark relay": "it forwards its first datagram",
        "hark serve --engines fake": "/readyz answers 200",
    }
    for name, figures in report["commands"].items():
        lines.append(
            f"  {name:<26} {figures['median_s']:6.2f} ({figures['min_s']:.2f}–"
            f"{figures['max_s']:.2f}), CPU {figures['cpu_median_s']:.2f}  until "
            f"{until.get(name, 'it exits')}"
        )
    if report["relay"] != "measured":
        lines.append(f"  hark relay: {report['relay']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the parts


@dataclass(frozen=True)
class Timing:
    """One start: seconds from just before the exec until the command did its work, and
    the CPU seconds its processes had used by then (which other load on the machine
    stretches less than the wall time)."""

    wall_s: float
    cpu_s: float


def until_exit(argv: Sequence[str], env: dict[str, str]) -> Timing:
    """Run ``argv`` to its end (it must exit with 0)."""
    cpu_before = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=LIMIT_S, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchError(f"{shlex.join(argv)} exited with {done.returncode}: {done.stderr!r}")
    return Timing(elapsed, _children_cpu() - cpu_before)


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _forwarded(worker: socket.socket) -> bool:
    """Whether the datagram waiting at ``worker`` is one the relay forwarded (not a hello)."""
    from hark.edge import framing

    return worker.recv(2048)[1:2] != bytes((framing.CONTROL,))


def until_forwarded(hark: list[str], env: dict[str, str], redis_url: str) -> Timing:
    """Start ``hark relay`` until it forwards a client's first datagram to a worker."""
    from aioice import stun

    from hark.cluster.redis import RedisStore
    from hark.cluster.store import WorkerInfo
    from hark.edge.relay import FLOW_KEY_PREFIX
    from hark.edge.route_hint import RouteSigner

    secret = secrets.token_hex(16)
    worker_id = "wrk_" + secrets.token_hex(6)
    with _udp() as worker, _udp() as client:
        relay_port = _free_udp_port()
        info = WorkerInfo(id=worker_id, url="http://127.0.0.1:1", media_address=_address(worker))
        flow_key = f"{FLOW_KEY_PREFIX}{_address(client)}"

        async def register() -> None:
            store = RedisStore(redis_url, secret)
            try:
                await store.heartbeat(info, LIMIT_S)
            finally:
                await store.aclose()

        async def forget() -> None:
            store = RedisStore(redis_url, secret)
            try:
                await store.remove_worker(worker_id)
                await store.client.delete(flow_key)
            finally:
                await store.aclose()

        request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
        request.attributes["USERNAME"] = f"{RouteSigner(secret, worker_id).ufrag()}:bench"
        datagram = bytes(request)
        asyncio.run(register())
        argv = [*hark, "relay", "--listen", f"127.0.0.1:{relay_port}"]
        argv += ["--internal", "127.0.0.1:0", "--log-level", "warning"]
        relay_env = {**env, "HARK_REDIS_URL": redis_url, "HARK_FLEET_SECRET": secret}
        try:
            with _started(argv, relay_env) as relay:
                while True:
                    client.sendto(datagram, ("127.0.0.1", relay_port))
                    # The relay's hello comes first; the client's datagram is what counts.
                    if select.select([worker], [], [], POLL_S)[0] and _forwarded(worker):
                        return relay.timing()
                    relay.check()
        finally:
            asyncio.run(forget())


def until_ready(hark: list[str], env: dict[str, str]) -> Timing:
    """Start ``hark serve --engines fake`` until its ``/readyz`` answers 200."""
    port = _free_tcp_port()
    argv = [*hark, "serve", "--engines", "fake", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--rtc-port", "0", "--sip-port", "0", "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}/readyz"
    with _started(argv, env) as server:
        while True:
            if _status(url) == 200:
                return server.timing()
            server.check()
            time.sleep(POLL_S)


@dataclass
class _Run:
    """A process being timed: its command, when it was started, where its output goes."""

    argv: list[str]
    process: subprocess.Popen[bytes]
    output: IO[bytes]
    start: float

    def elapsed(self) -> float:
        """Seconds since just before the exec."""
        return time.perf_counter() - self.start

    def timing(self) -> Timing:
        """The time until now, and the CPU time of the process and its children (the
        relay's forwarding processes) so far."""
        elapsed = self.elapsed()
        pids = [self.process.pid, *_children(self.process.pid)]
        return Timing(elapsed, sum(cpu_seconds_if_running(pid) or 0.0 for pid in pids))

    def check(self) -> None:
        """Raise, with the end of its output, if the process has exited or is past the
        limit."""
        exited = self.process.poll() is not None
        if not exited and self.elapsed() < LIMIT_S:
            return
        self.output.seek(0)
        said = self.output.read().decode(errors="replace")[-2000:]
        what = f"exited with {self.process.returncode}" if exited else f"took over {LIMIT_S} s"
        raise BenchError(f"{shlex.join(self.argv)} {what}: {said}")


@contextlib.contextmanager
def _started(argv: list[str], env: dict[str, str]) -> Iterator[_Run]:
    """The process started now, stopped on exit (SIGTERM, then SIGKILL)."""
    with tempfile.TemporaryFile() as output:
        start = time.perf_counter()
        process = subprocess.Popen(argv, env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            yield _Run(argv, process, output, start)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                # The command name (field 2) is in parentheses and may hold spaces.
                if int(stat.rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def _free_udp_port() -> int:
    with _udp() as sock:
        return int(sock.getsockname()[1])


def _free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

"""One bench run of an A/B sitting: a fresh ``hark serve`` of the commit measured on a free
port, the bench client against it, the server stopped; and the order of the runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hark.bench.ab.benches import (
    SIP_SERVE_OPTIONS,
    Bench,
    Server,
    Settings,
    client_arguments,
    extract,
    known_arguments,
    serve_arguments,
)
from hark.bench.ab.builds import Build, clean_environment
from hark.bench.local_server import ready

Side = Literal["A", "B"]
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
_LOG_TAIL = 1200


def schedule(rounds: int, order: Literal["abba", "abab"]) -> list[tuple[int, Side]]:
    """The runs of one bench, in the order they are made: ``(round, side)``.

    ``abba`` swaps the pair every other round (A B, B A, A B, …), so that a machine getting
    steadily faster or slower over the sitting favours neither side; ``abab`` keeps A first.
    """
    runs: list[tuple[int, Side]] = []
    for n in range(1, rounds + 1):
        pair: tuple[Side, Side] = ("B", "A") if order == "abba" and n % 2 == 0 else ("A", "B")
        runs += [(n, pair[0]), (n, pair[1])]
    return runs


@dataclass
class Run:
    """What one run of a bench on one side gave."""

    bench: str
    side: Side
    round: int
    commit: str
    # "ok", or "n/a" with the reason.
    status: str = "ok"
    reason: str | None = None
    figures: dict[str, float | None] = field(default_factory=dict)
    seconds: float = 0.0
    load_1m_before: float | None = None
    load_1m_after: float | None = None
    server_cpu_s: float | None = None
    report: str | None = None
    log: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The run as JSON-ready data."""
        return dict(vars(self))


def _load_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) of ``pid`` so far, from ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port free for ``kind`` (and, for UDP, for TCP too: SIP listens on both)."""
    while True:
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if kind == socket.SOCK_STREAM:
            return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def _pinned(cpu: int | None) -> Callable[[], None] | None:
    if cpu is None:
        return None

    def pin() -> None:
        # What `taskset -c CPU` does, in the child before it runs hark.
        os.sched_setaffinity(0, {cpu})

    return pin


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-_LOG_TAIL:].strip()


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (the server stops; SIGTERM would drain first), then SIGKILL to its group."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class NotAvailable(Exception):
    """The run cannot be made on this side: n/a, with the reason."""


@dataclass(eq=False)
class Runner:
    """Makes the runs of one sitting: A's and B's builds, the settings, where files go."""

    builds: dict[Side, Build]
    settings: Settings
    out: Path
    server_cpu: int | None = 0
    client_cpu: int | None = 1
    _help: dict[tuple[Path, str], str | None] = field(default_factory=dict, init=False)

    def help_text(self, build: Build, *command: str) -> str | None:
        """``hark COMMAND --help`` of ``build``; None when it has no such command."""
        key = (build.path, " ".join(command))
        if key not in self._help:
            done = subprocess.run(
                [str(build.hark), *command, "--help"],
                env=clean_environment(),
                capture_output=True,
                text=True,
                check=False,
            )
            self._help[key] = done.stdout if done.returncode == 0 else None
        return self._help[key]

    def run(self, bench: Bench, side: Side, round_: int) -> Run:
        """``bench`` on ``side``'s commit, once; never raises for a run that fails (n/a)."""
        build = self.builds[side]
        run = Run(bench.name, side, round_, build.commit.sha, load_1m_before=_load_1m())
        started = time.monotonic()
        try:
            self._run(bench, side, round_, run)
        except NotAvailable as reason:
            run.status, run.reason = "n/a", str(reason)
        run.seconds = round(time.monotonic() - started, 1)
        run.load_1m_after = _load_1m()
        return run

    def _run(self, bench: Bench, side: Side, round_: int, run: Run) -> None:
        build = self.builds[side]
        # The client is B's (the newer bench) against either server, so that only the
        # server differs; a bench that measures its own code runs from its own commit.
        client = build if bench.own_client else self.builds["B"]
        for who, one in (("this commit", build), ("B's client", client)):
            if self.help_text(one, "bench", bench.command) is None:
                raise NotAvailable(f"no `hark bench {bench.command}` in {who}")
        stem = self.out / f"{bench.name}-r{round_}-{side}"
        report_path = stem.with_suffix(".json")
        run.report, run.log = str(report_path), str(stem.with_suffix(".log"))
        with self._server(bench, build, Path(f"{stem}.server.log")) as server:
            command = [str(client.hark), "bench", bench.command]
            command += client_arguments(bench, self.settings, server)
            command += ["--json", str(report_path)]
            cpu_before = None if server is None else _cpu_seconds(server.pid)
            code = self._client(command, Path(run.log), bench.pinned)
            if server is not None and cpu_before is not None:
                cpu_after = _cpu_seconds(server.pid)
                if cpu_after is not None:
                    run.server_cpu_s = round(cpu_after - cpu_before, 3)
        if code is None:
            raise NotAvailable(f"the bench ran past {self.settings.timeout_s:g} s")
        try:
            report = json.loads(report_path.read_text())
        except (OSError, ValueError):
            raise NotAvailable(
                f"the bench exited with status {code} and no report: {_tail(Path(run.log))}"
            ) from None
        run.figures = extract(bench, report, self.settings, run.server_cpu_s)

    def _client(self, command: list[str], log: Path, pinned: bool) -> int | None:
        """Run the bench; its exit status, or None when it ran out of time."""
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=clean_environment(),
                preexec_fn=_pinned(self.client_cpu if pinned else None),
                start_new_session=True,
            )
            try:
                return process.wait(timeout=self.settings.timeout_s)
            except subprocess.TimeoutExpired:
                return None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    @contextlib.contextmanager
    def _server(self, bench: Bench, build: Build, log: Path) -> Iterator[Server | None]:
        """``hark serve`` of ``build`` for ``bench``, ready; None for a bench without one."""
        if not bench.needs_server:
            yield None
            return
        help_text = self.help_text(build, "serve") or ""
        sip_port = None
        if bench.command == "sip":
            missing = [o for o in SIP_SERVE_OPTIONS if o not in help_text]
            if missing:
                raise NotAvailable(f"this commit's hark serve has no {', '.join(missing)}")
            sip_port = free_port(socket.SOCK_DGRAM)
        port = free_port()
        arguments = known_arguments(serve_arguments(bench, port, sip_port), help_text)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(build.hark), "serve", *arguments],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=clean_environment(),
                preexec_fn=_pinned(self.server_cpu if bench.pinned else None),
                start_new_session=True,
            )
            try:
                deadline = time.monotonic() + READY_TIMEOUT_S
                while not ready(port):
                    if process.poll() is not None:
                        raise NotAvailable(
                            f"hark serve exited with status {process.returncode}: {_tail(log)}"
                        )
                    if time.monotonic() > deadline:
                        raise NotAvailable(f"hark serve not ready in {READY_TIMEOUT_S:g} s")
                    time.sleep(0.2)
                yield Server(port, process.pid, sip_port)
            finally:
                _stop(process)

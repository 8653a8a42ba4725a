"""A ``hark serve`` of the bench's own, on a free loopback port, for benches run without
``--url``."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence

from hark.bench.report import BenchError


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def local_server(
    engines: str | None, ready_s: float = 300, args: Sequence[str] = ()
) -> Iterator[tuple[str, int]]:
    """``hark serve`` on a free loopback port: ``(its WebSocket root, its pid)`` once it is
    ready; stopped on leaving. ``args`` are more of its options. Its log goes to stderr."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "hark.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--rtc-port",
        "0",
        # The bench makes no phone calls: no SIP service, and no SIP port to contend for.
        "--no-sip",
    ]
    if engines is not None:
        command += ["--engines", engines]
    command += args
    process = subprocess.Popen(command, stdout=sys.stderr)
    try:
        deadline = time.monotonic() + ready_s
        while not ready(port):
            if process.poll() is not None:
                raise BenchError(f"hark serve exited with status {process.returncode}")
            if time.monotonic() > deadline:
                raise BenchError(f"hark serve was not ready within {ready_s:g} s")
            time.sleep(0.2)
        yield f"ws://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def ready(port: int) -> bool:
    """Whether the server on this machine's ``port`` answers ``/readyz`` with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False

"""Starting a real `hark serve` process for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def hark_serve(
    args: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    without: tuple[str, ...] = (),
    ready_s: float = 300,
) -> Iterator[int]:
    """`hark serve ARGS` on a free loopback port (and any free UDP port for WebRTC), yielding
    the port once ``/readyz`` answers 200; the server's output goes to ``log``. ``env`` adds
    to the environment, ``without`` removes variables from it."""
    port = free_port()
    command = [sys.executable, "-m", "hark.cli", "serve", "--port", str(port), "--rtc-port", "0"]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*command, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in without},
        )
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"hark serve exited: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"hark serve never became ready: {log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()

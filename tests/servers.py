"""Starting a real `hark serve` process for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.net import free_port


class HarkProcess:
    """A `hark serve` process the test can signal, kill and restart."""

    def __init__(
        self,
        args: list[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        without: tuple[str, ...] = (),
        host: str = "127.0.0.1",
        netns: str | None = None,
        port: int | None = None,
    ) -> None:
        self.args = args
        self.log = log
        self.env = env or {}
        self.without = without
        self.host = host
        self.netns = netns
        self.port = port if port is not None else free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's HTTP base URL."""
        return f"http://{self.host}:{self.port}"

    def start(self, ready_s: float = 300) -> HarkProcess:
        """Start the server and wait until ``/readyz`` answers 200 (stopping it if it never
        does, so that a failed start leaves no process behind)."""
        command = [
            sys.executable,
            "-m",
            "hark.cli",
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--rtc-port",
            "0",
            # The SIP port too: test servers side by side must not fight over 5060.
            "--sip-port",
            "0",
            *self.args,
        ]
        if self.netns is not None:
            command = ["ip", "netns", "exec", self.netns, *command]
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in {**os.environ, **self.env}.items() if k not in self.without},
            )
        try:
            self.wait_ready(ready_s)
        except BaseException:
            self.stop()
            raise
        return self

    def readyz(self) -> int | None:
        """The status ``/readyz`` answers now, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def wait_ready(self, ready_s: float = 300) -> None:
        """Until ``/readyz`` answers 200; fails if the process exits or never gets there."""
        assert self.proc is not None
        deadline = time.monotonic() + ready_s
        while self.readyz() != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hark serve exited: {self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"hark serve never became ready: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the server (through ``ip netns exec``, which execs it)."""
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """The exit status, once the process has ended."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Terminate (and, if it lingers, kill) the server."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> HarkProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Stage timeouts for a server on the embedded models in tests. The defaults are for engines
# that stalled; the embedded models on a starved test machine are only slow (a first token
# took 19 s, and once more than 30 s, in a fresh-clone run beside a CPU hog), and the tests
# are about what comes, not when.
PATIENT = [
    "--llm-first-token-timeout",
    "300",
    "--llm-token-timeout",
    "120",
    "--tts-clause-timeout",
    "300",
    "--asr-timeout",
    "300",
]


@contextlib.contextmanager
def hark_serve(
    args: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    without: tuple[str, ...] = (),
    ready_s: float = 300,
) -> Iterator[int]:
    """`hark serve ARGS` on a free loopback port (and any free UDP port for WebRTC), yielding
    the port once ``/readyz`` answers 200; the server's output goes to ``log`` (started
    afresh). ``env`` adds to the environment, ``without`` removes variables from it."""
    log.write_text("")
    server = HarkProcess(args, log, env=env, without=without).start(ready_s)
    try:
        yield server.port
    finally:
        server.stop()

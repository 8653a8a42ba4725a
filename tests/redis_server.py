"""A real ``redis-server`` (Debian's package) that a test starts, stops and restarts itself."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

from tests.servers import free_port

READY_TIMEOUT_S = 30.0


class RedisServerMissingError(RuntimeError):
    """``redis-server`` is not installed."""


class RedisServer:
    """``redis-server`` on a free port, without persistence; a context manager.

    ``restart()`` stops it and starts it again on the same port, empty, as a Redis that
    crashed and came back would be. ``password`` makes it require one (``--requirepass``);
    ``host`` is the address it listens on (loopback, or a test's own bridge address, where
    Redis's protected mode wants a password).
    """

    def __init__(self, workdir: Path, password: str | None = None, host: str = "127.0.0.1") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerMissingError(
                "redis-server is not installed: the cluster tests need a real Redis "
                "(scripts/test installs Debian's redis-server; or apt-get install redis-server)"
            )
        self.binary = binary
        self.workdir = workdir
        self.password = password
        self.host = host
        self.port = free_port()
        self.log = workdir / f"redis-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]HOST:PORT/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
        ]
        if self.password:
            command += ["--requirepass", self.password]
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._pings():
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server never answered: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait until it is gone."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """Stop and start again on the same port (with nothing in it)."""
        self.stop()
        self.start()

    def _pings(self) -> bool:
        """Whether the server answers PING (with +PONG, or -NOAUTH when it wants a password:
        either way it is up)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        return reply.startswith((b"+PONG", b"-NOAUTH"))

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def running_redis(
    workdir: Path, password: str | None = None, host: str = "127.0.0.1"
) -> Iterator[RedisServer]:
    """A started ``RedisServer``, stopped on exit. A missing redis-server fails the test (it
    is never skipped)."""
    try:
        server = RedisServer(workdir, password=password, host=host)
    except RedisServerMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    with server:
        yield server


@contextlib.contextmanager
def redis_on(host: str, workdir: Path) -> Iterator[str]:
    """The URL of a real redis-server on ``host`` (a test's own bridge address) with a random
    password: off loopback Redis wants one (its protected mode), as it should."""
    with running_redis(workdir, password=secrets.token_hex(8), host=host) as server:
        yield server.url

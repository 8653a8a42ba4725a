"""A real ``redis-server`` (Debian's package) that a test starts, stops and restarts itself:
plain, over TLS, as a replica, or as a Sentinel (``redis-server --sentinel``)."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pytest

from tests.servers import free_port

READY_TIMEOUT_S = 30.0


class RedisServerMissingError(RuntimeError):
    """``redis-server`` is not installed."""


@dataclass(frozen=True)
class RedisTls:
    """TLS for a test's Redis: its certificate chain and key, and the CA that signed them
    (which the clients trust)."""

    cert: Path
    key: Path
    ca: Path


class RedisServer:
    """``redis-server`` on a free port, without persistence; a context manager.

    ``restart()`` stops it and starts it again on the same port, empty, as a Redis that
    crashed and came back would be. ``password`` makes it require one (``--requirepass``);
    ``host`` is the address it listens on (loopback, or a test's own bridge address, where
    Redis's protected mode wants a password). ``tls`` serves TLS only, on the same port;
    ``args`` adds settings (``--replicaof``, ``--user``…).
    """

    def __init__(
        self,
        workdir: Path,
        password: str | None = None,
        host: str = "127.0.0.1",
        *,
        tls: RedisTls | None = None,
        args: Sequence[str] = (),
    ) -> None:
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
        self.tls = tls
        self.args = list(args)
        self.port = free_port()
        self.log = workdir / f"redis-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]HOST:PORT/0`` (``rediss://…?ssl_ca_certs=CA`` with TLS)."""
        auth = f":{self.password}@" if self.password else ""
        if self.tls is not None:
            return f"rediss://{auth}{self.host}:{self.port}/0?ssl_ca_certs={self.tls.ca}"
        return f"redis://{auth}{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        """The command line that starts this server."""
        command = [self.binary, "--bind", self.host, "--dir", str(self.workdir)]
        if self.tls is None:
            command += ["--port", str(self.port)]
        else:
            command += [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.tls.cert),
                "--tls-key-file",
                str(self.tls.key),
                "--tls-ca-cert-file",
                str(self.tls.ca),
                # Clients prove themselves with a password, not a certificate.
                "--tls-auth-clients",
                "no",
            ]
        command += ["--save", "", "--appendonly", "no"]
        if self.password:
            command += ["--requirepass", self.password]
        return command + self.args

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = self.command()
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

    def kill(self) -> None:
        """SIGKILL, as a crashed host would end it, and wait until it is gone."""
        proc, self._proc = self._proc, None
        if proc is not None:
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
            with socket.create_connection((self.host, self.port), timeout=1) as raw:
                sock = raw
                if self.tls is not None:
                    context = ssl.create_default_context(cafile=str(self.tls.ca))
                    sock = context.wrap_socket(raw, server_hostname=self.host)
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


class RedisSentinel(RedisServer):
    """A Sentinel (``redis-server CONF --sentinel``) on a free port, watching the master at
    ``master_port`` as ``master_name``, with a quorum of ``quorum``. It calls a master down
    after a second without an answer, so that a failover in a test takes seconds.
    ``auth_pass`` is the password of the Redis it watches; ``password`` its own."""

    def __init__(
        self,
        workdir: Path,
        master_port: int,
        *,
        master_name: str = "mymaster",
        quorum: int = 1,
        auth_pass: str | None = None,
        password: str | None = None,
    ) -> None:
        super().__init__(workdir, password=password)
        self.master_port = master_port
        self.master_name = master_name
        self.quorum = quorum
        self.auth_pass = auth_pass
        self.config = workdir / f"sentinel-{self.port}.conf"

    def command(self) -> list[str]:
        """``redis-server CONF --sentinel``; the configuration is written once (Sentinel
        rewrites it with what it learns, which a restart keeps)."""
        if not self.config.exists():
            name = self.master_name
            lines = [
                f"port {self.port}",
                f"bind {self.host}",
                f"dir {self.workdir}",
                f"sentinel monitor {name} {self.host} {self.master_port} {self.quorum}",
                f"sentinel down-after-milliseconds {name} 1000",
                f"sentinel failover-timeout {name} 10000",
            ]
            if self.auth_pass:
                lines.append(f"sentinel auth-pass {name} {self.auth_pass}")
            if self.password:
                lines.append(f"requirepass {self.password}")
            self.config.write_text("\n".join(lines) + "\n")
        return [self.binary, str(self.config), "--sentinel"]


@contextlib.contextmanager
def running_redis(
    workdir: Path,
    password: str | None = None,
    host: str = "127.0.0.1",
    *,
    tls: RedisTls | None = None,
    args: Sequence[str] = (),
) -> Iterator[RedisServer]:
    """A started ``RedisServer``, stopped on exit. A missing redis-server fails the test (it
    is never skipped)."""
    try:
        server = RedisServer(workdir, password=password, host=host, tls=tls, args=args)
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

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
import redis

from tests.helpers.net import free_port

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
    ``auth_user`` and ``auth_pass`` log it in to the Redis it watches; ``password`` is its
    own; ``tls``
    makes it speak TLS alone, to its clients and to that Redis."""

    def __init__(
        self,
        workdir: Path,
        master_port: int,
        *,
        master_name: str = "mymaster",
        quorum: int = 1,
        auth_pass: str | None = None,
        auth_user: str | None = None,
        password: str | None = None,
        tls: RedisTls | None = None,
    ) -> None:
        super().__init__(workdir, password=password, tls=tls)
        self.master_port = master_port
        self.master_name = master_name
        self.quorum = quorum
        self.auth_pass = auth_pass
        self.auth_user = auth_user
        self.config = workdir / f"sentinel-{self.port}.conf"

    def command(self) -> list[str]:
        """``redis-server CONF --sentinel``; the configuration is written once (Sentinel
        rewrites it with what it learns, which a restart keeps)."""
        if not self.config.exists():
            name = self.master_name
            if self.tls is None:
                listen = [f"port {self.port}"]
            else:
                # TLS alone, to its clients and to the Redis it watches.
                listen = [
                    "port 0",
                    f"tls-port {self.port}",
                    f"tls-cert-file {self.tls.cert}",
                    f"tls-key-file {self.tls.key}",
                    f"tls-ca-cert-file {self.tls.ca}",
                    "tls-auth-clients no",
                    "tls-replication yes",
                ]
            lines = [
                *listen,
                f"bind {self.host}",
                f"dir {self.workdir}",
                f"sentinel monitor {name} {self.host} {self.master_port} {self.quorum}",
                f"sentinel down-after-milliseconds {name} 1000",
                f"sentinel failover-timeout {name} 10000",
            ]
            if self.auth_user:
                lines.append(f"sentinel auth-user {name} {self.auth_user}")
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


class RedisWithSentinels:
    """A master, a replica and ``count`` Sentinels watching them (quorum: a majority), all
    real processes; a context manager. The master's and Sentinels' passwords are
    ``password`` and ``sentinel_password``.

    ``failover()`` asks a Sentinel for a failover (``SENTINEL FAILOVER``) and
    ``kill_master()`` kills the master (SIGKILL); each returns once every Sentinel names the
    new master. Nothing here waits a fixed time: each step polls what the servers say,
    within ``SETTLE_S``.
    """

    SETTLE_S = 120.0
    MASTER_NAME = "mymaster"

    def __init__(
        self,
        workdir: Path,
        password: str,
        *,
        sentinel_password: str | None = None,
        count: int = 3,
    ) -> None:
        # Each may be promoted, and then its former master replicates from it: both know the
        # password (masterauth) from the start, and send a replica its first copy without
        # the default 5 s wait for more replicas to share it.
        auth = ["--masterauth", password, "--repl-diskless-sync-delay", "0"]
        self.password = password
        self.sentinel_password = sentinel_password
        self.master = RedisServer(workdir / "a", password=password, args=auth)
        self.replica = RedisServer(
            workdir / "b",
            password=password,
            args=[*auth, "--replicaof", self.master.host, str(self.master.port)],
        )
        self.nodes = [self.master, self.replica]
        self.sentinels = [
            RedisSentinel(
                workdir / f"sentinel-{i}",
                self.master.port,
                master_name=self.MASTER_NAME,
                quorum=count // 2 + 1,
                auth_pass=password,
                password=sentinel_password,
            )
            for i in range(count)
        ]

    @property
    def url(self) -> str:
        """``redis+sentinel://:PASSWORD@HOST:PORT,…/mymaster/0`` (with the Sentinels' own
        password as ``?sentinel_password=``)."""
        sentinels = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        query = f"?sentinel_password={self.sentinel_password}" if self.sentinel_password else ""
        return f"redis+sentinel://:{self.password}@{sentinels}/{self.MASTER_NAME}/0{query}"

    def start(self) -> None:
        """Start every process and wait until the Sentinels know each other and the replica
        is in sync."""
        for server in (*self.nodes, *self.sentinels):
            server.start()
        self.wait_settled()

    def stop(self) -> None:
        """Stop every process."""
        for server in (*self.sentinels, *self.nodes):
            server.stop()

    def __enter__(self) -> RedisWithSentinels:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ what they say

    def _client(self, server: RedisServer) -> redis.Redis:
        return redis.Redis(
            host=server.host, port=server.port, password=server.password, socket_timeout=5
        )

    def _ask(self, server: RedisServer, *command: str | int) -> object:
        with self._client(server) as client:
            return client.execute_command(*command)

    def master_port(self) -> int | None:
        """The master's port as every Sentinel names it, or None while they disagree."""
        ports = set()
        for sentinel in self.sentinels:
            try:
                address = self._ask(
                    sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER_NAME
                )
            except redis.RedisError:
                return None
            assert isinstance(address, list | tuple)
            ports.add(int(address[1]))
        return ports.pop() if len(ports) == 1 else None

    def master_holds(self, *keys: str) -> bool:
        """Whether the master the Sentinels name holds every one of ``keys``."""
        port = self.master_port()
        if port is None:
            return False
        try:
            with self._client(self.node(port)) as client:
                return int(client.exists(*keys)) == len(keys)
        except redis.RedisError:
            return False

    def node(self, port: int) -> RedisServer:
        """The data node on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def _settled(self) -> bool:
        """Every Sentinel names the same master, sees the other Sentinels and a replica it
        would promote; the replica has every write the master took."""
        port = self.master_port()
        if port is None:
            return False
        others = len(self.sentinels) - 1
        for sentinel in self.sentinels:
            with self._client(sentinel) as client:
                master = client.sentinel_master(self.MASTER_NAME)
                replicas = client.sentinel_slaves(self.MASTER_NAME)
            good = [
                r
                for r in replicas
                if r["master-link-status"] == "ok" and not r["is_sdown"] and not r["is_odown"]
            ]
            if (
                master["num-other-sentinels"] != others
                or not master["is_master"]
                or master["is_sdown"]
                or master["is_odown"]
                or not good
            ):
                return False
        with self._client(self.node(port)) as client:
            # The master's writes so far reached a replica: a replica has acknowledged the
            # master's offset. (Not WAIT: it waits for the writes of the connection that
            # sends it, and this one made none, so it answers at once.)
            state = client.info("replication")
            acked = [state[f"slave{i}"].get("offset", -1) for i in range(state["connected_slaves"])]
            return any(offset >= state["master_repl_offset"] for offset in acked)

    def wait_settled(self) -> None:
        """Until ``_settled``; fails after ``SETTLE_S``."""
        deadline = time.monotonic() + self.SETTLE_S
        while True:
            try:
                if self._settled():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the Sentinels never settled in {self.SETTLE_S:g} s")
            time.sleep(0.1)

    # ------------------------------------------------------------------ failures

    def failover(self) -> int:
        """``SENTINEL FAILOVER`` (retried while a Sentinel refuses it: one under way, no
        replica it would promote yet), until the Sentinels name another master, the old one
        replicating from it; the new master's port."""
        old = self.master_port()
        deadline = time.monotonic() + self.SETTLE_S
        while True:
            try:
                self._ask(self.sentinels[0], "SENTINEL", "FAILOVER", self.MASTER_NAME)
                break
            except redis.ResponseError:
                assert time.monotonic() < deadline, "no Sentinel took the failover"
                time.sleep(0.1)
        return self._new_master(old, deadline)

    def kill_master(self) -> int:
        """SIGKILL the master, and wait until the Sentinels promote the replica; its port.
        The killed one stays down, so the new master has no replica."""
        old = self.master_port()
        assert old is not None
        self.node(old).kill()
        return self._new_master(old, time.monotonic() + self.SETTLE_S, settle=False)

    def _new_master(self, old: int | None, deadline: float, *, settle: bool = True) -> int:
        while True:
            port = self.master_port()
            if port is not None and port != old:
                with self._client(self.node(port)) as client:
                    if client.info("replication")["role"] == "master":
                        break
            assert time.monotonic() < deadline, "the Sentinels never named a new master"
            time.sleep(0.1)
        if settle:
            self.wait_settled()
        return port

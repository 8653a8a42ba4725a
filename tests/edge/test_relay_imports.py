"""A real ``hark relay`` loads what forwarding needs and nothing else: its parent and each
forwarding process, asked once both processes have forwarded, hold nothing of the server,
the engines, the benches or aiortc. That is what lets a relay that crashed forward again
within a second of its restart (``hark bench startup``). And a relay that is process 1, as in
a container without an init, forwards too."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aioice import stun

from hark.cluster.redis import RedisStore
from hark.cluster.store import WorkerInfo
from hark.edge import framing
from hark.edge.route_hint import RouteSigner
from tests.modules import HEAVY, MODULES_DIR_ENV, among, ask, children, probed
from tests.redis_server import running_redis
from tests.servers import free_port

SECRET = "fleet-secret-of-the-imports-test-0123"
WORKER_ID = "wrk_00000000c0de"
FORWARDING_PROCESSES = 2
NOT_FOR_THE_RELAY = (
    *HEAVY,
    "hark.bench",
    "hark.session",
    "hark.engines",
    "hark.transports",
    "hark.server",
)
LIMIT_S = 30.0


def udp_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def free_udp_port() -> int:
    with udp_socket() as sock:
        return int(sock.getsockname()[1])


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A Redis with one worker registered, whose media port is a socket of the test."""
    with running_redis(tmp_path / "redis") as redis, udp_socket() as media:
        host, port = media.getsockname()

        async def register() -> None:
            store = RedisStore(redis.url, SECRET)
            info = WorkerInfo(
                id=WORKER_ID, url="http://127.0.0.1:1", media_address=f"{host}:{port}"
            )
            await store.heartbeat(info, 600)
            await store.aclose()

        asyncio.run(register())
        yield redis.url, media


def test_the_relay_and_its_forwarding_processes_load_nothing_of_the_rest(
    worker: tuple[str, socket.socket], tmp_path: Path
) -> None:
    redis_url, media = worker
    relay_port = free_udp_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("HARK_")}
    env |= {
        "HARK_REDIS_URL": redis_url,
        "HARK_FLEET_SECRET": SECRET,
        MODULES_DIR_ENV: str(tmp_path),
    }
    argv = ["relay", "--listen", f"127.0.0.1:{relay_port}", "--internal", "127.0.0.1:0"]
    argv += ["--workers", str(FORWARDING_PROCESSES), "--metrics-listen", f"127.0.0.1:{free_port()}"]
    log = tmp_path / "relay.log"
    with log.open("wb") as out:
        relay = subprocess.Popen(probed(argv), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # Until both processes have forwarded a client's datagram.
        forwarded(relay, relay_port, media, FORWARDING_PROCESSES, log)
        forwarding = children(relay.pid)
        assert len(forwarding) == FORWARDING_PROCESSES
        loaded = ask(tmp_path, [relay.pid, *forwarding])
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(10)
    for pid, modules in loaded.items():
        # The probe reads a relay: the parent supervises, the children forward.
        assert ("hark.edge.supervisor" if pid == relay.pid else "hark.edge.relay") in modules
        assert among(modules, NOT_FOR_THE_RELAY) == [], pid


def test_a_relay_that_is_process_one_forwards(
    worker: tuple[str, socket.socket], tmp_path: Path
) -> None:
    # A PID namespace of its own makes the relay process 1, as a container's entry point with
    # no init is: its forwarding processes' parent is then process 1 all along (they took
    # that for the sign of a dead parent and exited, every second).
    redis_url, media = worker
    relay_port = free_udp_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("HARK_")}
    env |= {"HARK_REDIS_URL": redis_url, "HARK_FLEET_SECRET": SECRET}
    argv = ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "hark.cli"]
    argv += ["relay", "--listen", f"127.0.0.1:{relay_port}", "--internal", "127.0.0.1:0"]
    argv += ["--workers", "1"]
    log = tmp_path / "relay.log"
    with log.open("wb") as out:
        relay = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        forwarded(relay, relay_port, media, 1, log)
    finally:
        # unshare passes no signal on: the relay (process 1 inside) is told itself.
        for pid in children(relay.pid):
            os.kill(pid, signal.SIGTERM)
        relay.wait(LIMIT_S)
    assert "exited" not in log.read_text()


def forwarded(
    relay: subprocess.Popen[bytes], port: int, media: socket.socket, processes: int, log: Path
) -> None:
    """Send clients' datagrams to the relay until ``processes`` of its forwarding processes
    have each passed one on to the worker's ``media`` socket."""
    request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    request.attributes["USERNAME"] = f"{RouteSigner(SECRET, WORKER_ID).ufrag()}:client"
    # Clients at many addresses: the kernel spreads them over the processes by address, and
    # each process sends to the worker from a port of its own.
    senders: set[tuple[str, int]] = set()
    deadline = time.monotonic() + LIMIT_S
    while len(senders) < processes:
        assert relay.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"forwarded by {senders}: {log.read_text()}"
        with udp_socket() as client:
            client.sendto(bytes(request), ("127.0.0.1", port))
        while select.select([media], [], [], 0.01)[0]:
            data, sender = media.recvfrom(4096)
            # A client's datagram, not the relay's hello.
            if data[1] == framing.IPV4:
                senders.add(sender)

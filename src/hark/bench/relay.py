"""``hark bench relay``: how many datagrams one core of ``hark relay`` forwards, and the
latency it adds.

The bench starts everything it measures and stops by itself: a relay process pinned to one
CPU (``--relay-cpu``), fed a fixed registry instead of Redis (the packet loop is what is
measured; Redis is only touched when flows change); an echo worker that returns every
datagram to the client it names (through the relay that brought it); and, in this process,
clients on the other CPUs. Everything is on loopback, and the clients send only to the relay
this bench started and to the echo worker it started.

1. *Latency*: ``--pings`` round trips one at a time, client → relay → echo → relay → client,
   and the same number straight to the echo worker (client → echo → client, the same
   framing work at the echo). The difference of the percentiles is what the relay adds to a
   round trip: two passes through it.
2. *Throughput*: ``--flows`` clients each set up a flow with a signed STUN binding request,
   then send ``--size``-byte datagrams in batches for ``--seconds``; the echo worker sends
   each back, so the relay forwards in both directions. Reported: datagrams forwarded per
   second (both directions), the relay process's CPU time over the same span, and so the
   datagrams per second one fully busy core carries. An Opus call is about 100 datagrams
   per second (50 each way), so that figure over 100 is the calls one core carries.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import select
import signal
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from hark.bench.command import Bench, Result, config_from
from hark.bench.report import BenchError, cpu_seconds, percentiles
from hark.config.options import BenchOption
from hark.edge import framing
from hark.edge.flows import Address
from hark.edge.mmsg import Batch, sockaddr_key
from hark.edge.relay import Counters, FlowMirror, Registry, Relay, RelayConfig
from hark.edge.route_hint import RouteSigner

WORKER_ID = "wrk_00000000bec4"
SECRET = "the-bench-relay-fleet-secret-0123"
BATCH = 32
# A packet of Opus at 24 kbit/s with RTP, SRTP and the UDP/IP overhead is about this big.
DEFAULT_SIZE = 200
CALL_PACKETS_PER_S = 100
WARM_UP_PINGS = 500


class _FixedRegistry(Registry):
    """One worker, always there: the bench measures packets, not Redis."""

    def __init__(self, workers: dict[str, Address]) -> None:
        self.workers = workers
        self.loaded = True

    async def refresh(self) -> bool:
        return True


OPTIONS: tuple[BenchOption | str, ...] = (
    BenchOption("seconds", "flood time (default 5)", float, 5.0),
    BenchOption("flows", "client flows (default 50)", int, 50),
    BenchOption("size", "datagram bytes (default 200)", int, DEFAULT_SIZE),
    BenchOption("pings", "round trips per latency path (default 2000)", int, 2000),
    BenchOption("relay_cpu", "the CPU the relay is pinned to (default 0)", int, 0),
    "json",
)


@dataclass(frozen=True)
class RelayBenchConfig:
    """What ``hark bench relay`` measures: its options."""

    seconds: float
    flows: int
    size: int
    pings: int
    relay_cpu: int

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> RelayBenchConfig:
        """The config of the parsed options; ``BenchError`` without two CPUs to run on."""
        config = config_from(cls, options)
        cpus = os.sched_getaffinity(0)
        if config.relay_cpu not in cpus or len(cpus) < 2:
            raise BenchError("needs two CPUs, --relay-cpu being one of them")
        return config


def run(config: RelayBenchConfig) -> Result:
    """Measure; the report and its summary."""
    report = measure(config)
    return Result(report, summary(report))


def measure(config: RelayBenchConfig) -> dict[str, Any]:
    """Measure; the report as a dict."""
    seconds, flows, size, pings = config.seconds, config.flows, config.size, config.pings
    relay_cpu = config.relay_cpu
    load_cpus = os.sched_getaffinity(0) - {relay_cpu}
    context = multiprocessing.get_context("fork")
    echo_end, echo_here = context.Pipe()
    echo = context.Process(target=_echo_process, args=(echo_end, load_cpus), daemon=True)
    echo.start()
    worker: Address = echo_here.recv()
    relay_end, relay_here = context.Pipe()
    relay = context.Process(target=_relay_process, args=(relay_end, worker, relay_cpu), daemon=True)
    relay.start()
    public, _internal = relay_here.recv()
    # The load runs in the calling process, which gets its CPUs back afterwards: threads it
    # starts later (a test run's models) would otherwise inherit the narrower set.
    own_cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, load_cpus)
    try:
        clients = [_client_socket() for _ in range(flows)]
        signer = RouteSigner(SECRET, WORKER_ID)
        for client in clients:
            _open_flow(client, signer, public)
        # Warm-up: first passes through new code, page faults, CPUs leaving idle states.
        _ping(clients[0], public, WARM_UP_PINGS, size)
        via_relay = _ping(clients[0], public, pings, size)
        direct = _ping(clients[0], worker, pings, size, framed_to=clients[0].getsockname())
        assert relay.pid is not None
        cpu_before = cpu_seconds(relay.pid)
        forwarded, offered, elapsed = _flood(clients, public, size, seconds)
        relay_cpu_s = cpu_seconds(relay.pid) - cpu_before
    finally:
        os.sched_setaffinity(0, own_cpus)
        assert relay.pid is not None and echo.pid is not None
        os.kill(relay.pid, signal.SIGTERM)
        counters = relay_here.recv() if relay_here.poll(5) else None
        relay.join(5)
        echo.terminate()
        echo.join(5)
    relay_pps = forwarded / elapsed
    per_core = forwarded / relay_cpu_s if relay_cpu_s > 0 else None
    added = {
        key: round((via_relay[key] or 0.0) - (direct[key] or 0.0), 1) for key in ("p50", "p99")
    }
    return {
        "datagram_bytes": size,
        "flows": flows,
        "seconds": round(elapsed, 2),
        "offered_pps": round(offered / elapsed),
        "forwarded_pps": round(relay_pps),
        "relay_cpu_busy": round(relay_cpu_s / elapsed, 3),
        "pps_per_core": round(per_core) if per_core else None,
        "calls_per_core": round(per_core / CALL_PACKETS_PER_S) if per_core else None,
        "round_trip_us": {"via_relay": via_relay, "direct": direct, "added": added},
        "relay_counters": counters,
    }


BENCH = Bench("relay", OPTIONS, RelayBenchConfig.from_options, run)
configure_parser, command = BENCH.configure_parser, BENCH.command


def summary(report: dict[str, Any]) -> str:
    """The report for people."""
    rtt = report["round_trip_us"]
    return "\n".join(
        [
            f"hark relay, {report['datagram_bytes']}-byte datagrams, {report['flows']} flows, "
            f"both directions, {report['seconds']} s:",
            f"  forwarded {report['forwarded_pps']:,} datagrams/s "
            f"(offered {report['offered_pps']:,}); relay CPU busy {report['relay_cpu_busy']:.0%}",
            f"  per core: {report['pps_per_core']:,} datagrams/s, "
            f"about {report['calls_per_core']:,} Opus calls (100 datagrams/s each)",
            f"  round trip, µs: direct p50 {rtt['direct']['p50']} p99 {rtt['direct']['p99']}; "
            f"via relay p50 {rtt['via_relay']['p50']} p99 {rtt['via_relay']['p99']}",
            f"  added by the relay (two passes): p50 {rtt['added']['p50']} µs, "
            f"p99 {rtt['added']['p99']} µs",
        ]
    )


# ---------------------------------------------------------------------------- the parts


def _relay_process(conn: Connection, worker: Address, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> None:
        relay = Relay(
            RelayConfig(
                listen=("127.0.0.1", 0),
                internal=("127.0.0.1", 0),
                fleet_secret=SECRET,
                reuse_port=False,
                # Every client of the bench is one source (loopback): no flood to limit.
                source_flow_burst=1_000_000,
            ),
            _FixedRegistry({WORKER_ID: worker}),
            FlowMirror(None, 30.0, SECRET),
            Counters(),
        )
        await relay.start()
        # What start-up made lives as long as the process: out of the collector's sight,
        # a full collection no longer walks it (tens of milliseconds with aiohttp and redis).
        gc.freeze()
        conn.send((relay.address, relay.internal_address))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await relay.stop()
        conn.send(relay.counters.nonzero())

    asyncio.run(main())


def _echo_process(conn: Connection, cpus: set[int]) -> None:
    """Send every framed datagram back where it came from (it names its client); the
    relay's hellos are for a worker to read, not to echo."""
    os.sched_setaffinity(0, cpus)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(("127.0.0.1", 0))
    conn.send(sock.getsockname())
    batch = Batch(BATCH)
    fd = sock.fileno()
    while True:
        select.select([fd], [], [])
        while count := batch.receive(fd):
            control = batch.data[:count, 1] == framing.CONTROL
            if control.any():
                # A hello among them (about once a second): echo the others only.
                rows = np.flatnonzero(~control)
                batch.prepare(
                    rows.size,
                    batch.name_addresses[rows],
                    batch.data_addresses[rows],
                    batch.lengths[rows],
                )
                batch.send(fd, rows.size)
                continue
            # The batch as it came, as the echo did before relays said hello: the bench's
            # own cost per batch stays what older commits' relays were measured with.
            batch.prepare(
                count,
                batch.name_addresses[:count],
                batch.data_addresses[:count],
                batch.lengths[:count],
            )
            batch.send(fd, count)


def _client_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2.0)
    return sock


def _open_flow(client: socket.socket, signer: RouteSigner, relay: Address) -> None:
    from aioice import stun

    request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    request.attributes["USERNAME"] = f"{signer.ufrag()}:bench"
    client.sendto(bytes(request), relay)
    client.recvfrom(2048)  # the echo, back through the relay: the flow is up


def _ping(
    client: socket.socket,
    target: Address,
    count: int,
    size: int,
    framed_to: Address | None = None,
) -> dict[str, float | None]:
    """Round-trip times (µs) of ``count`` datagrams sent one at a time."""
    payload = b"\x80" + bytes(size - 1)
    if framed_to is not None:
        payload = framing.encode_header(framed_to) + payload
    times = []
    for _ in range(count):
        start = time.perf_counter_ns()
        client.sendto(payload, target)
        client.recvfrom(4096)
        times.append((time.perf_counter_ns() - start) / 1000)
    return percentiles(times, (50, 99), digits=1)


def _flood(
    clients: list[socket.socket], relay: Address, size: int, seconds: float
) -> tuple[int, int, float]:
    """Send batches round the clients for ``seconds``, reading what comes back; the
    datagrams the relay forwarded (both ways), those offered, and the time taken."""
    out = Batch(BATCH)
    back = Batch(BATCH)
    out.data[:, 0] = 0x80
    target = np.zeros(16, np.uint8)
    target[:8] = np.frombuffer(sockaddr_key(relay).to_bytes(8, "little"), np.uint8)
    out.prepare(
        BATCH,
        np.full(BATCH, target.ctypes.data, np.uint64),
        out.data_addresses,
        np.full(BATCH, size, np.uint32),
    )
    fds = [client.fileno() for client in clients]
    poller = select.epoll()
    for fd in fds:
        poller.register(fd, select.EPOLLIN)
    sent = received = 0
    # Keep at most this many datagrams in flight: beyond it they only fill socket buffers.
    window = 4 * BATCH * len(fds)
    start = time.perf_counter()
    deadline = start + seconds
    turn = 0
    while time.perf_counter() < deadline:
        if sent - received < window:
            sent += BATCH - out.send(fds[turn], BATCH)
            turn = (turn + 1) % len(fds)
        for fd, _ in poller.poll(0 if sent - received < window else 0.01):
            while count := back.receive(fd):
                received += count
    # What is still on its way back.
    settle = time.perf_counter() + 0.5
    while time.perf_counter() < settle and received < sent:
        for fd, _ in poller.poll(0.05):
            while count := back.receive(fd):
                received += count
    poller.close()
    elapsed = time.perf_counter() - start
    # Each datagram that came back passed the relay twice.
    return 2 * received, 2 * sent, elapsed

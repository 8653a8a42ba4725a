"""One relay process: the public UDP socket, the socket towards the workers, and the loop
that forwards between them.

Client → worker: a batch is read from the public socket (``recvmmsg``); datagrams from
known clients get the framing header written in place before them and go to their
worker's media address in one ``sendmmsg``. A STUN binding request is read on the slow
path: its USERNAME's server ufrag must carry a hint signed with the fleet secret naming a
live worker of the registry. A request of a flow that exists, to the same worker, is
forwarded (the call's consent checks, however old its hint). Otherwise the hint must be
fresh (``route_hint.HINT_TTL_S``) and the new flow within the limits per source and per
hint (``flow_admission``), and then the client's address is (re)bound to that worker.
This is how the first packet of a call finds its worker, and how an ICE restart or a new
call from a reused address moves it. Anything else from an unknown address is dropped, once
it is clear that no other relay of the fleet knows it (a look-up in the mirrored table).

Worker → client: datagrams arriving on the internal socket carry the header naming the
client; the relay sends them from the public socket only if the client's flow exists and
belongs to the worker that sent them, so the relay cannot be used to spray packets at
arbitrary addresses.

The control plane runs on the same asyncio loop, between batches: the registry of workers
(polled), a signed hello to each of them from the internal socket (``relay_hello``: a
worker takes framed datagrams only from addresses that said one), the flow mirror in Redis
(written when a flow is made, its TTL refreshed while it is active, read at start-up and on
a miss), and expiry of idle flows and stale hints. Every call to Redis has a time limit
(``MIRROR_TIMEOUT_S``): a Redis that hangs costs a counted failure (``mirror_failures``) and a
warning, never a stuck write loop, start or stop; a write that failed is tried again on the
next pass, and ``stop`` makes a last, bounded try (``STOP_TIMEOUT_S``) for the flows not yet
mirrored, so that the relay that takes over finds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import InitVar, dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import redis.asyncio
import redis.exceptions

from hark.cluster.seal import Seal
from hark.cluster.store import ClusterStore, ClusterUnavailableError
from hark.edge import framing
from hark.edge.flow_admission import (
    HINT_EXHAUSTED,
    RATE_LIMITED,
    SOURCE_FLOW_BURST,
    SOURCE_FLOWS_PER_S,
    TOO_MANY_HINTS,
    FlowAdmission,
)
from hark.edge.flows import Address, FlowTable, parse_address
from hark.edge.mmsg import Batch, key_address, sockaddr_key
from hark.edge.relay_hello import HELLO_INTERVAL_S, HelloSigner
from hark.edge.route_hint import HintError, RouteVerifier
from hark.edge.stun import stun_request_username

logger = logging.getLogger(__name__)

BATCH = 64
# Batches read per readiness callback before the other socket and the control plane get a
# turn: fairness between directions, bounded latency for the control plane.
BATCHES_PER_WAKE = 8
# Up to this many datagrams a batch is handled one by one in plain Python: NumPy's fixed
# cost per operation (about a microsecond, two dozen operations) only pays off beyond.
SMALL_BATCH = 6
SOCKET_BUFFER_BYTES = 8 * 1024 * 1024
FLOW_IDLE_S = 30.0
REGISTRY_INTERVAL_S = 1.0
REGISTRY_MIN_INTERVAL_S = 0.1
EXPIRY_INTERVAL_S = 1.0
# Unknown clients looked up in the mirror at once; beyond that they are dropped unlooked.
MAX_PENDING_LOOKUPS = 256
# Unknown clients remembered as not in the mirror, and for how long: a junk flood costs
# one look-up per source address per second at most.
MAX_NEGATIVE = 65536
NEGATIVE_TTL_S = 1.0
FLOW_KEY_PREFIX = "hark:relay-flow:"
# How long one call of the flow mirror may wait for Redis; past it the call is abandoned and
# counted as failed. The store's own client has a socket timeout too; the mirror does not
# rely on the client it is handed having one.
MIRROR_TIMEOUT_S = 2.0
# How long ``Relay.stop`` may take in all, its last mirror write included.
STOP_TIMEOUT_S = 3.0

# The counters every process keeps, in this order (see ``Counters``).
COUNTERS = (
    "packets_in",
    "packets_out",
    "bytes_in",
    "bytes_out",
    "flows",
    "flows_created",
    "flows_restored",
    "flows_expired",
    "flows_worker_gone",
    "lookups",
    "mirror_failures",
)
DROP_REASONS = (
    "unknown_flow",
    HintError.MALFORMED.value,
    HintError.OTHER_FLEET.value,
    HintError.BAD_MAC.value,
    "expired_hint",
    RATE_LIMITED,
    HINT_EXHAUSTED,
    TOO_MANY_HINTS,
    "unknown_worker",
    "table_full",
    "bad_frame",
    "no_flow",
    "wrong_worker",
    "send_failed",
)
_HEADER_V4_START = bytes((framing.MAGIC, framing.IPV4))
_FAMILY_V4 = socket.AF_INET.to_bytes(2, "little")
SLOTS = len(COUNTERS) + len(DROP_REASONS)
_INDEX = {name: i for i, name in enumerate(COUNTERS)} | {
    f"drop_{name}": len(COUNTERS) + i for i, name in enumerate(DROP_REASONS)
}


class Counters:
    """One process's counters: a row of int64 (in shared memory when there are several
    processes, so the parent can serve the sum)."""

    def __init__(self, row: npt.NDArray[np.int64] | None = None) -> None:
        self.row = row if row is not None else np.zeros(SLOTS, np.int64)

    def add(self, name: str, amount: int = 1) -> None:
        """Count ``amount`` more ``name`` (a counter name, or ``drop_<reason>``)."""
        self.row[_INDEX[name]] += amount

    def set(self, name: str, value: int) -> None:
        """Set a gauge."""
        self.row[_INDEX[name]] = value

    def __getitem__(self, name: str) -> int:
        return int(self.row[_INDEX[name]])

    def nonzero(self) -> dict[str, int]:
        """The counters that are not zero, by name."""
        return {name: int(self.row[i]) for name, i in _INDEX.items() if self.row[i]}


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """What one relay process needs. ``fleet_secret`` is never logged.
    ``source_flows_per_s`` and ``source_flow_burst`` bound the new flows of one source IP
    (``flow_admission``)."""

    listen: Address
    fleet_secret: str
    internal: Address = ("0.0.0.0", 0)
    idle_s: float = FLOW_IDLE_S
    reuse_port: bool = True
    source_flows_per_s: float = SOURCE_FLOWS_PER_S
    source_flow_burst: int = SOURCE_FLOW_BURST

    def __repr__(self) -> str:
        return f"RelayConfig(listen={self.listen}, internal={self.internal}, idle_s={self.idle_s})"


class Registry:
    """Where each live worker's media port is, as the cluster store says (polled)."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.workers: dict[str, Address] = {}
        self.loaded = False

    async def refresh(self) -> bool:
        """Read the registry; False (keeping the last answer) when the store is down."""
        try:
            found = await self.store.workers(time.time())
        except ClusterUnavailableError as exc:
            logger.warning("the worker registry is unavailable: %s", exc)
            return False
        workers = {}
        for worker in found:
            if worker.media_address:
                with contextlib.suppress(ValueError):
                    workers[worker.id] = parse_address(worker.media_address)
        self.workers = workers
        self.loaded = True
        return True


@dataclass(repr=False, eq=False)
class FlowMirror:
    """The flow table in Redis: ``hark:relay-flow:<ip>:<port>`` → ``<worker id> <ip>:<port>
    <signature>``, expiring when no relay has refreshed it for the idle time. The signature
    (the fleet secret's, ``hark.cluster.seal``) covers the client and the worker: a flow
    written into Redis by anyone else is not taken, so it cannot make a flow that no fresh
    hint made. Forwarding never waits for Redis: each call is given ``timeout_s`` at most,
    and a failure (an error, or no answer in time) is logged by its kind alone (no address,
    no password), counted in ``failures`` and reported by the call's result."""

    client: redis.asyncio.Redis | None
    idle_s: float
    fleet_secret: InitVar[str]
    prefix: str = FLOW_KEY_PREFIX
    timeout_s: float = MIRROR_TIMEOUT_S
    failures: int = field(default=0, init=False)
    _seal: Seal = field(init=False)

    def __post_init__(self, fleet_secret: str) -> None:
        self._seal = Seal(fleet_secret)

    def __repr__(self) -> str:
        return f"FlowMirror(prefix={self.prefix!r})"

    def _value(self, client: Address, worker_id: str, worker: Address) -> str:
        address = f"{worker[0]}:{worker[1]}"
        signature = self._seal.sign("relay-flow", f"{client[0]}:{client[1]}", worker_id, address)
        return f"{worker_id} {address} {signature}"

    def _parse(self, client: Address, value: bytes | str) -> tuple[str, Address] | None:
        """The worker of a mirrored flow, if this fleet wrote it."""
        text = value.decode() if isinstance(value, bytes) else value
        worker_id, _, rest = text.partition(" ")
        address, _, signature = rest.partition(" ")
        client_text = f"{client[0]}:{client[1]}"
        if not self._seal.verify(signature, "relay-flow", client_text, worker_id, address):
            return None
        try:
            return worker_id, parse_address(address)
        except ValueError:
            return None

    def _key(self, client: Address) -> str:
        return f"{self.prefix}{client[0]}:{client[1]}"

    async def write(
        self, flows: list[tuple[Address, str, Address]], timeout_s: float | None = None
    ) -> bool:
        """Record these flows (client, worker id, worker address), with a fresh TTL; whether
        Redis took them (in ``timeout_s``, by default the mirror's own limit)."""
        if self.client is None or not flows:
            return True
        ttl = max(1, round(self.idle_s))
        async with self._quiet("write", timeout_s):
            async with self.client.pipeline(transaction=False) as pipe:
                for client, worker_id, worker in flows:
                    pipe.set(self._key(client), self._value(client, worker_id, worker), ex=ttl)
                await pipe.execute()
            return True
        return False

    async def touch(self, clients: list[Address]) -> bool:
        """Push back the expiry of these flows (they are active); whether Redis did."""
        if self.client is None or not clients:
            return True
        ttl = max(1, round(self.idle_s))
        async with self._quiet("refresh"):
            async with self.client.pipeline(transaction=False) as pipe:
                for client in clients:
                    pipe.expire(self._key(client), ttl)
                await pipe.execute()
            return True
        return False

    async def read(self, client: Address) -> tuple[str, Address] | None:
        """The worker of ``client``'s flow as another relay (or an earlier self) left it."""
        if self.client is None:
            return None
        async with self._quiet("read"):
            value = await self.client.get(self._key(client))
            return None if value is None else self._parse(client, value)
        return None

    async def read_all(self) -> list[tuple[Address, str, Address]]:
        """Every mirrored flow (at start-up). A large table takes many round trips: each has
        the mirror's time limit, not the whole load."""
        if self.client is None:
            return []
        found: list[tuple[Address, str, Address]] = []
        loop = asyncio.get_running_loop()
        async with self._quiet("load") as limit:
            keys = []
            async for key in self.client.scan_iter(match=self.prefix + "*", count=1000):
                keys.append(key)
                limit.reschedule(loop.time() + self.timeout_s)
            for start in range(0, len(keys), 1000):
                chunk = keys[start : start + 1000]
                values = await self.client.mget(chunk)
                limit.reschedule(loop.time() + self.timeout_s)
                for key, value in zip(chunk, values, strict=True):
                    text = key.decode() if isinstance(key, bytes) else key
                    with contextlib.suppress(ValueError):
                        client = parse_address(text[len(self.prefix) :])
                        parsed = None if value is None else self._parse(client, value)
                        if parsed is not None:
                            found.append((client, *parsed))
        return found

    @contextlib.asynccontextmanager
    async def _quiet(
        self, what: str, timeout_s: float | None = None
    ) -> AsyncIterator[asyncio.Timeout]:
        """Run the body within the time limit (the ``asyncio.Timeout`` it is given may push
        it back); a failure is logged, counted and swallowed (the body's ``return`` is then
        skipped)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(limit) as timeout:
                yield timeout
        except TimeoutError:
            self.failures += 1
            logger.warning("flow mirror %s failed: no answer from Redis in %.1f s", what, limit)
        except (redis.exceptions.RedisError, OSError) as exc:
            self.failures += 1
            logger.warning("flow mirror %s failed: %s", what, type(exc).__name__)


def open_socket(address: Address, *, reuse_port: bool) -> socket.socket:
    """A UDP socket bound to ``address`` with large buffers (and ``SO_REUSEPORT``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
    sock.bind(address)
    return sock


class Relay:
    """One relay process's sockets, forwarding table and control plane."""

    def __init__(
        self,
        config: RelayConfig,
        registry: Registry,
        mirror: FlowMirror,
        counters: Counters | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.mirror = mirror
        self.counters = counters or Counters()
        self.table = FlowTable()
        self._verifier = RouteVerifier(config.fleet_secret)
        self._hellos = HelloSigner(config.fleet_secret)
        self._admission = FlowAdmission(config.source_flows_per_s, config.source_flow_burst)
        self._public: socket.socket | None = None
        self._internal: socket.socket | None = None
        self._rx = Batch(BATCH, headroom=framing.HEADER_V4)
        self._tx = Batch(BATCH)
        self._rx_back = Batch(BATCH)
        self._tx_back = Batch(BATCH)
        # The reply path's destination names are written per datagram; the family once.
        self._tx_back.names[:, 0] = socket.AF_INET
        self._tasks: list[asyncio.Task[None]] = []
        self._to_write: dict[Address, tuple[str, Address]] = {}
        # The batch the write loop has in hand (out of ``_to_write``, not yet in Redis).
        self._writing: dict[Address, tuple[str, Address]] = {}
        self._mirror_failures = 0
        self._write_wanted = asyncio.Event()
        self._registry_wanted = asyncio.Event()
        self._lookups: asyncio.Queue[Address] = asyncio.Queue(MAX_PENDING_LOOKUPS)
        self._pending: set[int] = set()
        self._negative: OrderedDict[int, float] = OrderedDict()

    @property
    def address(self) -> Address:
        """The public socket's address."""
        assert self._public is not None, "the relay is not started"
        host, port = self._public.getsockname()[:2]
        return host, port

    @property
    def internal_address(self) -> Address:
        """The address the workers see the relay's datagrams come from (its port)."""
        assert self._internal is not None, "the relay is not started"
        host, port = self._internal.getsockname()[:2]
        return host, port

    async def start(self) -> None:
        """Bind, load the registry and the mirrored flows, then start forwarding."""
        self._public = open_socket(self.config.listen, reuse_port=self.config.reuse_port)
        self._internal = open_socket(self.config.internal, reuse_port=False)
        await self.registry.refresh()
        # Before the first client's datagram: the workers take frames from this socket then.
        self._say_hello()
        restored = 0
        now = time.monotonic()
        mirrored = await self.mirror.read_all()
        self._count_mirror_failures()
        for client, worker_id, worker in mirrored:
            if self.registry.workers.get(worker_id) == worker and self.table.put(
                client, worker_id, worker, now
            ):
                restored += 1
        self.table.reindex()
        self.counters.add("flows_restored", restored)
        self.counters.set("flows", len(self.table))
        loop = asyncio.get_running_loop()
        public, internal = self._public.fileno(), self._internal.fileno()
        for rx, source, destination, forward_small, forward in (
            (self._rx, public, internal, self._forward_in_small, self._forward_in),
            (self._rx_back, internal, public, self._forward_out_small, self._forward_out),
        ):
            loop.add_reader(source, self._drain, rx, source, destination, forward_small, forward)
        for job, name in (
            (self._poll_registry(), "registry"),
            (self._expire(), "expiry"),
            (self._write_flows(), "mirror writes"),
            (self._look_up(), "mirror look-ups"),
            (self._greet(), "hellos"),
        ):
            self._tasks.append(asyncio.create_task(job, name=f"hark-relay-{name}"))
        logger.info(
            "relay on UDP %s:%d (towards workers from port %d); %d flow(s) restored",
            *self.address,
            self.internal_address[1],
            restored,
        )

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop forwarding, close the sockets, and write the flows not yet mirrored (so that
        the relay that takes over finds them); returns within about ``timeout_s`` whatever
        Redis does (a write that does not finish in time is counted and logged)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for sock in (self._public, self._internal):
            if sock is not None:
                loop.remove_reader(sock.fileno())
                sock.close()
        self._public = self._internal = None
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # A task stuck where cancelling does not reach is left behind, not waited for.
            _, stuck = await asyncio.wait(self._tasks, timeout=max(0.0, deadline - loop.time()))
            if stuck:
                logger.warning("%d relay task(s) did not stop in time", len(stuck))
        self._tasks.clear()
        unwritten = self._writing | self._to_write
        self._writing, self._to_write = {}, {}
        if unwritten:
            batch = [(client, *where) for client, where in unwritten.items()]
            left = max(0.0, deadline - loop.time())
            if not await self.mirror.write(batch, timeout_s=left):
                logger.warning("%d flow(s) were not mirrored before the stop", len(batch))
            self._count_mirror_failures()

    def _drain(
        self,
        rx: Batch,
        source: int,
        destination: int,
        forward_small: Callable[[int, int], None],
        forward: Callable[[int, int], None],
    ) -> None:
        """Forward what waits on the ``source`` socket to ``destination``, a batch at a
        time: clients' datagrams to workers (``_forward_in``), or back (``_forward_out``)."""
        for _ in range(BATCHES_PER_WAKE):
            count = rx.receive(source)
            if count == 0:
                return
            if count <= SMALL_BATCH:
                forward_small(count, destination)
            else:
                forward(count, destination)

    # ------------------------------------------------------------------ client → worker

    def _forward_in(self, count: int, internal: int) -> None:
        rx, table, tx = self._rx, self.table, self._tx
        table.reindex()
        keys = rx.keys[:count]
        head = rx.headroom
        positions = np.searchsorted(table.keys, keys)
        known = table.keys[positions] == keys
        stun = rx.data[:count, head] < 4
        now = time.monotonic()
        rows = np.flatnonzero(known & ~stun)
        pointers = table.pointers[positions[rows]]
        table.seen[positions[rows]] = now
        slow = np.flatnonzero(~known | stun)
        if slow.size:
            extra_rows, extra_pointers = [], []
            for row in slow.tolist():
                pointer = self._route_unknown(row, now)
                if pointer is not None:
                    extra_rows.append(row)
                    extra_pointers.append(pointer)
            if extra_rows:
                rows = np.concatenate((rows, np.array(extra_rows, np.intp)))
                pointers = np.concatenate((pointers, np.array(extra_pointers, np.uint64)))
        sending = rows.size
        if not sending:
            return
        # The header before each datagram names its sender: bytes 2..8 of its sockaddr_in.
        data = rx.data
        data[rows, head - 8] = framing.MAGIC
        data[rows, head - 7] = framing.IPV4
        data[rows, head - 6 : head] = rx.names[rows, 2:8]
        lengths = rx.lengths[rows]
        tx.prepare(
            sending,
            pointers,
            rx.data_addresses[rows] + np.uint64(head - framing.HEADER_V4),
            lengths + framing.HEADER_V4,
        )
        self._send(tx, internal, sending, int(lengths.sum()), "in")

    def _forward_in_small(self, count: int, internal: int) -> None:
        """``_forward_in`` for a few datagrams: the same decisions, without NumPy."""
        rx, tx, flows = self._rx, self._tx, self.table.flows
        data, names, keys = rx.data_view, rx.names_view, rx.keys_view
        head, slot, base = rx.headroom, rx.slot, rx.base
        now = time.monotonic()
        sending = size = 0
        for row in range(count):
            start = row * slot + head
            flow = flows.get(keys[row * 2])
            if flow is not None and data[start] >= 4:
                flow.seen = now
                pointer = flow.pointer
            else:
                routed = self._route_unknown(row, now)
                if routed is None:
                    continue
                pointer = routed
            length = rx.length(row)
            data[start - 8 : start - 6] = _HEADER_V4_START
            data[start - 6 : start] = names[row * 16 + 2 : row * 16 + 8]
            tx.prepare_one(sending, pointer, base + start - 8, length + 8)
            sending += 1
            size += length
        if sending:
            self._send(tx, internal, sending, size, "in")

    def _route_unknown(self, row: int, now: float) -> int | None:
        """The slow path of one datagram: a STUN request (re)binds its client by the hint
        it carries; anything else from an unknown client is dropped (and looked up)."""
        rx = self._rx
        key = int(rx.keys[row])
        client = key_address(key)
        start = rx.headroom
        datagram = rx.data[row, start : start + int(rx.lengths[row])].tobytes()
        username = stun_request_username(datagram)
        if username is None:
            flow = self.table.flows.get(key)
            if flow is not None:
                # A STUN response or indication of a known flow: forwarded like the rest.
                self.table.put(client, flow.worker_id, flow.worker, now)
                return self._pointer(flow.worker)
            self.counters.add("drop_unknown_flow")
            self._want_lookup(key, client, now)
            return None
        hint = username.partition(":")[0]
        route = self._verifier.verify(hint)
        if isinstance(route, HintError):
            self.counters.add(f"drop_{route.value}")
            return None
        existing = self.table.flows.get(key)
        if existing is not None and existing.worker_id == route.worker_id:
            # The call's own checks: its flow goes on whatever the hint's age.
            existing.seen = now
            return existing.pointer
        if route.expires_at < time.time():
            self.counters.add("drop_expired_hint")
            # Perhaps a flow another relay made while the hint was fresh.
            self._want_lookup(key, client, now)
            return None
        worker = self.registry.workers.get(route.worker_id)
        if worker is None:
            # Perhaps a worker that joined since the last poll: the client's check is
            # retransmitted, and by then the registry has been read again.
            self.counters.add("drop_unknown_worker")
            self._registry_wanted.set()
            return None
        refused = self._admission.admit(client[0], hint, route.expires_at, key, now)
        if refused is not None:
            self.counters.add(f"drop_{refused}")
            return None
        if self.table.put(client, route.worker_id, worker, now) is None:
            self.counters.add("drop_table_full")
            return None
        self.counters.add("flows_created")
        self.counters.set("flows", len(self.table))
        self._to_write[client] = (route.worker_id, worker)
        self._write_wanted.set()
        return self._pointer(worker)

    def _pointer(self, worker: Address) -> int:
        slot = self.table.destinations.slot(worker)
        assert slot is not None, "a flow's worker always has a slot"
        return self.table.destinations.pointer(slot)

    # ------------------------------------------------------------------ worker → client

    def _forward_out(self, count: int, public: int) -> None:
        rx, tx, table = self._rx_back, self._tx_back, self.table
        table.reindex()
        lengths = rx.lengths[:count]
        framed = (
            (rx.data[:count, 0] == framing.MAGIC)
            & (rx.data[:count, 1] == framing.IPV4)
            & (lengths >= framing.HEADER_V4)
        )
        # The client's sockaddr_in, built from the header where the datagram will be sent.
        tx.names[:count, 2:8] = rx.data[:count, 2:8]
        clients = tx.keys[:count]
        positions = np.searchsorted(table.keys, clients)
        known = table.keys[positions] == clients
        owner = table.worker_keys[positions] == rx.keys[:count]
        ok = framed & known & owner
        rows = np.flatnonzero(ok)
        sending = rows.size
        if sending < count:
            counters = self.counters
            counters.add("drop_bad_frame", int(np.count_nonzero(~framed)))
            counters.add("drop_no_flow", int(np.count_nonzero(framed & ~known)))
            counters.add("drop_wrong_worker", int(np.count_nonzero(framed & known & ~owner)))
        if not sending:
            return
        sizes = lengths[rows] - framing.HEADER_V4
        tx.prepare(
            sending,
            tx.name_addresses[rows],
            rx.data_addresses[rows] + np.uint64(framing.HEADER_V4),
            sizes,
        )
        self._send(tx, public, sending, int(sizes.sum()), "out")

    def _forward_out_small(self, count: int, public: int) -> None:
        """``_forward_out`` for a few datagrams: the same checks, without NumPy."""
        rx, tx, flows = self._rx_back, self._tx_back, self.table.flows
        data, keys, out_names = rx.data_view, rx.keys_view, tx.names_view
        slot, base, out_base = rx.slot, rx.base, int(tx.names.ctypes.data)
        sending = size = 0
        for row in range(count):
            start = row * slot
            length = rx.length(row)
            if length < 8 or data[start] != framing.MAGIC or data[start + 1] != framing.IPV4:
                self.counters.add("drop_bad_frame")
                continue
            client = data[start + 2 : start + 8]
            flow = flows.get(int.from_bytes(_FAMILY_V4 + client, "little"))
            if flow is None:
                self.counters.add("drop_no_flow")
                continue
            if flow.worker_key != keys[row * 2]:
                self.counters.add("drop_wrong_worker")
                continue
            out_names[row * 16 + 2 : row * 16 + 8] = client
            tx.prepare_one(sending, out_base + row * 16, base + start + 8, length - 8)
            sending += 1
            size += length - 8
        if sending:
            self._send(tx, public, sending, size, "out")

    def _send(
        self, tx: Batch, fd: int, sending: int, size: int, direction: Literal["in", "out"]
    ) -> None:
        """Send the ``sending`` datagrams prepared in ``tx`` (``size`` payload bytes) and
        count them as forwarded ``direction`` (``in`` or ``out``)."""
        failed = tx.send(fd, sending)
        self.counters.add(f"packets_{direction}", sending - failed)
        self.counters.add(f"bytes_{direction}", size)
        if failed:
            self.counters.add("drop_send_failed", failed)

    # ------------------------------------------------------------------ control plane

    def _want_lookup(self, key: int, client: Address, now: float) -> None:
        """Ask the mirror about an unknown client, unless asked lately or too busy."""
        if key in self._pending or self.mirror.client is None:
            return
        until = self._negative.get(key)
        if until is not None and until > now:
            return
        try:
            self._lookups.put_nowait(client)
        except asyncio.QueueFull:
            return
        self._pending.add(key)

    def _count_mirror_failures(self) -> None:
        """Add the mirror's failures since the last call to ``mirror_failures``."""
        failures = self.mirror.failures
        if failures != self._mirror_failures:
            self.counters.add("mirror_failures", failures - self._mirror_failures)
            self._mirror_failures = failures

    async def _look_up(self) -> None:
        while True:
            client = await self._lookups.get()
            key = sockaddr_key(client)
            self.counters.add("lookups")
            found = await self.mirror.read(client)
            self._count_mirror_failures()
            self._pending.discard(key)
            now = time.monotonic()
            if found is not None and self.registry.workers.get(found[0]) == found[1]:
                if key not in self.table.flows and self.table.put(client, *found, now):
                    self.counters.add("flows_restored")
                    self.counters.set("flows", len(self.table))
                continue
            self._negative[key] = now + NEGATIVE_TTL_S
            self._negative.move_to_end(key)
            while len(self._negative) > MAX_NEGATIVE:
                self._negative.popitem(last=False)

    async def _write_flows(self) -> None:
        last_touch = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._write_wanted.wait(), self.config.idle_s / 3)
            self._write_wanted.clear()
            if self._to_write:
                self._writing, self._to_write = self._to_write, {}
                batch = [(client, *where) for client, where in self._writing.items()]
                if not await self.mirror.write(batch):
                    # Tried again on the next pass, unless the flow changed or ended since.
                    for client, where in self._writing.items():
                        flow = self.table.get(client)
                        if flow is not None and (flow.worker_id, flow.worker) == where:
                            self._to_write.setdefault(client, where)
                self._writing = {}
                self._count_mirror_failures()
            now = time.monotonic()
            if now - last_touch >= self.config.idle_s / 3:
                active = self.table.active_since(last_touch)
                last_touch = now
                await self.mirror.touch([flow.client for flow in active])
                self._count_mirror_failures()

    async def _poll_registry(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._registry_wanted.wait(), REGISTRY_INTERVAL_S)
            # However many clients name an unknown worker, the store is read this often.
            await asyncio.sleep(REGISTRY_MIN_INTERVAL_S)
            self._registry_wanted.clear()
            if not await self.registry.refresh():
                continue
            # A worker new in the registry hears from this relay before its first flow.
            self._say_hello()
            live = self.registry.workers
            gone = {
                key
                for key, flow in self.table.flows.items()
                if live.get(flow.worker_id) != flow.worker
            }
            if gone:
                self.table.remove_where(gone)
                self.counters.add("flows_worker_gone", len(gone))
                self.counters.set("flows", len(self.table))

    async def _greet(self) -> None:
        # On a timer of its own, from the last registry read: a store that is down or slow
        # does not make the workers stop taking this relay's datagrams.
        while True:
            await asyncio.sleep(HELLO_INTERVAL_S)
            self._say_hello()

    def _say_hello(self) -> None:
        """Send every worker of the registry a hello from the internal socket."""
        if self._internal is None:
            return
        for worker_id, address in self.registry.workers.items():
            hello = self._hellos.hello(worker_id)
            if hello is None:
                continue
            with contextlib.suppress(OSError):
                self._internal.sendto(hello, socket.MSG_DONTWAIT, address)

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_INTERVAL_S)
            self._admission.prune(time.time())
            expired = self.table.expire(time.monotonic(), self.config.idle_s)
            if expired:
                self.counters.add("flows_expired", expired)
                self.counters.set("flows", len(self.table))

"""The relay's forwarding table: client address → the worker media address it goes to.

The table is a dict of ``Flow`` objects (the control plane's view: added, looked up,
expired) and, rebuilt after every change, sorted NumPy arrays that the packet loop searches
a whole batch at once (``np.searchsorted``): each flow's key, a pointer to its worker's
``sockaddr_in`` and that address's key, and when a datagram of the flow was last seen.
Flows come and go a few times per call; datagrams come 50 times a second per direction, so
the rebuild is cheap where it happens and the lookups cost nothing per datagram in Python.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hark.edge.mmsg import U64, sockaddr_key

Address = tuple[str, int]
# Bounds: a relay serves at most this many flows and distinct worker addresses; beyond,
# new flows are refused (and counted) rather than growing without end.
MAX_FLOWS = 1_000_000
MAX_WORKERS = 4096
_EMPTY = np.iinfo(np.uint64).max


@dataclass(slots=True)
class Flow:
    """One client address and the worker its datagrams go to."""

    client: Address
    worker_id: str
    worker: Address
    seen: float
    # Where the worker's sockaddr_in is (see ``Destinations``), and its key.
    pointer: int = 0
    worker_key: int = 0


class Destinations:
    """The ``sockaddr_in`` of every worker address in use, at fixed places in memory."""

    def __init__(self, capacity: int = MAX_WORKERS) -> None:
        self._names = np.zeros((capacity, 16), np.uint8)
        self._base = self._names.ctypes.data
        self._slots: dict[Address, int] = {}
        self._free = list(range(capacity - 1, -1, -1))

    def slot(self, address: Address) -> int | None:
        """The slot holding ``address`` (made on first use); None when all are taken."""
        slot = self._slots.get(address)
        if slot is None:
            if not self._free:
                return None
            slot = self._free.pop()
            self._names[slot, :8] = np.frombuffer(
                sockaddr_key(address).to_bytes(8, "little"), np.uint8
            )
            self._slots[address] = slot
        return slot

    def pointer(self, slot: int) -> int:
        """The address in memory of the ``sockaddr_in`` in ``slot``."""
        return self._base + slot * 16

    def release_unused(self, used: set[Address]) -> None:
        """Free the slots of addresses no flow uses any more."""
        for address in [a for a in self._slots if a not in used]:
            self._free.append(self._slots.pop(address))


class FlowTable:
    """The flows of one relay process, with their vector index (``keys`` … ``seen``)."""

    def __init__(self, max_flows: int = MAX_FLOWS) -> None:
        self.flows: dict[int, Flow] = {}
        self.destinations = Destinations()
        self.max_flows = max_flows
        self.keys: U64 = np.array([_EMPTY], np.uint64)
        self.pointers: U64 = np.zeros(1, np.uint64)
        self.worker_keys: U64 = np.zeros(1, np.uint64)
        self.seen: npt.NDArray[np.float64] = np.zeros(1, np.float64)
        self._order: list[int] = []
        self._dirty = False

    def __len__(self) -> int:
        return len(self.flows)

    def get(self, client: Address) -> Flow | None:
        """The flow of ``client``, if any."""
        return self.flows.get(sockaddr_key(client))

    def put(self, client: Address, worker_id: str, worker: Address, now: float) -> Flow | None:
        """Send ``client``'s datagrams to ``worker`` from now on; the flow, or None when the
        table is full."""
        key = sockaddr_key(client)
        flow = self.flows.get(key)
        if flow is not None and (flow.worker_id, flow.worker) == (worker_id, worker):
            flow.seen = now
            return flow
        if flow is None and len(self.flows) >= self.max_flows:
            return None
        slot = self.destinations.slot(worker)
        if slot is None:
            return None
        pointer = self.destinations.pointer(slot)
        flow = Flow(client, worker_id, worker, now, pointer, sockaddr_key(worker))
        self.flows[key] = flow
        self._dirty = True
        return flow

    def remove_where(self, doomed: set[int]) -> None:
        """Forget the flows whose keys are in ``doomed``."""
        for key in doomed:
            self.flows.pop(key, None)
        self._dirty = True

    def expire(self, now: float, idle_s: float) -> int:
        """Forget flows with no datagram from their client for ``idle_s``; how many."""
        self.sync_seen()
        doomed = {key for key, flow in self.flows.items() if flow.seen < now - idle_s}
        if doomed:
            self.remove_where(doomed)
        return len(doomed)

    def of_workers_gone(self, live: set[str]) -> set[int]:
        """The keys of flows whose worker is no longer in the registry."""
        return {key for key, flow in self.flows.items() if flow.worker_id not in live}

    def sync_seen(self) -> None:
        """Copy the packet loop's last-seen times back into the flows."""
        for position, key in enumerate(self._order):
            flow = self.flows.get(key)
            if flow is not None:
                flow.seen = max(flow.seen, float(self.seen[position]))

    def active_since(self, since: float) -> list[Flow]:
        """The flows that saw a datagram at or after ``since``."""
        self.sync_seen()
        return [flow for flow in self.flows.values() if flow.seen >= since]

    def reindex(self) -> None:
        """Rebuild the vector index if the table changed since the last rebuild."""
        if not self._dirty:
            return
        self.sync_seen()
        self.destinations.release_unused({flow.worker for flow in self.flows.values()})
        order = sorted(self.flows)
        count = len(order)
        keys = np.empty(count + 1, np.uint64)
        pointers = np.zeros(count + 1, np.uint64)
        worker_keys = np.zeros(count + 1, np.uint64)
        seen = np.zeros(count + 1, np.float64)
        for position, key in enumerate(order):
            flow = self.flows[key]
            keys[position] = key
            pointers[position] = flow.pointer
            worker_keys[position] = flow.worker_key
            seen[position] = flow.seen
        # A sentinel larger than every key: a search past the last flow lands on it.
        keys[count] = _EMPTY
        self.keys, self.pointers, self.worker_keys, self.seen = keys, pointers, worker_keys, seen
        self._order = order
        self._dirty = False


def parse_address(text: str) -> Address:
    """``host:port`` (IPv4 address or name) as an ``(ip, port)`` pair; raises ``ValueError``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, not {text!r}")
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        raise ValueError(f"cannot resolve {host!r}") from None
    return ip, int(port)

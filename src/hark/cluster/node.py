"""This worker as a member of the cluster: its registry entry, heartbeats and sweeps, the
calls it owns, and where a new call should go.

A worker registers with a heartbeat every ``HEARTBEAT_INTERVAL_S`` that expires after
``HEARTBEAT_TTL_S``: a worker killed without a word disappears from placement within a few
seconds, and every worker sweeps what the dead one left (its calls, its session counts).
When the store cannot be reached the worker keeps serving what it has (its calls are found
locally first) and keeps beating; once the store answers again, or a heartbeat finds that
the store had forgotten the worker (a restart, a failover, a sweep while its entry had
expired), the worker writes its calls back at once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

from hark.cluster.store import CallRecord, ClusterStore, ClusterUnavailableError, WorkerInfo

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
# Three missed beats: a worker stalled by a long pause is not declared dead at once.
HEARTBEAT_TTL_S = 4.0
SWEEP_INTERVAL_S = 2.0
# How often a worker writes its calls again, in case the store lost them (a restart).
RESYNC_INTERVAL_S = 10.0
# A placement whose offer is still being answered counts towards its worker for at most
# this long (the internal hop's own time-out), then it is taken as failed.
PLACEMENT_IN_FLIGHT_S = 30.0
# Bound on remembered placements (each is a float): a flood of offers cannot grow it.
MAX_REMEMBERED_PLACEMENTS = 10_000


@dataclass(slots=True)
class Placement:
    """A call sent to a worker, counted against that worker until its load shows it.

    While the offer is being answered it always counts (for at most
    ``PLACEMENT_IN_FLIGHT_S``). The answer says which of the worker's calls it became
    (``opened_as``, its count of calls opened once this one was); a registry entry whose
    ``calls_opened`` is that far counts the call in its sessions, an older one does not. A
    placement whose call did not open is ``withdrawn`` and no longer counts.
    """

    worker_id: str
    placed_at: float
    opened_as: int | None = None
    withdrawn: bool = False

    def pending_against(self, worker: WorkerInfo, now: float) -> bool:
        """Whether ``worker``'s registry entry does not count this call yet."""
        if self.withdrawn or self.worker_id != worker.id:
            return False
        if self.opened_as is None:
            return now - self.placed_at < PLACEMENT_IN_FLIGHT_S
        return worker.calls_opened < self.opened_as


def rank(
    workers: Iterable[WorkerInfo], *, here: str, zone: str, pending: Mapping[str, int]
) -> list[WorkerInfo]:
    """Where a new call should go, best first: the placement rule as a pure function.

    Workers of ``zone`` come first; then the fewest sessions (the registry's figure plus the
    calls ``pending`` on that worker, placed but not yet in its figure); on a tie ``here``
    (no hop), then the lower CPU share, then the lower id. The caller has already left out
    the workers that are not ready, draining or excluded.
    """

    def key(worker: WorkerInfo) -> tuple[bool, int, bool, float, str]:
        return (
            worker.zone != zone,
            worker.sessions + pending.get(worker.id, 0),
            worker.id != here,
            worker.cpu,
            worker.id,
        )

    return sorted(workers, key=key)


@dataclass(frozen=True, slots=True)
class Load:
    """What a worker reports about itself with each heartbeat."""

    sessions: int
    queue_depth: int = 0
    # Calls ever opened here, read with ``sessions``: which placed calls that count includes.
    calls_opened: int = 0


class ClusterNode:
    """One worker's membership of the cluster.

    ``url`` is how other workers reach this one (``--advertise-url``); ``media_address`` the
    ``host:port`` clients send WebRTC media to; ``load`` is read at every heartbeat.
    """

    def __init__(
        self,
        store: ClusterStore,
        *,
        url: str,
        zone: str = "",
        media_address: str = "",
        load: Callable[[], Load] = lambda: Load(0),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.id = "wrk_" + secrets.token_hex(6)
        self.url = url
        self.zone = zone
        self.media_address = media_address
        self.ready = False
        self.draining = False
        self._load = load
        self._clock = clock
        self._started_at = clock()
        self._calls: dict[str, CallRecord] = {}
        self._placements: deque[Placement] = deque(maxlen=MAX_REMEMBERED_PLACEMENTS)
        self._task: asyncio.Task[None] | None = None
        # When the heartbeat task next writes the calls back, and next sweeps (monotonic).
        self._next_resync = self._next_sweep = 0.0
        self._cpu_mark = (time.monotonic(), time.process_time())
        self._cpu = 0.0
        # Whether the last store operation of the heartbeat succeeded.
        self.store_available = True

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Open the store and start beating; a store that is down is retried, not fatal."""
        try:
            await self.store.start()
            await self.beat()
        except ClusterUnavailableError as exc:
            self._store_failed(exc)
        self._task = asyncio.create_task(self._run(), name="hark-cluster-heartbeat")

    async def stop(self) -> None:
        """Stop beating and leave the registry (taking this worker's calls with it)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        try:
            await self.store.remove_worker(self.id)
        except ClusterUnavailableError as exc:
            logger.warning("could not leave the cluster registry: %s", exc)
        await self.store.aclose()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
            await self.tick()

    async def tick(self) -> None:
        """One turn of the heartbeat task: beat, write the calls back when due or when the
        store may have lost them, sweep when due. Never raises."""
        now = time.monotonic()
        try:
            was_available = self.store_available
            registered = await self.beat()
            # The store may have lost this worker's calls: it was down, or it forgot the
            # worker (a restart, a failover to a replica that let the entry expire, another
            # worker's sweep meanwhile).
            if not was_available or not registered or now >= self._next_resync:
                await self._resync()
                self._next_resync = now + RESYNC_INTERVAL_S
            if now >= self._next_sweep:
                swept = await self.store.sweep(self._clock())
                if swept:
                    logger.info("swept %d worker(s) whose heartbeat expired", swept)
                self._next_sweep = now + SWEEP_INTERVAL_S
        except ClusterUnavailableError as exc:
            self._store_failed(exc)
        except Exception:
            logger.exception("cluster heartbeat failed")

    def _store_failed(self, exc: ClusterUnavailableError) -> None:
        if self.store_available:
            logger.error("the cluster store is unavailable (%s); running sessions go on", exc)
        self.store_available = False

    async def beat(self) -> bool:
        """Write this worker's registry entry once (the heartbeat task does it periodically);
        whether the store still had it."""
        registered = await self.store.heartbeat(self.info(), HEARTBEAT_TTL_S)
        if not self.store_available:
            logger.info("the cluster store is back")
        elif not registered and self._next_resync:
            logger.warning("the cluster store had forgotten this worker; it registers again")
        self.store_available = True
        return registered

    async def _resync(self) -> None:
        for record in list(self._calls.values()):
            await self.store.put_call(record)

    def info(self) -> WorkerInfo:
        """This worker's registry entry as of now."""
        return WorkerInfo(
            id=self.id,
            url=self.url,
            media_address=self.media_address,
            zone=self.zone,
            cpu=self._cpu_share(),
            draining=self.draining,
            ready=self.ready,
            started_at=self._started_at,
            heartbeat_at=self._clock(),
            # The load as reported, every figure of it under its own name.
            **asdict(self._load()),
        )

    def _cpu_share(self) -> float:
        """The process's CPU time over wall time since the last heartbeat (1.0: one core)."""
        wall, cpu = time.monotonic(), time.process_time()
        last_wall, last_cpu = self._cpu_mark
        if wall - last_wall >= HEARTBEAT_INTERVAL_S / 2:
            self._cpu = (cpu - last_cpu) / (wall - last_wall)
            self._cpu_mark = (wall, cpu)
        return round(self._cpu, 3)

    # ------------------------------------------------------------------ calls

    async def register_call(self, call_id: str, owner: str) -> None:
        """Record a call this worker owns; the store learns it now or at the next resync."""
        record = CallRecord(id=call_id, owner=owner, worker_id=self.id, created_at=self._clock())
        self._calls[call_id] = record
        try:
            await self.store.put_call(record)
        except ClusterUnavailableError as exc:
            self._store_failed(exc)

    async def forget_call(self, call_id: str) -> None:
        """The call ended."""
        self._calls.pop(call_id, None)
        try:
            await self.store.delete_call(call_id)
        except ClusterUnavailableError as exc:
            self._store_failed(exc)

    async def find_call(self, call_id: str) -> CallRecord | None:
        """Where a call lives; raises ``ClusterUnavailableError`` when the store is down."""
        local = self._calls.get(call_id)
        if local is not None:
            return local
        return await self.store.get_call(call_id)

    async def worker(self, worker_id: str) -> WorkerInfo | None:
        """The live worker ``worker_id``; raises ``ClusterUnavailableError``."""
        for worker in await self.store.workers(self._clock()):
            if worker.id == worker_id:
                return worker
        return None

    # ------------------------------------------------------------------ placement

    async def place(self, exclude: frozenset[str] = frozenset()) -> list[WorkerInfo]:
        """The ready, non-draining workers a new call may go to, best first (``rank``).

        Other workers' sessions are what the registry says; this worker's are its own
        figure as of now. Raises ``ClusterUnavailableError``.
        """
        now = self._clock()
        workers = [
            self.info() if w.id == self.id else w
            for w in await self.store.workers(now)
            if w.ready and not w.draining and w.id not in exclude
        ]
        pending: dict[str, int] = {}
        for worker in workers:
            pending[worker.id] = sum(1 for p in self._placements if p.pending_against(worker, now))
        return rank(workers, here=self.id, zone=self.zone, pending=pending)

    def placed(self, worker_id: str) -> Placement:
        """A call is being placed on ``worker_id``; ``settle`` it once its offer is answered."""
        now = self._clock()
        while self._placements and (
            self._placements[0].withdrawn
            or now - self._placements[0].placed_at >= PLACEMENT_IN_FLIGHT_S
        ):
            self._placements.popleft()
        placement = Placement(worker_id, placed_at=now)
        self._placements.append(placement)
        return placement

    def settle(self, placement: Placement, opened_as: int | None) -> None:
        """The placed call's offer was answered: it opened there as that worker's
        ``opened_as``-th call, or it did not (None: unreachable, refused) and is forgotten."""
        if opened_as is None:
            placement.withdrawn = True
        else:
            placement.opened_as = opened_as

"""One place that runs a shared speech model's work, most urgent first (design principle 2).

Every session of a worker shares the recogniser, and they ask it for different things: the
words of a turn that has just ended (someone waits in silence for the reply), captions of a
turn still being spoken, and speculative decodes of a pause that may not end the turn. Run
in the order they arrive, a waiting answer queues behind captions and speculation nobody
may ever use. ``AsrScheduler`` runs them by ``Urgency`` instead, drops work whose caller
gave up before it began, and hands several requests to the model at once where the model
decodes a batch faster than one request after another (CTranslate2's Whisper does).

It has worker threads of its own (``workers``, one by default), never the default pool:
recognition that takes the pool's threads would starve everything else the event loop hands
to it (file reads, DNS). A second worker starts only while every running one is busy, so a
lone request never waits for a thread, and a backlog (many captioned speakers) uses a second
core where the model has a second replica to run on.

Work of ``Urgency.TIMES`` (aligning words already delivered) is the one thing that can wait
for other models: while one computes what someone waits for (a turn's verdict, a reply's
prompt and first words), that work stays queued, for ``DEFER_LIMIT_S`` at most. On a 2-core
machine a deciding pause has its words judged, its reply's prompt read and its words aligned
at once; the alignment's share of the cores came out of the verdict and the first token.

A batch that raises an ``Exception`` fails its requests alone. Anything else kills the thread
running it: the batch's requests fail with ``EngineThreadCrashedError``, a new thread takes
the dead one's place, and the engine reports itself degraded (:mod:`hark.engines.health`)
until a batch succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

from hark.engines import activity, health
from hark.engines.asr import Urgency
from hark.engines.scheduler import SchedulerFullError, require_positive

__all__ = ["DEFER_LIMIT_S", "AsrScheduler", "SchedulerFullError"]

# The longest ``Urgency.TIMES`` work waits for other models' work that someone waits for.
DEFER_LIMIT_S = 0.25
# How often a thread holding only such work looks again (other models do not wake it).
_DEFER_POLL_S = 0.005

R = TypeVar("R")
T = TypeVar("T")
_V = TypeVar("_V")


@dataclass(eq=False, slots=True)
class _Entry(Generic[R, T]):
    request: R
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]
    waiting: bool = True
    queued: float = field(default_factory=time.monotonic)


def _deliver(future: asyncio.Future[T], result: T) -> None:
    # A caller cancelled while its batch ran has gone: its result is dropped here.
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[T], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class AsrScheduler(Generic[R, T]):
    """Runs ``run_batch`` on requests from any event loop, the most urgent first.

    ``run_batch`` takes up to ``max_batch`` requests and returns one result per request, in
    order; it runs on up to ``workers`` threads of the scheduler's own, which start when work
    comes and finds no idle thread, and end after ``idle_s`` without any. Requests run by
    ``Urgency`` (lowest first), then in the order they came; a batch is the head of that
    order and the next ones after it, less ``Urgency.TIMES`` requests younger than
    ``DEFER_LIMIT_S`` while another model computes what someone waits for. At most
    ``max_waiting`` requests wait; more raise ``SchedulerFullError`` for the request that
    would exceed it, not for the others.
    ``probe``: a request of the engine's own through the scheduler, tried by ``/readyz`` while
    a dead thread has left the scheduler degraded (its success shows a thread serves again).
    """

    def __init__(
        self,
        run_batch: Callable[[list[R]], list[T]],
        *,
        max_batch: int = 1,
        workers: int = 1,
        name: str = "hark-asr",
        max_waiting: int = 256,
        idle_s: float = 30.0,
        probe: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        require_positive(max_batch=max_batch, workers=workers, max_waiting=max_waiting)
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._workers = workers
        self._name = name
        self._max_waiting = max_waiting
        self._idle_s = idle_s
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, _Entry[R, T]]] = []
        self._order = itertools.count()
        self._running = 0
        self._threads = 0
        self._idle = 0
        self._closed = False
        # Named as /readyz and the restart metric show it: "hark-whisper" is "whisper".
        self.health = health.EngineHealth(name.removeprefix("hark-"), probe=probe)
        self._keeper = health.ThreadKeeper(name, self._work, self.health)

    @property
    def waiting(self) -> int:
        """Requests queued and not yet handed to the model."""
        with self._cond:
            return len(self._heap)

    @property
    def running(self) -> int:
        """Requests in the batches the model is decoding now (0 when idle)."""
        with self._cond:
            return self._running

    async def run(self, request: R, urgency: Urgency) -> T:
        """Queue ``request`` at ``urgency`` and wait for its result.

        Cancelling the awaiting task removes the request if it still waits, so it never
        runs; if its batch is already running, the result is dropped. An exception raised
        by ``run_batch`` is raised here, for every request of that batch. Raises
        ``SchedulerFullError`` when ``max_waiting`` requests already wait, and
        ``RuntimeError`` once the scheduler is closed.
        """
        loop = asyncio.get_running_loop()
        entry: _Entry[R, T] = _Entry(request, loop, loop.create_future())
        item = (int(urgency), next(self._order), entry)
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            if len(self._heap) >= self._max_waiting:
                raise SchedulerFullError(
                    f"{self._name}: {len(self._heap)} requests already wait for the model"
                )
            heapq.heappush(self._heap, item)
            if self._idle == 0 and self._threads < self._workers:
                self._threads += 1
                self._keeper.start()
            self._cond.notify()
        try:
            return await entry.future
        except asyncio.CancelledError:
            with self._cond:
                if entry.waiting:
                    entry.waiting = False
                    self._heap.remove(item)
                    heapq.heapify(self._heap)
            raise

    def close(self) -> None:
        """Refuse new requests and fail the waiting ones; a running batch finishes.

        The worker threads end once they have nothing left to run.
        """
        with self._cond:
            self._closed = True
            left = [entry for _, _, entry in self._heap]
            self._heap.clear()
            for entry in left:
                entry.waiting = False
            self._cond.notify_all()
        for entry in left:
            self._post(entry, _fail, RuntimeError(f"{self._name} is closed"))
        self.health.close()

    def _take(self) -> list[_Entry[R, T]] | None:
        """The next batch, waiting for one; ``None`` when the thread should end."""
        with self._cond:
            while True:
                while not self._heap:
                    if self._closed:
                        self._threads -= 1
                        return None
                    self._idle += 1
                    woken = self._cond.wait(self._idle_s)
                    self._idle -= 1
                    if not woken and not self._heap:
                        self._threads -= 1
                        return None
                batch = self._batch()
                if batch:
                    self._running += len(batch)
                    return batch
                # Only deferred work waits: a new request wakes the thread, other models'
                # work does not, so it looks again shortly.
                self._cond.wait(_DEFER_POLL_S)

    def _batch(self) -> list[_Entry[R, T]]:
        """Take the head of the queue, up to ``max_batch`` requests, less the deferred ones
        (called with the lock held; empty when only deferred work waits)."""
        batch: list[_Entry[R, T]] = []
        defer: bool | None = None
        now = time.monotonic()
        while self._heap and len(batch) < self._max_batch:
            urgency, _, entry = self._heap[0]
            if urgency >= Urgency.TIMES:
                if defer is None:
                    defer = activity.someone_waits_now()
                # In the order they came: the ones after this are younger still.
                if defer and now - entry.queued < DEFER_LIMIT_S:
                    break
            heapq.heappop(self._heap)
            entry.waiting = False
            batch.append(entry)
        return batch

    def _work(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not self._decode(batch):
                return
            # Not held while the next batch is waited for: finished requests (their audio,
            # an engine's iterator) are let go at once.
            del batch

    def _decode(self, batch: list[_Entry[R, T]]) -> bool:
        """Run ``batch`` and hand out its results; False when this thread must end."""
        # A crashed thread's successor is on its way before the callers hear of it.
        results, error, alive = self._keeper.run(lambda: self._results(batch))
        self._done(len(batch))
        if error is not None:
            for entry in batch:
                self._post(entry, _fail, error)
        else:
            for entry, result in zip(batch, cast("list[T]", results), strict=True):
                self._post(entry, _deliver, result)
        return alive

    def _results(self, batch: list[_Entry[R, T]]) -> list[T]:
        results = self._run_batch([entry.request for entry in batch])
        if len(results) != len(batch):
            raise RuntimeError(f"{self._name}: {len(results)} results for {len(batch)} requests")
        return results

    def _done(self, count: int) -> None:
        with self._cond:
            self._running -= count

    @staticmethod
    def _post(
        entry: _Entry[R, T],
        deliver: Callable[[asyncio.Future[T], _V], None],
        value: _V,
    ) -> None:
        # A RuntimeError says the caller's loop has closed: nobody is left to receive it.
        with contextlib.suppress(RuntimeError):
            entry.loop.call_soon_threadsafe(deliver, entry.future, value)

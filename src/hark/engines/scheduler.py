"""Due-first scheduling of model calls shared by many sessions (design principle 2).

A model that several sessions share runs one call at a time per worker thread. Run in the
order they arrive, the calls of a reply someone waits for in silence queue behind calls whose
listeners still have seconds of audio to hear. ``DueFirstScheduler`` runs each call by when
its result is needed instead, and drops calls cancelled while they wait, so that work nobody
will use never runs.

A call that raises an ``Exception`` fails alone. One that raises anything else (``SystemExit``,
``KeyboardInterrupt`` from a native extension…) kills its thread: that call fails with
``EngineThreadCrashedError``, a new thread takes the dead one's place, and the engine reports
itself degraded (:mod:`hark.engines.health`) until a call succeeds again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from hark.engines import health

__all__ = ["DueFirstScheduler", "SchedulerFullError", "require_positive"]

_T = TypeVar("_T")


def _nothing() -> None:
    pass


def require_positive(**sizes: int) -> None:
    """Refuse, with a ``ValueError`` naming it, the first of a scheduler's ``sizes`` (workers,
    batch, queue bounds) below 1: none of them works at 0."""
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


class SchedulerFullError(RuntimeError):
    """More calls wait than the scheduler holds; the caller's request fails, not the others'."""


class DueFirstScheduler:
    """Runs calls on up to ``workers`` threads (by default half the cores), the one due
    soonest first.

    ``due`` is a ``time.monotonic()`` instant: when the listener would run out of what it
    already has. Threads start as calls come and end after ``idle_s`` without work, so an
    engine no longer used leaves none behind. At most ``max_waiting`` calls wait; more raise
    ``SchedulerFullError`` (each session waits for one call at a time, so the bound is only
    reached when far more sessions share the model than it can serve).
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        name: str = "hark-engine",
        idle_s: float = 30.0,
        max_waiting: int = 1024,
    ) -> None:
        if workers is None:
            workers = max(1, (os.cpu_count() or 2) // 2)
        require_positive(workers=workers)
        self._workers = workers
        self._name = name
        self._idle_s = idle_s
        self._max_waiting = max_waiting
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, concurrent.futures.Future[Any], Callable[[], Any]]] = []
        self._order = itertools.count()
        self._started = 0
        # Named as /readyz and the restart metric show it: "hark-piper" is "piper". While
        # degraded, /readyz sends a call that does nothing through a thread.
        self.health = health.EngineHealth(
            name.removeprefix("hark-"), probe=lambda: self.run(0.0, _nothing)
        )
        self._keeper = health.ThreadKeeper(name, self._work, self.health)

    @property
    def threads(self) -> int:
        """Worker threads running now."""
        with self._cond:
            return self._started

    def submit(self, due: float, call: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Queue ``call`` to run by ``due``; cancel the future to drop it while it waits.

        Raises ``SchedulerFullError`` when ``max_waiting`` calls already wait.
        """
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._cond:
            if len(self._heap) >= self._max_waiting:
                raise SchedulerFullError(
                    f"{self._name}: {len(self._heap)} calls already wait for the model"
                )
            heapq.heappush(self._heap, (due, next(self._order), future, call))
            if self._started < self._workers:
                self._started += 1
                self._keeper.start()
            self._cond.notify()
        return future

    async def run(self, due: float, call: Callable[[], _T]) -> _T:
        """``submit`` and wait for the result; cancelling drops the call if it has not begun
        (a call already running completes unseen)."""
        return await asyncio.wrap_future(self.submit(due, call))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    if not self._cond.wait(timeout=self._idle_s) and not self._heap:
                        self._started -= 1
                        return
                _, _, future, call = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue
            result, error, alive = self._keeper.run(call)
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
            if not alive:
                return
            # Drop the references before waiting: a finished request must not stay alive here.
            del future, call

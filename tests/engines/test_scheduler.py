"""The due-first scheduler: calls run by when their result is needed, cancelled ones never."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import pytest

from hark.engines.scheduler import DueFirstScheduler, SchedulerFullError

# Bounds a hang, never speed.
LIVENESS_S = 30.0


def blocked(scheduler: DueFirstScheduler) -> threading.Event:
    """Occupy the scheduler's one worker until the returned event is set."""
    gate = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(LIVENESS_S)

    scheduler.submit(0.0, hold)
    assert started.wait(LIVENESS_S)
    return gate


def test_the_soonest_due_runs_first_and_cancelled_calls_never() -> None:
    scheduler = DueFirstScheduler(workers=1)
    gate = blocked(scheduler)
    ran: list[str] = []
    futures = {
        name: scheduler.submit(due, functools.partial(ran.append, name))
        for name, due in (("late", 30.0), ("now", 1.0), ("soon", 2.0), ("dropped", 1.5))
    }
    assert futures["dropped"].cancel()
    gate.set()
    for name, future in futures.items():
        if name != "dropped":
            future.result(timeout=LIVENESS_S)
    assert ran == ["now", "soon", "late"]


def test_calls_of_the_same_due_run_in_the_order_given() -> None:
    scheduler = DueFirstScheduler(workers=1)
    gate = blocked(scheduler)
    ran: list[int] = []
    futures = [scheduler.submit(5.0, functools.partial(ran.append, n)) for n in range(5)]
    gate.set()
    for future in futures:
        future.result(timeout=LIVENESS_S)
    assert ran == [0, 1, 2, 3, 4]


def test_errors_go_to_the_caller_and_the_worker_goes_on() -> None:
    def fail() -> None:
        raise ValueError("broken model")

    scheduler = DueFirstScheduler(workers=1)
    with pytest.raises(ValueError, match="broken model"):
        scheduler.submit(0.0, fail).result(timeout=LIVENESS_S)
    assert scheduler.submit(0.0, lambda: 42).result(timeout=LIVENESS_S) == 42


def test_the_waiting_calls_are_bounded() -> None:
    scheduler = DueFirstScheduler(workers=1, max_waiting=2)
    gate = blocked(scheduler)
    waiting = [scheduler.submit(1.0, lambda: None) for _ in range(2)]
    with pytest.raises(SchedulerFullError):
        scheduler.submit(0.0, lambda: None)
    gate.set()
    for future in waiting:
        future.result(timeout=LIVENESS_S)
    assert scheduler.submit(0.0, lambda: 7).result(timeout=LIVENESS_S) == 7


async def test_cancelling_a_waiting_run_drops_its_call() -> None:
    scheduler = DueFirstScheduler(workers=1)
    gate = await asyncio.to_thread(blocked, scheduler)
    ran: list[str] = []
    waiting = asyncio.create_task(scheduler.run(1.0, functools.partial(ran.append, "dropped")))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set()
    # Calls run in due order on the one worker, so once a later one ran, the dropped one
    # would have run before it.
    assert await scheduler.run(2.0, lambda: "after") == "after"
    assert ran == []


def test_idle_workers_end_and_come_back() -> None:
    scheduler = DueFirstScheduler(workers=1, idle_s=0.05)
    assert scheduler.submit(0.0, lambda: 1).result(timeout=LIVENESS_S) == 1
    deadline = time.monotonic() + LIVENESS_S
    while scheduler.threads:
        assert time.monotonic() < deadline, "the idle worker did not end"
        time.sleep(0.01)
    assert scheduler.submit(0.0, lambda: 2).result(timeout=LIVENESS_S) == 2
    assert scheduler.threads == 1


def test_workers_grow_only_to_the_limit() -> None:
    scheduler = DueFirstScheduler(workers=2)
    gates = [threading.Event() for _ in range(3)]
    futures = [scheduler.submit(0.0, functools.partial(g.wait, LIVENESS_S)) for g in gates]
    assert scheduler.threads == 2
    for gate in gates:
        gate.set()
    for future in futures:
        future.result(timeout=LIVENESS_S)

"""One timer for the playout of all calls: every callback per tick, a grid that skips."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from hark.transports.ticker import PlayoutTicker


async def test_every_callback_runs_once_per_tick_and_the_timer_stops_with_the_last() -> None:
    ticker = PlayoutTicker(0.005)
    runs = {"a": 0, "b": 0}
    done = asyncio.Event()

    def a() -> None:
        runs["a"] += 1

    def b() -> None:
        runs["b"] += 1
        if runs["b"] == 5:
            done.set()

    ticker.add(a)
    ticker.add(b)
    await done.wait()
    assert runs == {"a": ticker.ticks, "b": ticker.ticks}
    ticker.remove(a)
    ticker.remove(b)
    stopped_at = ticker.ticks
    await asyncio.sleep(0.05)
    assert ticker.ticks == stopped_at and len(ticker) == 0


async def test_a_callback_may_remove_itself_and_add_another() -> None:
    period = 0.01
    ticker = PlayoutTicker(period)
    loop = asyncio.get_running_loop()
    times: list[float] = []
    done = asyncio.Event()

    def second() -> None:
        times.append(loop.time())
        if len(times) == 5:
            ticker.remove(second)
            done.set()

    def first() -> None:
        times.append(loop.time())
        ticker.remove(first)
        ticker.add(second)

    ticker.add(first)
    await done.wait()
    # Removing the last callback and adding another in the same tick keeps the one timer:
    # the new callback runs from the next tick on (uvloop's clock counts whole ms).
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(gap >= period - 0.002 for gap in gaps), gaps
    assert ticker.ticks == 5


async def test_a_failing_callback_is_dropped_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticker = PlayoutTicker(0.005)
    good = 0
    done = asyncio.Event()

    def bad() -> None:
        raise RuntimeError("boom")

    def fine() -> None:
        nonlocal good
        good += 1
        if good == 3:
            done.set()

    ticker.add(bad)
    ticker.add(fine)
    await done.wait()
    ticker.remove(fine)
    assert len(ticker) == 0
    assert sum("playout tick failed" in r.message for r in caplog.records) == 1


async def test_ticks_missed_by_a_stalled_loop_are_skipped_not_burst() -> None:
    period = 0.01
    ticker = PlayoutTicker(period)
    loop = asyncio.get_running_loop()
    times: list[float] = []
    done = asyncio.Event()

    def tick() -> None:
        times.append(loop.time())
        if len(times) == 1:
            # The loop stalls for five periods.
            time.sleep(5 * period)
        if len(times) == 4:
            ticker.remove(tick)
            done.set()

    ticker.add(tick)
    await done.wait()
    # After the stall the ticks go on a period apart (uvloop's clock counts whole ms).
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert gaps[0] >= 5 * period - 0.001
    assert all(gap >= period - 0.002 for gap in gaps[1:]), gaps

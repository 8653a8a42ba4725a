"""One timer for the playout of all calls: every callback per tick, a grid that skips."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace

import pytest

import hark.transports.ticker
from hark.transports.ticker import PlayoutTicker


class Timer:
    """A timer of :class:`HandLoop`."""

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class HandLoop:
    """The part of an event loop the ticker uses, on a clock that moves only when a timer
    is run (to its time) or a callback moves it (a stall): where the ticks fall is then the
    ticker's doing, not the machine's."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        self.timers.append(timer)
        return timer

    def pending(self) -> list[Timer]:
        return [t for t in self.timers if not t.cancelled]

    def run(self) -> None:
        """Run the timers, earliest first, until none is left."""
        while pending := self.pending():
            # The ticker keeps one timer, whatever its callbacks add and remove.
            assert len(pending) == 1, [t.when for t in pending]
            (timer,) = pending
            self.timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback()


@pytest.fixture
def hand_loop(monkeypatch: pytest.MonkeyPatch) -> HandLoop:
    """The ticker's running loop is a :class:`HandLoop` (only the ticker module sees it)."""
    loop = HandLoop()
    monkeypatch.setattr(
        hark.transports.ticker, "asyncio", SimpleNamespace(get_running_loop=lambda: loop)
    )
    return loop


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


def test_a_callback_may_remove_itself_and_add_another(hand_loop: HandLoop) -> None:
    period = 0.25
    ticker = PlayoutTicker(period)
    times: list[float] = []

    def second() -> None:
        times.append(hand_loop.time())
        if len(times) == 5:
            ticker.remove(second)

    def first() -> None:
        times.append(hand_loop.time())
        ticker.remove(first)
        ticker.add(second)

    ticker.add(first)
    hand_loop.run()
    # Removing the last callback and adding another in the same tick keeps the one timer
    # (HandLoop.run checks it): the new callback runs from the next tick on, on the grid.
    assert times == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert ticker.ticks == 5 and len(ticker) == 0


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


def test_ticks_missed_by_a_stalled_loop_are_skipped_not_burst(hand_loop: HandLoop) -> None:
    period = 0.25
    ticker = PlayoutTicker(period)
    times: list[float] = []

    def tick() -> None:
        times.append(hand_loop.time())
        if len(times) == 1:
            # The loop stalls for five periods.
            hand_loop.now += 5 * period
        if len(times) == 4:
            ticker.remove(tick)

    ticker.add(tick)
    hand_loop.run()
    # The grid points the stall passed (0.25 to 1.25) are skipped, not run in a burst; the
    # ticks go on from the next grid point, a period apart.
    assert times == [0.0, 1.5, 1.75, 2.0]
    assert ticker.ticks == 4

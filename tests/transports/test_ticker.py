"""One timer for the playout of all calls: every callback per tick, a grid that skips."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from types import SimpleNamespace

import pytest

import hark.transports.ticker
from hark.transports.playout import Playout
from hark.transports.ticker import Pacer, PlayoutTicker


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


class Stream:
    """A call's reply as the pacer sees it: a real ``Playout`` (no clock of its own is read:
    the pacer reads the schedule at the tick's grid time) and what was sent when."""

    def __init__(self, rate: int, log: list[tuple[str, float]], name: str) -> None:
        self.playout = Playout(rate, clock=lambda: math.nan)
        self.log = log
        self.name = name
        self.due: list[float] = []

    def send_frame(self, due: float) -> None:
        self.playout.next_frame()
        self.due.append(due)
        self.log.append((self.name, due))

    def frames_sent(self) -> None:
        self.log.append((f"{self.name} done", math.nan))


def test_one_timer_paces_two_transports_calls_on_their_own_schedules(
    hand_loop: HandLoop,
) -> None:
    period = 0.02
    pacer = Pacer(PlayoutTicker(period))
    log: list[tuple[str, float]] = []
    # A phone call's 8 kHz G.711 playout and a browser call's 48 kHz Opus one.
    sip, webrtc = Stream(8000, log, "sip"), Stream(48000, log, "webrtc")
    pacer.add(sip)
    hand_loop.now = 0.013  # the second call joins between ticks, off the grid
    pacer.add(webrtc)

    def stall_then_stop() -> None:
        if len(sip.due) == 5:
            hand_loop.now += 0.5
        if len(sip.due) == 12:
            pacer.remove(sip)
            pacer.remove(webrtc)
            pacer.ticker.remove(stall_then_stop)

    pacer.ticker.add(stall_then_stop)
    hand_loop.run()  # checks that one timer serves both calls throughout
    assert len(pacer) == 0 and len(pacer.ticker) == 0
    # Each call's frames are due on the tick grid, whenever the call joined, one a tick.
    for stream in (sip, webrtc):
        assert all(round(due / period, 6).is_integer() for due in stream.due), stream.due
    # Every tick sends both calls' frames before either call's follow-up work runs.
    for tick in range(len(log) // 4):
        names = [name for name, _ in log[4 * tick : 4 * tick + 4]]
        assert names in (["sip", "webrtc", "sip done", "webrtc done"],), names
    # The stall restarted both schedules (half a second skipped, not sent in a burst).
    assert sip.playout.late_restarts == webrtc.playout.late_restarts == 1
    assert sip.playout.frames_skipped >= 24 and webrtc.playout.frames_skipped >= 24
    gaps = [b - a for a, b in itertools.pairwise(sip.due)]
    assert max(gaps) > 0.5 and sum(gap > period * 1.5 for gap in gaps) == 1


def test_a_stream_may_take_its_frames_ahead_of_time(hand_loop: HandLoop) -> None:
    period = 0.02
    pacer = Pacer(PlayoutTicker(period))
    log: list[tuple[str, float]] = []
    # A peer that buffers (Twilio's media stream) takes five frames ahead of their time.
    ahead = Stream(8000, log, "ahead")
    pacer.add(ahead, lead_s=0.1)

    def stop() -> None:
        if pacer.ticker.ticks == 3:
            pacer.remove(ahead)
            pacer.ticker.remove(stop)

    pacer.ticker.add(stop)
    hand_loop.run()
    # The first tick sends its own frame and those due within the lead, each later tick one
    # more.
    assert len(ahead.due) == 6 + 1 + 1
    assert ahead.due[:6] == [pytest.approx(n * period) for n in range(6)]


def test_a_stream_that_fails_is_dropped_and_the_others_go_on(
    hand_loop: HandLoop, caplog: pytest.LogCaptureFixture
) -> None:
    pacer = Pacer(PlayoutTicker(0.02))
    log: list[tuple[str, float]] = []
    good, bad = Stream(8000, log, "good"), Stream(8000, log, "bad")

    def fail(due: float) -> None:
        raise RuntimeError("boom")

    bad.send_frame = fail  # type: ignore[method-assign]
    pacer.add(bad)
    pacer.add(good)

    def stop() -> None:
        if len(good.due) == 3:
            pacer.remove(good)
            pacer.ticker.remove(stop)

    pacer.ticker.add(stop)
    hand_loop.run()
    assert len(good.due) == 3 and len(pacer) == 0
    assert sum("pacing failed" in r.message for r in caplog.records) == 1

"""The per-connection input budget on a fake clock: a token bucket of event-loop seconds, and
the gate that pauses reading, holds parsed input in order and hands it over on refill."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import pytest

from hark.transports.input_budget import InputBudget, InputGate


def test_a_budget_charges_refills_at_its_share_and_caps_at_its_burst() -> None:
    budget = InputBudget(0.0, share=0.1, burst=0.3, resume=0.01)
    assert budget.spend(0.2, now=0.0) == 0.0
    assert budget.tokens == pytest.approx(0.1)
    # Overdrawn by 0.05 s: reading waits until 0.01 s is back, at 0.1 s per second.
    assert budget.spend(0.15, now=0.0) == pytest.approx(0.6)
    # Ten idle seconds would give a whole second; the bucket holds only its burst.
    assert budget.spend(0.0, now=10.0) == 0.0
    assert budget.tokens == pytest.approx(0.3)


def test_one_input_costlier_than_the_burst_is_handled_then_paid_for() -> None:
    budget = InputBudget(0.0, share=0.1, burst=0.3, resume=0.01)
    wait = budget.spend(0.5, now=0.0)
    assert wait == pytest.approx((0.01 + 0.2) / 0.1)
    assert budget.spend(0.0, now=wait) == 0.0
    assert budget.tokens == pytest.approx(0.01)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Timer:
    def __init__(self, delay: float, callback: Callable[[], None]) -> None:
        self.delay = delay
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """The gate's ``call_later``, fired by the test on the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.timers: list[Timer] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(delay, callback)
        self.timers.append(timer)
        return timer

    def fire(self) -> float:
        """Run the next timer when it is due; how long it waited."""
        timer = self.timers.pop(0)
        assert not timer.cancelled
        self.clock.now += timer.delay
        timer.callback()
        return timer.delay


class Connection:
    """What the gate acts on: reading paused or not, and the inputs delivered, in order."""

    def __init__(self) -> None:
        self.reading = True
        self.pauses = 0
        self.delivered: list[int] = []

    def pause(self) -> None:
        if self.reading:
            self.pauses += 1
        self.reading = False

    def resume(self) -> None:
        self.reading = True


def make_gate(
    clock: FakeClock,
    connection: Connection,
    throttled: list[float],
    cost: float,
    quantum: float = 0.005,
    full_quantum: float | None = None,
) -> tuple[InputGate[int], FakeLoop]:
    gate: InputGate[int]
    loop = FakeLoop(clock)

    def deliver(item: int) -> None:
        start = clock()
        connection.delivered.append(item)
        clock.now += cost
        gate.spent(start)

    gate = InputGate(
        InputBudget(clock(), share=0.1, burst=0.05, resume=0.01),
        pause_reading=connection.pause,
        resume_reading=connection.resume,
        deliver=deliver,
        throttled=throttled.append,
        clock=clock,
        loop=cast(asyncio.AbstractEventLoop, loop),
        quantum=quantum,
        full_quantum=quantum if full_quantum is None else full_quantum,
    )
    return gate, loop


async def test_a_dry_budget_pauses_reading_holds_the_rest_and_delivers_it_in_order() -> None:
    clock = FakeClock()
    connection = Connection()
    throttled: list[float] = []
    # A quantum out of the way: this is about the budget running dry.
    gate, loop = make_gate(clock, connection, throttled, cost=0.02, quantum=1.0)

    # One read's worth of parsed inputs, each costing 20 ms, handed over as the parser does.
    for item in range(10):
        if gate.holding:
            gate.hold(item)
        else:
            start = clock()
            connection.delivered.append(item)
            clock.now += 0.02
            gate.spent(start)
    # 50 ms of burst: three inputs (the third overdraws it), then the rest is held.
    assert connection.delivered == [0, 1, 2]
    assert not connection.reading
    assert gate.held == 7

    waiting = asyncio.ensure_future(gate.wait())
    paused = 0.0
    rounds = 0
    while gate.holding:
        assert not connection.reading
        before = len(connection.delivered)
        paused += loop.fire()
        rounds += 1
        # Each refill (10 ms at least) admits one held input or more, in order; the last
        # one may overdraw the budget again, and reading resumes only after its refill.
        assert len(connection.delivered) > before or gate.held == 0
        assert connection.delivered == list(range(len(connection.delivered)))
    await waiting
    assert connection.delivered == list(range(10))
    assert connection.reading
    assert rounds > 1
    # Reading stayed paused through the refills and the handling of the seven held inputs.
    assert throttled == [pytest.approx(paused + 7 * 0.02)]
    gate.close()


async def test_a_session_within_its_budget_is_never_paused() -> None:
    clock = FakeClock()
    connection = Connection()
    throttled: list[float] = []
    gate, loop = make_gate(clock, connection, throttled, cost=0.0)
    # Fifty 20 ms appends a second at 60 us each, for a minute: 0.3% of a core.
    for _ in range(3000):
        assert not gate.holding
        # Each append comes in a read of its own: a pass of the loop.
        gate.new_pass()
        start = clock()
        clock.now += 60e-6
        gate.spent(start)
        clock.now += 0.02 - 60e-6
    await gate.wait()
    assert connection.pauses == 0
    assert loop.timers == []
    assert throttled == []
    gate.close()


async def test_a_pass_past_its_quantum_holds_the_rest_for_the_next_pass() -> None:
    clock = FakeClock()
    connection = Connection()
    throttled: list[float] = []
    gate, loop = make_gate(clock, connection, throttled, cost=0.002)
    gate.new_pass()
    # A read of twenty 2 ms inputs, with the budget (50 ms) far from dry.
    for item in range(20):
        if gate.holding:
            gate.hold(item)
        else:
            start = clock()
            connection.delivered.append(item)
            clock.now += 0.002
            gate.spent(start)
    # Past the 5 ms quantum the rest waits for the loop's next pass, not for a refill.
    assert connection.delivered == list(range(3))
    assert not connection.reading
    assert loop.timers[0].delay == 0.0
    assert loop.fire() == 0.0
    assert connection.delivered == list(range(6))
    while gate.holding:
        loop.fire()
    assert connection.delivered == list(range(20))
    assert connection.reading
    gate.close()


async def test_a_connection_with_a_full_budget_gets_the_longer_quantum() -> None:
    clock = FakeClock()
    connection = Connection()
    throttled: list[float] = []
    gate, loop = make_gate(clock, connection, throttled, cost=0.002, full_quantum=0.02)

    def read(items: range) -> None:
        gate.new_pass()
        for item in items:
            if gate.holding:
                gate.hold(item)
            else:
                start = clock()
                connection.delivered.append(item)
                clock.now += 0.002
                gate.spent(start)

    # A client that sends no faster than it is served: its whole read (16 ms) goes through.
    read(range(8))
    assert connection.delivered == list(range(8))
    assert connection.reading
    # At once again: the bucket has not refilled, so the 5 ms quantum holds the rest.
    read(range(8, 28))
    assert connection.delivered == list(range(11))
    assert not connection.reading
    while gate.holding:
        loop.fire()
    assert connection.delivered == list(range(28))
    gate.close()


async def test_closing_a_paused_gate_drops_what_it_holds_and_resumes_reading() -> None:
    clock = FakeClock()
    connection = Connection()
    throttled: list[float] = []
    gate, loop = make_gate(clock, connection, throttled, cost=0.02)
    start = clock()
    clock.now += 1.0
    gate.spent(start)
    gate.hold(1)
    assert not connection.reading
    clock.now += 0.5
    gate.close()
    await gate.wait()
    assert loop.timers[0].cancelled
    assert connection.reading
    assert connection.delivered == []
    assert throttled == [pytest.approx(0.5)]

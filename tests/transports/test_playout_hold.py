"""Holding a response's playout while speech over it is judged (``Playout.hold``): silence
in its place, then it goes on from where it was, or a clear reports what was heard before."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from hark.transports.playout import Playout

from .conftest import Listener

RATE = 8000
FRAME = RATE // 50


class Clock:
    def __call__(self) -> float:
        return 100.0


def ramp(n: int, start: int = 1) -> npt.NDArray[np.int16]:
    return (np.arange(start, start + n) % 30000).astype(np.int16)


def started(listener: Listener) -> Playout:
    playout = Playout(RATE, clock=Clock())
    playout.attach(listener)
    playout.play("resp_1", "item_1", ramp(RATE), RATE)
    playout.finish("resp_1")
    for _ in range(5):
        playout.next_frame()
    return playout


def test_a_held_response_is_silent_then_goes_on_where_it_was() -> None:
    listener = Listener()
    playout = started(listener)
    playout.hold("resp_1")
    for _ in range(30):
        assert playout.next_frame() is playout.silence
    playout.resume("resp_1")
    assert np.array_equal(playout.next_frame(), ramp(FRAME, 5 * FRAME + 1))
    # Nothing of it was lost: it stops after all its samples, 45 frames later.
    frames = [playout.next_frame() for _ in range(50 - 6)]
    assert frames[-1] is not playout.silence
    assert ("stopped", "resp_1") in listener.log


async def test_a_clear_while_held_reports_what_was_heard_before_the_hold() -> None:
    listener = Listener()
    playout = started(listener)
    playout.hold("resp_1")
    for _ in range(20):
        playout.next_frame()
    playout.clear("resp_1")
    await asyncio.sleep(0)
    assert listener.log == [("started", "resp_1"), ("cleared", "resp_1", 100)]


def test_the_next_response_waits_behind_a_held_one() -> None:
    listener = Listener()
    playout = started(listener)
    playout.play("resp_2", "item_2", ramp(FRAME, 7), RATE)
    playout.hold("resp_1")
    playout.hold("resp_unknown")
    assert playout.next_frame() is playout.silence
    playout.resume("resp_unknown")
    assert playout.next_frame() is playout.silence

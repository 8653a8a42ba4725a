"""The capacity ramp adds calls a step at a time and stops at the first step that fails."""

from __future__ import annotations

from dataclasses import dataclass

from hark.bench.capacity import ramp


@dataclass
class Step:
    calls: int
    late: bool


class Calls:
    """Calls that set up unless told to fail, and windows late from ``late_from`` calls on
    (or, with ``once_late``, only the first window of each step)."""

    def __init__(self, late_from: int, fail_at: int | None = None, once_late: bool = False):
        self.up = 0
        self.late_from = late_from
        self.fail_at = fail_at
        self.once_late = once_late
        self.watched: list[int] = []
        self.shown: list[tuple[int, bool]] = []

    async def add(self, count: int) -> int:
        failures = 0
        for _ in range(count):
            if self.fail_at is not None and self.up + 1 >= self.fail_at:
                failures += 1
            else:
                self.up += 1
        return failures

    async def watch(self, failures: int) -> Step:
        first_look = not self.watched or self.watched[-1] != self.up
        self.watched.append(self.up)
        late = self.up >= self.late_from and (first_look or not self.once_late)
        return Step(self.up, late)

    def show(self, step: Step, again: bool) -> None:
        self.shown.append((step.calls, again))


async def run(calls: Calls, *, step: int = 4, max_calls: int = 20) -> tuple[list[Step], int]:
    return await ramp(
        step=step,
        max_calls=max_calls,
        settle_s=0,
        add=calls.add,
        watch=calls.watch,
        within=lambda s: not s.late,
        show=calls.show,
    )


async def test_the_ramp_stops_at_the_first_late_step_after_a_second_look() -> None:
    calls = Calls(late_from=12)
    steps, carried = await run(calls)
    assert [s.calls for s in steps] == [4, 8, 12]
    assert carried == 8
    # The late step was watched twice, the others once.
    assert calls.shown == [(4, False), (8, False), (12, False), (12, True)]


async def test_a_step_late_only_once_passes() -> None:
    calls = Calls(late_from=8, once_late=True)
    steps, carried = await run(calls, max_calls=10)
    # The last step adds only what is left under the maximum.
    assert [s.calls for s in steps] == [4, 8, 10]
    assert carried == 10


async def test_a_call_that_fails_to_set_up_ends_the_ramp_without_a_second_look() -> None:
    calls = Calls(late_from=100, fail_at=7)
    steps, carried = await run(calls)
    assert [s.calls for s in steps] == [4, 6]
    assert carried == 4
    assert calls.shown == [(4, False), (6, False)]

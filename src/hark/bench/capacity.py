"""The capacity ramp the WebRTC and SIP benches share: add calls a step at a time, watch
each step for a window, and stop at the first step that fails.

What a call is, how a window is watched and what counts as within bounds differ by
transport and are handed in; the ramp itself (how many calls each step adds, the second
look at a late step, where it stops, which figure is the capacity) is written once here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from hark.bench.report import cpu_seconds_if_running
from hark.config.options import BenchOption, shared


@dataclass(frozen=True)
class CapacityConfig:
    """The options a capacity bench shares: the calls timed first, and the ramp's."""

    calls: int
    capacity: bool
    step: int
    max_calls: int
    hold_s: float
    threshold_ms: float
    # A server on this machine: each step reports its CPU use.
    server_pid: int | None


def capacity_options(
    *, step: int, max_calls: int, threshold_ms: float, bound: str
) -> tuple[BenchOption | str, ...]:
    """The options of :class:`CapacityConfig`, with the bench's defaults; ``bound`` says
    what the threshold bounds ("p99 frame lateness")."""
    return (
        "calls",
        "capacity",
        "hold",
        shared("step", default=step),
        shared("max_calls", default=max_calls),
        shared(
            "threshold_ms",
            default=threshold_ms,
            help=f"{bound} that ends the ramp (default {threshold_ms:g})",
        ),
        shared(
            "server_pid", help="a local server's process id: report its CPU use per capacity step"
        ),
    )


class Step(Protocol):
    """What the ramp reads of a step's figures."""

    @property
    def calls(self) -> int:
        """The calls up during the step's window."""
        ...


S = TypeVar("S", bound=Step)
# What a bench times of each call it sets up one after another.
SetupT = TypeVar("SetupT")


@dataclass(kw_only=True)
class CapacityReport(Generic[SetupT, S]):
    """What a capacity bench measured, as the run fills it in: the calls set up one after
    another, then the ramp's steps and the calls it carried."""

    setup: list[SetupT] = field(default_factory=list)
    capacity: list[S] = field(default_factory=list)
    capacity_calls: int | None = None

    def knee(self) -> S | None:
        """The step of the calls carried (None before the ramp, or when no step passed)."""
        return next((s for s in self.capacity if s.calls == self.capacity_calls), None)


def ms_per_call_second(cores: float | None, calls: int) -> float | None:
    """A server's CPU per second of one call, in milliseconds, from its use over a step's
    window in cores; None without the server's use, or without calls."""
    if cores is None or not calls:
        return None
    return cores * 1000 / calls


class CpuMeter:
    """A local process's CPU use over a window that opens when the meter is made."""

    def __init__(self, pid: int | None) -> None:
        self._pid = pid
        self._cpu_s = cpu_seconds_if_running(pid)
        self._since = time.monotonic()

    def cores(self) -> float | None:
        """The CPU the process used since the window opened, in cores; None when no process
        was given, or it has gone."""
        cpu_s = cpu_seconds_if_running(self._pid)
        if self._cpu_s is None or cpu_s is None:
            return None
        return (cpu_s - self._cpu_s) / (time.monotonic() - self._since)


async def ramp(
    *,
    step: int,
    max_calls: int,
    settle_s: float,
    add: Callable[[int], Awaitable[int]],
    watch: Callable[[int], Awaitable[S]],
    within: Callable[[S], bool],
    show: Callable[[S, bool], None] | None = None,
    examine: Callable[[S], Awaitable[None]] | None = None,
) -> tuple[list[S], int]:
    """Ramp calls up to ``max_calls``, ``step`` at a time; the steps and the calls carried.

    ``add(n)`` sets up ``n`` more calls and returns how many failed; after ``settle_s``,
    ``watch(failures)`` measures one window of every call up. A step passes when no call
    failed to set up and ``within`` holds; a late window is watched again before the step
    fails, since one late window may be a neighbour's burst on a shared machine. ``show``
    prints a step (and whether it is the second look), ``examine`` looks further into a
    step before the ramp goes on (a profile). The calls carried are those of the last step
    that passed.
    """
    steps: list[S] = []
    calls = carried = 0
    while calls < max_calls:
        added = min(step, max_calls - calls)
        failures = await add(added)
        calls += added - failures
        await asyncio.sleep(settle_s)
        result = await watch(failures)
        if show is not None:
            show(result, False)
        if not failures and not within(result):
            result = await watch(failures)
            if show is not None:
                show(result, True)
        if examine is not None:
            await examine(result)
        steps.append(result)
        if failures or not within(result):
            break
        carried = result.calls
    return steps, carried

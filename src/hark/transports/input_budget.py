"""A per-connection budget of event-loop time for handling one client's input.

All sessions share one event loop. A client that sends as fast as the server reads would
otherwise be served as fast as it sends: each read brings a chunk of hundreds of its events,
all handled before the loop gets back to anyone else, so every other session waits behind
the flood (``hark bench fuzz --rate 0`` took a normal session's text turns from milliseconds
to seconds; docs/fuzzing.md, "A flood").

``InputBudget`` is a token bucket of seconds: the time spent handling a client's input is
charged to it, and it refills on wall time at ``SHARE`` of one core. ``InputGate`` acts on
it: when the bucket runs dry the connection stops reading (TCP backpressure then slows the
client, and nothing is lost), the frames already parsed from the chunk in hand are held in
order, and once the bucket has refilled they are delivered first and reading resumes. A
client within its budget is also paused after ``QUANTUM_SECONDS`` in one pass of the loop,
until the next pass: a full bucket would otherwise let each flooder spend a whole read's
worth of events (up to the burst) in every pass, and every other session wait that long.
A connection whose bucket is full when a pass starts gets ``FULL_QUANTUM_SECONDS`` in it
instead: it is one that sends no faster than it is served, however many of its frames a
busy loop finds waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Generic, TypeVar

# A share of one core per session: a session streaming 20 ms appends spends about 0.3% of a
# core on them (54 us each on the loaded 2-core development VM), so a client has to send
# thirty times faster than any real one before it is slowed; ten clients flooding at once
# still leave the loop for everyone else between their turns.
SHARE = 0.1
# Enough for one maximal append (15 MiB of base64 audio) handled without a pause: it took
# 0.17-0.33 s (median 0.24 s) on that VM under load, decode, resampling and the buffer included.
BURST_SECONDS = 0.3
# Reading resumes once this much has refilled, so that a throttled client is read in runs
# of about 10 ms rather than paused and resumed around every frame.
RESUME_SECONDS = 0.01
# The most one connection's input takes in one pass of the event loop before the rest waits
# for the next pass (a maximal append still goes through whole: an input is never split).
# Eight flooders each take up to this much of every pass, and a text turn waits on a few
# passes: with 5 ms a normal session's turns took 270 ms (p50) beside eight of them, with
# 1 ms 57 ms (docs/fuzzing.md, "A flood"); a session streaming 20 ms appends never reaches it.
QUANTUM_SECONDS = 0.001
# ... and the most for a connection whose bucket was full when the pass began. A real-time
# client's bucket is always full (it spends a few ms a second and gets 100), but behind a
# loop that takes 100 ms a pass its next read holds five 20 ms appends, which with their
# turn's work pass 1 ms: paused until the next pass, each such client's input came a pass
# later still, and at 150 callers with 20 ms appends 42 % of the loop's time went into
# frames handed over late by the gate. A flooder's bucket is never full after its first pass.
FULL_QUANTUM_SECONDS = 0.01

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class InputBudget:
    """A token bucket of event-loop seconds, refilled at ``share`` of wall time.

    ``spend`` charges the time one input took; the balance may go below zero (an input is
    always handled whole), and reading should then pause for the time ``spend`` returns.
    ``tokens`` is the balance at ``at``, the last charge (full at the start).
    """

    at: float
    _: KW_ONLY
    share: float = SHARE
    burst: float = BURST_SECONDS
    resume: float = RESUME_SECONDS
    tokens: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def full(self, now: float) -> bool:
        """Whether the bucket has refilled to its burst by ``now``."""
        return self.tokens + (now - self.at) * self.share >= self.burst

    def spend(self, seconds: float, now: float) -> float:
        """Charge ``seconds`` of handling at time ``now``; 0.0 to go on reading, else how
        long to stop reading for the balance to refill to ``resume``."""
        tokens = self.tokens + (now - self.at) * self.share
        if tokens > self.burst:
            tokens = self.burst
        tokens -= seconds
        self.tokens = tokens
        self.at = now
        if tokens >= 0.0:
            return 0.0
        return (self.resume - tokens) / self.share


@dataclass(slots=True, eq=False)
class InputGate(Generic[T]):
    """Stops reading a connection whose ``InputBudget`` ran dry, and holds its parsed input.

    The transport calls ``spent(start)`` after handling each input (``start`` from
    ``clock``), ``holding`` before handing one over (while True it goes to ``hold``), and
    ``await wait()`` before reading more input of its own. ``pause_reading`` and
    ``resume_reading`` act on the connection; ``deliver`` hands a held input over once the
    budget has refilled; ``throttled`` is told each stretch of time reading was paused.
    ``new_pass`` marks the start of a pass of the loop over this connection (a read).
    """

    budget: InputBudget
    _: KW_ONLY
    pause_reading: Callable[[], None]
    resume_reading: Callable[[], None]
    deliver: Callable[[T], None]
    throttled: Callable[[float], None] | None = None
    clock: Callable[[], float] = time.perf_counter
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    quantum: float = QUANTUM_SECONDS
    full_quantum: float = FULL_QUANTUM_SECONDS
    # Time spent on input in this pass of the loop, and what it may spend.
    _pass: float = field(default=0.0, init=False)
    _allowed: float = field(init=False)
    # Input parsed from the chunk being read when the budget ran dry: at most one read's
    # worth, since reading is paused again whenever something is held.
    _held: deque[T] = field(default_factory=deque, init=False)
    _timer: asyncio.TimerHandle | None = field(default=None, init=False)
    _paused_at: float | None = field(default=None, init=False)
    _open: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._allowed = self.quantum
        self._open.set()

    @property
    def holding(self) -> bool:
        """Input handed over now must be held: the budget is dry, or held input waits."""
        return self._timer is not None or bool(self._held)

    @property
    def held(self) -> int:
        """How many inputs are held."""
        return len(self._held)

    def new_pass(self) -> None:
        """The loop came back to this connection: its quantum starts again."""
        self._pass = 0.0
        self._allowed = self.full_quantum if self.budget.full(self.clock()) else self.quantum

    def spent(self, start: float) -> None:
        """An input was handled from ``start`` until now: charge it, pausing if dry (or
        until the next pass, past the quantum)."""
        now = self.clock()
        cost = now - start
        wait = self.budget.spend(cost, now)
        self._pass += cost
        if self._timer is not None or self._closed:
            return
        if wait > 0.0:
            self._pause(wait)
        elif self._pass > self._allowed:
            self._pause(0.0)

    def hold(self, item: T) -> None:
        """Keep ``item`` for delivery, in order, once the budget has refilled."""
        self._held.append(item)
        # Whatever resumed reading meanwhile (aiohttp's own queue), this read is the last.
        self.pause_reading()

    async def wait(self) -> None:
        """Return once reading is not paused by the budget."""
        if not self._open.is_set():
            await self._open.wait()

    def close(self) -> None:
        """Stop throttling: held input is dropped, reading resumes (to end the connection)."""
        self._closed = True
        self._held.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._reopen()

    def _pause(self, wait: float) -> None:
        if self._paused_at is None:
            self._paused_at = self.clock()
            self.pause_reading()
            self._open.clear()
        self._timer = self.loop.call_later(wait, self._refilled)

    def _refilled(self) -> None:
        self._timer = None
        self.new_pass()
        held = self._held
        while held and self._timer is None and not self._closed:
            self.deliver(held.popleft())
        if self._timer is None:
            self._reopen()

    def _reopen(self) -> None:
        if self._paused_at is None:
            return
        paused = self.clock() - self._paused_at
        self._paused_at = None
        self.resume_reading()
        self._open.set()
        if self.throttled is not None:
            self.throttled(paused)

"""Results handed from a model's thread to the event loops of the sessions that wait for them.

The thread appends a batch's results to each loop's :class:`Mailbox` and wakes the loop once,
with a callback that hands them out. But a loop under load runs that callback only after
everything queued before it: a whole pass over every socket with data, tens of milliseconds at
200 sessions. Meanwhile sessions keep handling input, and the first of them to call
:meth:`Mailbox.deliver` hands the results out instead. A result then waits for at most one
input's handling, and each stream still gets its own results in order. A future, a task
switch and a thread hop per 32 ms chunk would cost more than the model itself.

A chunk the model did not answer (dropped from a full queue, or in a batch that failed) still
gets its place in the order, as a :class:`Missed`, so that a stream's answers stay in step
with its audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Protocol

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Missed:
    """No answer for a chunk: ``error`` says why the model failed on it, or is None when the
    chunk was dropped from a full queue."""

    error: str | None = None


# The answer of every chunk dropped from a full queue.
DROPPED = Missed()


class Recipient(Protocol):
    """A stream that results are delivered to, on its loop."""

    @property
    def closed(self) -> bool:
        """A closed stream is given nothing more."""
        ...

    def take(self, outcomes: list[tuple[float | Missed, int]]) -> None:
        """The answers of one push (a probability, or a :class:`Missed` in a chunk's place,
        each with its epoch), in the order the stream's chunks were pushed."""
        ...


class Mailbox:
    """The results on their way to one event loop's streams, in the order they were computed.

    ``streams`` counts the loop's open streams, for the engine to know when to let it go.
    """

    __slots__ = ("loop", "results", "streams", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # No cap of its own: it holds one entry per push its streams made whose chunks the
        # model has run since the loop last handed them out, and a stream's chunks come in
        # real time.
        self.results: deque[tuple[Recipient, list[tuple[float | Missed, int]]]] = deque()
        self.streams = 0
        # A wake-up callback is queued on the loop and has not started. The thread appends
        # before it reads this, and the callback clears it before it empties the deque, so a
        # result is never left behind with no wake-up coming.
        self.woken = False

    def post(self, recipient: Recipient, outcomes: list[tuple[float | Missed, int]]) -> None:
        """From the model's thread: the answers of one of ``recipient``'s pushes (handed over:
        the thread keeps no reference); :meth:`wake` the loop after the batch's last."""
        self.results.append((recipient, outcomes))

    def wake(self) -> None:
        """From the model's thread: make sure the loop will hand out what was posted."""
        if self.woken:
            return
        self.woken = True
        # A closed loop raises RuntimeError: nobody is waiting for these results any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        self.woken = False
        self.deliver()

    def deliver(self) -> None:
        """On the loop: hand out every result here, oldest first."""
        results = self.results
        while results:
            recipient, outcomes = results.popleft()
            if recipient.closed:
                continue
            try:
                recipient.take(outcomes)
            except Exception:
                _log.exception("a VAD result handler failed")

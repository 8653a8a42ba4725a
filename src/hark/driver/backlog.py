"""The outgoing backlog: a session's server events on their way to a peer, bounded.

Each event is offered to the transport's ``send`` the moment it is made; what it refuses, and
all that follows while anything waits, queues for ``outgoing`` in order. A peer that stops
reading passes the bound within seconds of replies, and its session ends (design principle 9).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from hark.protocol.limits import MiB

# The most that waits in ``outgoing`` for a peer that does not read: a reply of several
# minutes of audio, made faster than real time for a client on a slow link, stays well under
# both; a client that stops reading passes one within seconds of replies.
MAX_BACKLOG_EVENTS = 10_000
MAX_BACKLOG_BYTES = 16 * MiB
# The reason (``SessionMetrics.ended``) and error code of a session closed for its backlog.
BACKLOG_EXCEEDED = "client_not_reading"


def backlog_reason(events: int, size: int) -> str:
    """The bounds a peer that stopped reading passed, as told to it."""
    size_limit = f"{size // MiB} MiB" if size % MiB == 0 else f"{size} bytes"
    return f"client is not reading events; backlog over {events} events or {size_limit}"


class Backlog:
    """One session's serialised server events, sent at once or queued for ``outgoing``."""

    __slots__ = ("_bytes", "_out", "_overflowed", "max_bytes", "max_events", "send", "stalled")

    def __init__(self, max_events: int, max_bytes: int) -> None:
        """At most ``max_events`` events, and ``max_bytes`` characters of them, wait."""
        self.max_events = max_events
        self.max_bytes = max_bytes
        # Room past the bound for the last error event and the end of the stream.
        self._out: asyncio.Queue[str | None] = asyncio.Queue(max_events + 2)
        self._bytes = 0
        # The transport's writer and its word for a peer that stopped reading (``send_with``).
        self.send: Callable[[str], bool] | None = None
        self.stalled: Callable[[str], None] | None = None
        # Set once the bound was passed: later events are dropped.
        self._overflowed = False

    @property
    def reason(self) -> str:
        """What a peer that passed the bound is told."""
        return backlog_reason(self.max_events, self.max_bytes)

    def emit(self, text: str) -> bool:
        """Send ``text``, or queue it behind what waits. False when it would pass the bound:
        the caller ends the session (``overflow``)."""
        if self._overflowed:
            return True
        send = self.send
        if send is not None and not self._out.qsize() and send(text):
            return True
        if self._out.qsize() >= self.max_events or self._bytes + len(text) > self.max_bytes:
            return False
        self._bytes += len(text)
        self._out.put_nowait(text)
        return True

    def overflow(self) -> tuple[int, int]:
        """Drop what waits and every later event; the events and characters dropped."""
        events, size = self._out.qsize(), self._bytes
        self._overflowed = True
        while not self._out.empty():
            self._out.get_nowait()
        self._bytes = 0
        return events, size

    def put_last(self, text: str) -> None:
        """Queue the error that tells an overflowed peer why its session ends (past the
        bound: the room kept for it)."""
        self._bytes += len(text)
        self._out.put_nowait(text)

    def end(self) -> None:
        """No more events: ``outgoing`` ends after those waiting, and the transport's
        callbacks, which refer back to the runner, are let go."""
        self.send = self.stalled = None
        self._out.put_nowait(None)

    async def outgoing(self) -> AsyncIterator[str]:
        """The events that waited, in order; ends with the session."""
        while (text := await self._out.get()) is not None:
            self._bytes -= len(text)
            yield text

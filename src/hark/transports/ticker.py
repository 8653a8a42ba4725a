"""One timer and one pacer for the reply audio of every call of a worker, whatever carries it
(WebRTC's ``rtp_audio``, SIP's ``media``, Twilio's media stream).

A timer per call costs a wake-up of the event loop per call every 20 ms: at fifty calls,
2500 wake-ups a second, each a few loop iterations of Python. ``PlayoutTicker`` wakes once
per period on a fixed grid and runs its callbacks in one pass. ``Pacer`` is its one
callback for media: each stream it paces keeps its own schedule, its ``Playout`` (frame *n*
due at start + n × 20 ms, restarted after a stall), and on each tick the pacer sends every
frame that schedule says is due, read at the tick's grid time rather than the time the tick
ran, so which tick sends a frame never depends on how late the loop ran it. A call joining
late or a tick that comes late changes nothing about which frames are due.

The server's ``hark.transports.call.CallHost`` builds the worker's one pacer; every call
registry takes it from there.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hark.transports.playout import Playout

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.02


class PlayoutTicker:
    """Calls every added callback once per ``period_s`` on the running loop's clock.

    The timer runs only while some callback is added. Ticks keep to a grid of the period:
    one that comes late does not move the next, and ticks missed altogether (a stalled
    loop) are skipped, not run in a burst. While callbacks run, ``tick_at`` is the grid
    time of the tick: the latest grid point at or before the loop's time.
    """

    def __init__(self, period_s: float = TICK_SECONDS) -> None:
        self.period_s = period_s
        self._callbacks: dict[Callable[[], None], None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._next = 0.0
        self._ticking = False
        self.ticks = 0
        self.tick_at = 0.0

    def __len__(self) -> int:
        return len(self._callbacks)

    def add(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on every tick from the next one on."""
        self._callbacks[callback] = None
        if self._timer is None and not self._ticking:
            loop = asyncio.get_running_loop()
            self._next = loop.time()
            self._timer = loop.call_at(self._next, self._tick)

    def remove(self, callback: Callable[[], None]) -> None:
        """Stop running ``callback``; the timer stops with the last one."""
        self._callbacks.pop(callback, None)
        if not self._callbacks and self._timer is not None and not self._ticking:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self.ticks += 1
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._next >= self.period_s:
            # A stalled loop ran this tick periods late: it belongs to the latest grid point.
            self._next += math.floor((now - self._next) / self.period_s) * self.period_s
        self.tick_at = self._next
        self._ticking = True
        try:
            # A copy: a callback may remove itself (its call ended) or add another.
            for callback in list(self._callbacks):
                try:
                    callback()
                except Exception:
                    logger.exception("playout tick failed; that call's playout is dropped")
                    self._callbacks.pop(callback, None)
        finally:
            self._ticking = False
        if not self._callbacks:
            self._timer = None
            return
        now = loop.time()
        self._next += self.period_s
        if self._next <= now:
            self._next += (int((now - self._next) / self.period_s) + 1) * self.period_s
        self._timer = loop.call_at(self._next, self._tick)


class PacedStream(Protocol):
    """A call's reply audio as a ``Pacer`` sends it: frames cut from ``playout`` on its
    schedule."""

    @property
    def playout(self) -> Playout:
        """The stream's reply audio and its schedule."""
        ...

    def send_frame(self, due: float) -> None:
        """The next frame is due at ``due`` (the ticker's clock): cut it from the playout,
        or let its time pass uncut (``Playout.pass_frame``), and send what there is."""
        ...

    def frames_sent(self) -> None:
        """Every stream's frames of this tick are out: do what waited for them."""
        ...


class Pacer:
    """Sends the frames of every added stream on ``ticker``, each on its playout's schedule.

    On each tick every stream sends each frame whose due time, less the stream's lead, is
    nearer this tick than the next (a lead of 0: each frame on the tick nearest its time; a
    peer that buffers, as Twilio, takes frames ahead of time), and then every stream's
    ``frames_sent`` runs, so that all packets leave before any stream's slower work (a
    SIP call's caller audio goes to voice activity detection there). A stream whose
    sending raises is logged and dropped; the others go on.
    """

    def __init__(self, ticker: PlayoutTicker | None = None) -> None:
        self.ticker = ticker if ticker is not None else PlayoutTicker()
        # Each stream's playout (read once: it is the stream's for life) and how far ahead of
        # a tick its frames may be due to go out on it.
        self._streams: dict[PacedStream, tuple[Playout, float]] = {}

    def __len__(self) -> int:
        return len(self._streams)

    def add(self, stream: PacedStream, *, lead_s: float = 0.0) -> None:
        """Pace ``stream`` from the next tick on, its frames sent ``lead_s`` ahead of time."""
        # With the half tick that rounds each frame to its nearest tick.
        self._streams[stream] = (stream.playout, lead_s + self.ticker.period_s / 2)
        if len(self._streams) == 1:
            self.ticker.add(self._tick)

    def remove(self, stream: PacedStream) -> None:
        """Stop pacing ``stream``; the ticker stops with the last one."""
        if self._streams.pop(stream, None) is not None and not self._streams:
            self.ticker.remove(self._tick)

    def _tick(self) -> None:
        tick_at = self.ticker.tick_at
        # A copy: a stream may end while the tick runs.
        streams = list(self._streams.items())
        for stream, (playout, within_s) in streams:
            try:
                while (delay := playout.due_in(tick_at)) < within_s:
                    stream.send_frame(tick_at + delay)
            except Exception:
                logger.exception("pacing failed; that call's playout is dropped")
                self.remove(stream)
        for stream, _ in streams:
            if stream in self._streams:
                stream.frames_sent()

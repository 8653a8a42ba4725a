"""One timer for the playout of every call of a worker, WebRTC (``rtp_audio``) or SIP (``media``).

A timer per call costs a wake-up of the event loop per call every 20 ms: at fifty calls,
2500 wake-ups a second, each a few loop iterations of Python. ``PlayoutTicker`` wakes once
per period and runs every call's tick in one pass; each call still keeps its own schedule
(its ``Playout``), so a call joining late or a tick that comes late changes nothing about
which frames are due.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.02


class PlayoutTicker:
    """Calls every added callback once per ``period_s`` on the running loop's clock.

    The timer runs only while some callback is added. Ticks keep to a grid of the period:
    one that comes late does not move the next, and ticks missed altogether (a stalled
    loop) are skipped, not run in a burst.
    """

    def __init__(self, period_s: float = TICK_SECONDS) -> None:
        self.period_s = period_s
        self._callbacks: dict[Callable[[], None], None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._next = 0.0
        self._ticking = False
        self.ticks = 0

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
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._next += self.period_s
        if self._next <= now:
            self._next += (int((now - self._next) / self.period_s) + 1) * self.period_s
        self._timer = loop.call_at(self._next, self._tick)

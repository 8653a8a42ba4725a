"""Event-loop lag: how late the loop runs a timer, which every coroutine on it suffers too.

A loop that falls behind (a blocking call, too many sessions for one core) delays every
event, VAD decision and audio frame of every session in the process by as much.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def monitor_loop_lag(observe: Callable[[float], None], interval_s: float = 0.1) -> None:
    """Sleep ``interval_s`` over and over and ``observe`` how late each wake-up was (seconds).

    Runs until cancelled; run it as a task on the loop to watch.
    """
    loop = asyncio.get_running_loop()
    while True:
        expected = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - expected))

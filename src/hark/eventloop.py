"""The event loop hark's processes run on."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on uvloop, as ``asyncio.run`` does on the standard loop.

    libuv's loop spends about half of what the standard one does on each socket read and
    callback; a server with hundreds of sessions makes tens of thousands of them a second.
    """
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)

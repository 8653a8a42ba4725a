"""The parent process of ``hark relay``: it starts the forwarding processes, starts again
those that die, and serves the sum of their counters as Prometheus metrics.

The forwarding processes are forked from this parent, which has imported what forwarding
needs and nothing else (``hark.cli`` imports no other command's module): a process started
again has nothing left to import, and none carries anything of the server, the engines or
aiortc (a small heap keeps the garbage collector's pauses short).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import mmap
import multiprocessing
import os
import signal
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

import numpy as np

from hark.cluster.redis import RedisStore
from hark.edge.flows import Address
from hark.edge.metrics import metrics_text
from hark.edge.relay import SLOTS, Counters, FlowMirror, Registry, Relay, RelayConfig

if TYPE_CHECKING:
    from aiohttp import web

logger = logging.getLogger(__name__)

# A forwarding process that keeps dying is started again at most this often.
RESTART_INTERVAL_S = 1.0
PR_SET_PDEATHSIG = 1


def supervise(config: RelayConfig, redis_url: str, workers: int, metrics: Address | None) -> int:
    """Run ``workers`` forwarding processes (restarted when they die) and the metrics server."""
    memory = mmap.mmap(-1, workers * SLOTS * 8)
    table = np.frombuffer(memory, np.int64).reshape(workers, SLOTS)
    context = multiprocessing.get_context("fork")
    processes: list[BaseProcess | None] = [None] * workers

    parent = os.getpid()

    def start(slot: int) -> None:
        process = context.Process(
            target=_forwarding_process,
            args=(config, redis_url, table[slot], parent),
            name=f"hark-relay-{slot}",
            daemon=True,
        )
        process.start()
        processes[slot] = process

    for slot in range(workers):
        start(slot)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        runner = await _serve_metrics(metrics, lambda: table.sum(axis=0)) if metrics else None
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RESTART_INTERVAL_S)
                for slot, process in enumerate(processes):
                    if process is not None and not process.is_alive() and not stop.is_set():
                        logger.error(
                            "relay process %d exited (%s); starting it again",
                            slot,
                            process.exitcode,
                        )
                        Counters(table[slot]).set("flows", 0)
                        start(slot)
        finally:
            if runner is not None:
                await runner.cleanup()

    asyncio.run(run())
    for process in processes:
        if process is not None and process.is_alive():
            process.terminate()
    for process in processes:
        if process is not None:
            process.join(5)
    return 0


def _forwarding_process(config: RelayConfig, redis_url: str, row: np.ndarray, parent: int) -> None:
    # A parent killed outright must not leave its children forwarding on the port.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    # Killed before the line above took effect, the parent has left this process to another
    # (init, or a subreaper). Compared with the parent's own id, not with 1: in a container
    # the parent is itself process 1, and a child that took 1 for an orphan's parent exited at
    # once, again every second, and nothing was forwarded.
    if os.getppid() != parent:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_forward(config, redis_url, Counters(row)))


async def _forward(config: RelayConfig, redis_url: str, counters: Counters) -> None:
    store = RedisStore(redis_url, config.fleet_secret)
    mirror = FlowMirror(store.client, config.idle_s, config.fleet_secret)
    relay = Relay(config, Registry(store), mirror, counters)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await relay.start()
    # What start-up made lives as long as the process: out of the collector's sight,
    # a full collection no longer walks it.
    gc.freeze()
    try:
        await stop.wait()
    finally:
        await relay.stop()
        await store.aclose()


async def _serve_metrics(address: Address, totals: Callable[[], np.ndarray]) -> web.AppRunner:
    # Imported after the forwarding processes have started, so that they do without it.
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=metrics_text(totals()), content_type="text/plain")

    app = web.Application()
    app.add_routes([web.get("/metrics", handle)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address[0], address[1]).start()
    logger.info("relay metrics on http://%s:%d/metrics", *address)
    return runner

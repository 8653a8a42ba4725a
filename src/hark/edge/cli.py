"""``hark relay``: the fleet's one public UDP port for WebRTC media.

Options also come from the environment: ``HARK_REDIS_URL``, ``HARK_FLEET_SECRET`` (prefer
it to ``--fleet-secret``, which other users of the machine can read in the process list).
With ``--workers N`` the relay runs N forwarding processes on the one port
(``SO_REUSEPORT``: the kernel spreads clients over them by address), a process that dies is
started again, and the parent serves the sum of their counters on ``--metrics-listen``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import logging
import mmap
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.process import BaseProcess

import numpy as np
from aiohttp import web

from hark.cluster.redis import RedisStore
from hark.edge.flows import Address, parse_address
from hark.edge.metrics import metrics_text
from hark.edge.relay import SLOTS, Counters, FlowMirror, Registry, Relay, RelayConfig
from hark.edge.route_hint import MIN_SECRET_BYTES

logger = logging.getLogger(__name__)

DEFAULT_LISTEN = "0.0.0.0:3478"
# A forwarding process that keeps dying is started again at most this often.
RESTART_INTERVAL_S = 1.0
PR_SET_PDEATHSIG = 1


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """The options of ``hark relay``."""
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"the public UDP address clients send media to (default {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--internal",
        default="0.0.0.0:0",
        metavar="HOST:PORT",
        help="where to send to workers from (default: any address, a free port per process)",
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help="the fleet's Redis: the worker registry and the mirrored flow table "
        "(default $HARK_REDIS_URL)",
    )
    parser.add_argument(
        "--fleet-secret",
        default=None,
        metavar="SECRET",
        help="the secret the workers sign their routing hints with (default "
        "$HARK_FLEET_SECRET, which is better: arguments are visible to other users)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N", help="forwarding processes (default 1)"
    )
    parser.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics over HTTP at /metrics (default: none)",
    )
    parser.add_argument(
        "--flow-idle",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="forget a flow after this long without a datagram from its client (default 30)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )


def command(options: dict[str, object]) -> int:
    """Run ``hark relay`` until SIGTERM or SIGINT; the exit status."""
    from hark.cli import configure_logging

    configure_logging(str(options["log_level"]))
    redis_url = options.get("redis_url") or os.environ.get("HARK_REDIS_URL")
    secret = options.get("fleet_secret") or os.environ.get("HARK_FLEET_SECRET")
    try:
        if not redis_url:
            raise ValueError("the relay needs --redis-url (or HARK_REDIS_URL)")
        if not secret or len(str(secret).encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"the relay needs a fleet secret of at least {MIN_SECRET_BYTES} bytes "
                "(HARK_FLEET_SECRET or --fleet-secret)"
            )
        workers = int(str(options["workers"]))
        if workers < 1:
            raise ValueError("--workers must be at least 1")
        config = RelayConfig(
            listen=parse_address(str(options["listen"])),
            internal=parse_address(str(options["internal"])),
            fleet_secret=str(secret),
            idle_s=float(str(options["flow_idle"])),
        )
        metrics = options.get("metrics_listen")
        metrics_address = parse_address(str(metrics)) if metrics else None
        RedisStore(str(redis_url))  # a malformed URL fails here, before any process starts
    except ValueError as exc:
        print(f"hark relay: {exc}", file=sys.stderr)
        return 2
    return supervise(config, str(redis_url), workers, metrics_address)


def supervise(config: RelayConfig, redis_url: str, workers: int, metrics: Address | None) -> int:
    """Run ``workers`` forwarding processes (restarted when they die) and the metrics server."""
    memory = mmap.mmap(-1, workers * SLOTS * 8)
    table = np.frombuffer(memory, np.int64).reshape(workers, SLOTS)
    context = multiprocessing.get_context("fork")
    processes: list[BaseProcess | None] = [None] * workers

    def start(slot: int) -> None:
        process = context.Process(
            target=_forwarding_process,
            args=(config, redis_url, table[slot]),
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


def _forwarding_process(config: RelayConfig, redis_url: str, row: np.ndarray) -> None:
    # A parent killed outright must not leave its children forwarding on the port.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_forward(config, redis_url, Counters(row)))


async def _forward(config: RelayConfig, redis_url: str, counters: Counters) -> None:
    store = RedisStore(redis_url)
    relay = Relay(config, Registry(store), FlowMirror(store.client, config.idle_s), counters)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await relay.start()
    # What start-up made lives as long as the process: out of the collector's sight,
    # a full collection no longer walks it (tens of milliseconds with aiohttp and redis).
    gc.freeze()
    try:
        await stop.wait()
    finally:
        await relay.stop()
        await store.aclose()


async def _serve_metrics(address: Address, totals: Callable[[], np.ndarray]) -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=metrics_text(totals()), content_type="text/plain")

    app = web.Application()
    app.add_routes([web.get("/metrics", handle)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address[0], address[1]).start()
    logger.info("relay metrics on http://%s:%d/metrics", *address)
    return runner

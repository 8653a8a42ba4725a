"""Running the Realtime API server: ``serve`` until SIGINT or SIGTERM (drain on the first
SIGTERM), for ``hark serve`` and for each worker process of ``--workers``.

Only the standard library and the engine table are imported at the top (``hark serve
--help`` loads this module through ``hark.server.cli``); the server is imported when it runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import TYPE_CHECKING, Any

from hark import __version__
from hark.engines.registry import EngineUnavailableError, build_engines, engine_names

if TYPE_CHECKING:
    from aiohttp import web

    from hark.config import Settings

logger = logging.getLogger("hark")

EXIT_USAGE = 2


async def serve(settings: Settings, sock: socket.socket | None = None) -> int:
    """Run the server until SIGINT or SIGTERM; returns the exit status.

    ``sock`` is a listening socket to serve on instead of binding ``settings.host:port``
    (a worker of ``--workers`` gets the one its parent bound).
    """
    stop = asyncio.Event()
    drain = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigterm() -> None:
        # The first SIGTERM drains (Kubernetes, `--workers`' parent); a second stops at once.
        if drain.is_set():
            stop.set()
        drain.set()

    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await _serve_until(stop, settings, sock, drain=drain)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _serve_until(
    stop: asyncio.Event,
    settings: Settings,
    sock: socket.socket | None = None,
    *,
    drain: asyncio.Event | None = None,
) -> int:
    from aiohttp import web

    from hark.cluster.hop_tls import HopTlsError
    from hark.observability.tracing import TracingUnavailableError
    from hark.protocol.session_config import OPENAI_VOICES
    from hark.server.app import (
        create_app,
        drain_app,
        make_runner,
        set_advertised_port,
        set_hop_port,
        webrtc_startup_error,
    )
    from hark.server.auth import InsecureBindError
    from hark.server.state import HOP_TLS, NODE

    try:
        chosen = ", ".join(f"{kind}: {name}" for kind, name in engine_names(settings).items())
        engines = build_engines(settings, voices=OPENAI_VOICES)
    except EngineUnavailableError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    try:
        try:
            app = create_app(settings, engines)
        except (InsecureBindError, TracingUnavailableError, HopTlsError) as exc:
            logger.error("%s", exc)
            return EXIT_USAGE
        runner = make_runner(app)
        await runner.setup()
        try:
            rtc_error = webrtc_startup_error(app)
            if rtc_error is not None:
                logger.error("%s (set --rtc-port)", rtc_error)
                return 1
            site: web.BaseSite = (
                web.TCPSite(runner, settings.host, settings.port)
                if sock is None
                else web.SockSite(runner, sock)
            )
            hop_tls = app.get(HOP_TLS)
            try:
                await site.start()
                if sock is None:
                    set_advertised_port(app, runner.addresses[0][1])
                elif hop_tls is None:
                    # The workers of `--workers` share the public port, so other workers
                    # reach each one on a port of its own.
                    await web.TCPSite(runner, settings.host, 0).start()
                    set_advertised_port(app, runner.addresses[-1][1])
            except OSError as exc:
                logger.error("cannot listen on %s port %d: %s", settings.host, settings.port, exc)
                return 1
            public = list(runner.addresses)
            if hop_tls is not None:
                # Other workers reach this one on its TLS hop listener alone.
                hop_site = web.TCPSite(
                    runner, settings.host, settings.hop_port, ssl_context=hop_tls.server
                )
                try:
                    await hop_site.start()
                except OSError as exc:
                    logger.error(
                        "cannot listen for worker hops on %s port %d: %s",
                        settings.host,
                        settings.hop_port,
                        exc,
                    )
                    return 1
                set_hop_port(app, runner.addresses[-1][1])
                logger.info("worker hops over TLS at %s", app[NODE].url)
            settled = asyncio.create_task(_settle_heap_when_warm(app), name="hark-settle-heap")
            for host, port, *_ in public:
                logger.info(
                    "hark %s listening on http://%s:%d (%s; model %s)",
                    __version__,
                    f"[{host}]" if ":" in host else host,
                    port,
                    chosen,
                    settings.llm_model_name,
                )
            await _wait_for_stop(stop, drain)
            if drain is not None and drain.is_set() and not stop.is_set():
                logger.info("draining (up to %.0f s)", settings.drain_timeout)
                draining = asyncio.create_task(drain_app(app, settings.drain_timeout))
                await _wait_for_stop(stop, draining)
                if not draining.done():
                    draining.cancel()
            logger.info("shutting down")
            settled.cancel()
            return 0
        finally:
            await runner.cleanup()
    finally:
        await engines.aclose()


async def _wait_for_stop(
    stop: asyncio.Event, other: asyncio.Event | asyncio.Task[None] | None
) -> None:
    """Until ``stop`` is set or ``other`` (an event set, a task done) happens."""
    waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
    if isinstance(other, asyncio.Event):
        waits.append(asyncio.ensure_future(other.wait()))
    elif other is not None:
        waits.append(other)
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            if wait is not other:
                wait.cancel()


async def _settle_heap_when_warm(app: web.Application) -> None:
    from hark.eventloop import settle_heap
    from hark.server.app import STATE

    warmup = app[STATE].warmup
    if warmup is not None:
        await asyncio.wait([warmup])
    settle_heap()

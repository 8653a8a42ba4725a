"""``/healthz`` (the process answers), ``/readyz`` (the engines are warm and working) and
``/metrics``."""

from __future__ import annotations

import asyncio

from aiohttp import web

from hark.engines import health
from hark.observability.metrics import CONTENT_TYPE
from hark.server.access import METRICS_SCRAPE, PUBLIC, requires
from hark.server.state import METRICS, STATE


def routes() -> list[web.RouteDef]:
    """The health and metrics routes."""
    return [
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/metrics", metrics),
    ]


@requires(PUBLIC)
async def healthz(request: web.Request) -> web.Response:
    """Always ok while the process serves HTTP."""
    return web.json_response({"status": "ok"})


@requires(PUBLIC)
async def readyz(request: web.Request) -> web.Response:
    """200 once the engines are warm; 503 while starting, failed, draining, or ``degraded``:
    an engine failing for every session (``engines`` names each, with a code and its error's
    type; the message goes to the log only, as this route is public) until it works again."""
    state = request.app[STATE]
    status: str = "draining" if state.draining else state.engines_status
    degraded = health.degraded()
    if degraded and status == "ready":
        status = "degraded"
        # No new sessions come to a degraded worker: its engines are tried without them.
        health.probe_degraded()
    body: dict[str, object] = {"status": status}
    if status == "degraded":
        body["engines"] = degraded
    # A transport that could not start leaves the rest serving: said here, not fatal.
    if state.unavailable:
        body["unavailable"] = dict(state.unavailable)
    return web.json_response(body, status=200 if status == "ready" else 503)


@requires(METRICS_SCRAPE)
async def metrics(request: web.Request) -> web.Response:
    """Prometheus scrape with an API key or a metrics key (not ephemeral); a server without
    keys asks for none. A loopback peer is no exception: a reverse proxy or a sidecar is
    one."""
    # Reading every worker's files in multiprocess mode is blocking file I/O.
    body = await asyncio.to_thread(request.app[METRICS].exposition)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

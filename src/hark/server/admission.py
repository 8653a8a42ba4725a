"""Counting new sessions and calls against this worker's cap (``max_sessions``) and their
key's limits, fleet-wide."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import WSCloseCode, web

from hark.cluster.limits import FleetLimits
from hark.cluster.store import ClusterUnavailableError
from hark.server.access import principal
from hark.server.errors import (
    cluster_unavailable,
    draining,
    engines_failed,
    error_response,
    rate_limited,
    unavailable,
)
from hark.server.state import LIMITS, SETTINGS, STATE

logger = logging.getLogger(__name__)


async def admit_request(limits: FleetLimits, owner: str) -> web.Response | None:
    """Count one request of ``owner`` against its rate; the refusal, or None."""
    try:
        refusal = await limits.admit_request(owner)
    except ClusterUnavailableError as exc:
        logger.warning("could not check the limits of %s: %s", owner, exc)
        return cluster_unavailable()
    return None if refusal is None else rate_limited(refusal)


async def admit_engine_request(request: web.Request) -> web.Response | None:
    """The refusal of a one-shot request to the engines (speech, transcription): its key
    over its rate, or the engines failed to load (waiting out their warm-up); or None."""
    refusal = await admit_request(request.app[LIMITS], principal(request).owner)
    if refusal is not None:
        return refusal
    if not await request.app[STATE].engines_ready():
        return engines_failed()
    return None


async def admit_websocket_session(
    request: web.Request, ws: web.WebSocketResponse, owner: str
) -> web.Response | None:
    """The refusal of a new WebSocket session (not an upgrade, the engines failed, the
    worker draining, or ``admit_session``'s), or None: admitted, to be released with
    ``release_session``."""
    if not ws.can_prepare(request).ok:
        return error_response(400, "Expected a WebSocket upgrade request.")
    state = request.app[STATE]
    if state.engines_status == "failed":
        return engines_failed()
    if state.draining:
        return draining()
    return await admit_session(request.app, owner)


@asynccontextmanager
async def websocket_session(
    request: web.Request, ws: web.WebSocketResponse, owner: str, name: str
) -> AsyncIterator[bool]:
    """A WebSocket session ``admit_websocket_session`` admitted, for the block's length:
    the upgrade done and the socket among the server's (which drain and shutdown close);
    yields whether the engines are ready (if not, the socket is closed already). At the
    end, however the block ends, the session is released. ``name`` says which session
    in the log."""
    state = request.app[STATE]
    try:
        await ws.prepare(request)
        state.websockets.add(ws)
        logger.info("%s opened for %s", name, owner)
        try:
            ready = await state.engines_ready()
            if not ready:
                await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"engines failed to load")
            yield ready
        finally:
            state.websockets.discard(ws)
            logger.info("%s closed for %s", name, owner)
    finally:
        await release_session(request.app, owner)


async def admit_session(app: web.Application, owner: str) -> web.Response | None:
    """Count a new session or call of ``owner`` against the worker's cap and the key's
    limits; the refusal, or None.

    A session admitted here must be released with ``release_session`` when it ends.
    """
    state = app[STATE]
    most = app[SETTINGS].max_sessions
    if state.admitted >= most:
        logger.warning("refused a session: this worker runs %d, its cap", state.admitted)
        return unavailable(
            "This server is running as many sessions as it may; try again shortly.",
            "server_at_capacity",
        )
    # Taken before the store is asked, so that sessions admitted meanwhile count.
    state.admitted += 1
    limits = app[LIMITS]
    try:
        refusal = await limits.admit_request(owner)
        if refusal is None:
            refusal = await limits.open_session(owner)
            if refusal is None:
                return None
        response = rate_limited(refusal)
    except ClusterUnavailableError as exc:
        logger.warning("could not check the limits of %s: %s", owner, exc)
        response = cluster_unavailable()
    except BaseException:
        state.admitted -= 1
        raise
    state.admitted -= 1
    return response


async def release_session(app: web.Application, owner: str) -> None:
    """A session ``admit_session`` admitted has ended."""
    app[STATE].admitted -= 1
    await app[LIMITS].close_session(owner)


def release_in_background(app: web.Application, owner: str, name: str) -> None:
    """``release_session``, from code that cannot wait (a call's end callback)."""
    state = app[STATE]
    state.admitted -= 1
    state.spawn(app[LIMITS].close_session(owner), name)


def usage_counter(limits: FleetLimits, owner: str) -> Callable[[int], None] | None:
    """What counts a session's tokens against ``owner``'s rate, if it has one."""
    if limits.tokens_per_minute is None:
        return None
    return lambda tokens: limits.add_tokens(owner, tokens)

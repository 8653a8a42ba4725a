"""Counting new sessions and calls against their key's limits, fleet-wide."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

from hark.cluster.limits import FleetLimits
from hark.cluster.store import ClusterUnavailableError
from hark.server.errors import cluster_unavailable, rate_limited

logger = logging.getLogger(__name__)


async def admit_request(limits: FleetLimits, owner: str) -> web.Response | None:
    """Count one request of ``owner`` against its rate; the refusal, or None."""
    try:
        refusal = await limits.admit_request(owner)
    except ClusterUnavailableError as exc:
        logger.warning("could not check the limits of %s: %s", owner, exc)
        return cluster_unavailable()
    return None if refusal is None else rate_limited(refusal)


async def admit_session(limits: FleetLimits, owner: str) -> web.Response | None:
    """Count a new session or call of ``owner`` against its limits; the refusal, or None.

    A session admitted here must be released with ``limits.close_session`` when it ends.
    """
    try:
        refusal = await limits.admit_request(owner)
        if refusal is not None:
            return rate_limited(refusal)
        refusal = await limits.open_session(owner)
    except ClusterUnavailableError as exc:
        logger.warning("could not check the limits of %s: %s", owner, exc)
        return cluster_unavailable()
    return None if refusal is None else rate_limited(refusal)


def usage_counter(limits: FleetLimits, owner: str) -> Callable[[int], None] | None:
    """What counts a session's tokens against ``owner``'s rate, if it has one."""
    if limits.tokens_per_minute is None:
        return None
    return lambda tokens: limits.add_tokens(owner, tokens)

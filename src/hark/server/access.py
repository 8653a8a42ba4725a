"""Who may call which route: each route declares its access, one middleware enforces it.

The middleware authenticates before any handler runs and attaches the caller's
``Principal`` to the request (``principal(request)``). A route that declares nothing needs
a key, so a new route is closed until it says otherwise. Requests that match no route
pass through unauthenticated, to get the JSON 404 or 405 of ``errors.route_errors``.

A server without API keys (open mode, on loopback only) takes any key, so what keeps a web
page out is the browser: a page of another origin sends its ``Origin``, and a page that
reached loopback through DNS rebinding sends its own host name as ``Host``. In open mode
every request must name a loopback ``Host`` and, when it has an ``Origin``, come from this
server's own origin, unless the operator allowed that host or origin (``allowed_hosts``,
``allowed_origins``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from hark.cluster.store import ClusterUnavailableError
from hark.config import is_loopback_host
from hark.server.auth import Principal, bearer_key, subprotocol_key
from hark.server.errors import cluster_unavailable, error_response, forbidden
from hark.server.state import AUTHENTICATOR, SETTINGS

logger = logging.getLogger(__name__)

_Handler = TypeVar("_Handler", bound=Callable[..., Awaitable[web.StreamResponse]])
_ATTRIBUTE = "hark_access"
_PRINCIPAL = web.RequestKey("principal", Principal)

MISSING_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an "
    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


@dataclass(frozen=True, slots=True)
class Access:
    """What a route asks of its callers.

    ``key``: a key is needed at all. ``subprotocol``: the key may come as the browser's
    WebSocket subprotocol instead of the ``Authorization`` header. ``ephemeral``: ephemeral
    keys are accepted; if not, they are refused with ``ephemeral_refusal``.
    ``keyless_when_open``: a server without API keys (on loopback only) asks for no key.
    ``metrics``: metrics keys (``metrics:KEY`` entries) are accepted; every other route
    refuses them.
    """

    key: bool = True
    subprotocol: bool = False
    ephemeral: bool = True
    keyless_when_open: bool = False
    ephemeral_refusal: str = "Ephemeral keys cannot use this endpoint; use an API key."
    metrics: bool = False


# Anyone: health checks, the demo page, CORS preflights.
PUBLIC = Access(key=False)
# An API key or an ephemeral key, in the Authorization header: the default.
KEY = Access()
# As KEY, or the key browsers send as a WebSocket subprotocol.
WEBSOCKET_KEY = Access(subprotocol=True)


# What an ephemeral key is for, as OpenAI documents it: opening a Realtime session or call.
EPHEMERAL_SCOPE = (
    "Ephemeral keys can only open Realtime sessions and calls; use an API key for this endpoint."
)


def api_key_only(refusal: str = EPHEMERAL_SCOPE, *, keyless_when_open: bool = False) -> Access:
    """A real API key: an ephemeral key is refused (403) with ``refusal``."""
    return Access(ephemeral=False, ephemeral_refusal=refusal, keyless_when_open=keyless_when_open)


# The Prometheus scrape: an API key or a metrics key, not an ephemeral key; none on a
# server without API keys (on loopback only).
METRICS_SCRAPE = Access(
    ephemeral=False,
    ephemeral_refusal="Ephemeral keys cannot read metrics.",
    keyless_when_open=True,
    metrics=True,
)
METRICS_ONLY_REFUSAL = "This key is a metrics key: it can only read /metrics."


def requires(access: Access) -> Callable[[_Handler], _Handler]:
    """Declare the access a route handler needs (the default is ``KEY``)."""

    def declare(handler: _Handler) -> _Handler:
        setattr(handler, _ATTRIBUTE, access)
        return handler

    return declare


def principal(request: web.Request) -> Principal:
    """The authenticated caller of a route that needs a key."""
    return request[_PRINCIPAL]


@web.middleware
async def authentication(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Check the caller against the matched route's ``Access`` before the route runs (in
    open mode, its ``Host`` and ``Origin`` first)."""
    if request.app[AUTHENTICATOR].open:
        refusal = local_only_refusal(request)
        if refusal is not None:
            message, code = refusal
            logger.info("refused a request to %s in open mode: %s", request.path, code)
            return error_response(403, message, code=code)
    match = request.match_info
    if match.http_exception is not None:
        return await handler(request)
    access: Access = getattr(match.handler, _ATTRIBUTE, KEY)
    if not access.key or (access.keyless_when_open and request.app[AUTHENTICATOR].open):
        return await handler(request)
    found = await _authenticate(request, access)
    if isinstance(found, web.Response):
        return found
    request[_PRINCIPAL] = found
    return await handler(request)


async def _authenticate(request: web.Request, access: Access) -> Principal | web.Response:
    key = bearer_key(request.headers)
    if key is None and access.subprotocol:
        key = subprotocol_key(request.headers)
    if key is None:
        return error_response(401, MISSING_KEY_MESSAGE)
    try:
        found = await request.app[AUTHENTICATOR].authenticate(key)
    except ClusterUnavailableError as exc:
        logger.warning("could not check a key for %s: %s", request.path, exc)
        return cluster_unavailable()
    if found is None:
        logger.info("rejected a request to %s: invalid API key", request.path)
        return error_response(
            401, "Incorrect API key provided, or the ephemeral key expired.", code="invalid_api_key"
        )
    if found.ephemeral is not None and not access.ephemeral:
        return forbidden(access.ephemeral_refusal)
    if found.metrics_only and not access.metrics:
        logger.info("refused a metrics key on %s", request.path)
        return forbidden(METRICS_ONLY_REFUSAL)
    return found


def local_only_refusal(request: web.Request) -> tuple[str, str] | None:
    """Why an open server may not answer ``request`` (a message and a code): a ``Host`` that
    is not loopback, or an ``Origin`` that is not this server's. None: it may."""
    settings = request.app[SETTINGS]
    # Without a Host header aiohttp names the address the request came in on.
    host = request.host.lower()
    name = _hostname(host)
    allowed_hosts = {h.lower() for h in settings.allowed_hosts}
    if not (is_loopback_host(name) or host in allowed_hosts or name in allowed_hosts):
        return (
            f"This server has no API keys and answers only requests for a loopback host, not "
            f"{host[:100]!r}. Set HARK_API_KEYS to serve other hosts, or allow this one with "
            "--allowed-hosts.",
            "forbidden_host",
        )
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    origin = origin.strip().lower().rstrip("/")
    allowed_origins = {o.lower().rstrip("/") for o in settings.allowed_origins}
    if _netloc(origin) == host or origin in allowed_origins:
        return None
    return (
        f"This server has no API keys and answers only pages of its own origin, not "
        f"{origin[:100]!r}. Set HARK_API_KEYS to serve other pages, or allow this origin "
        "with --allowed-origins.",
        "forbidden_origin",
    )


def _hostname(host: str) -> str:
    """The name in a ``Host`` value (``[::1]:8000`` → ``::1``); empty when malformed."""
    try:
        return urlsplit("//" + host).hostname or ""
    except ValueError:
        return ""


def _netloc(origin: str) -> str | None:
    try:
        parts = urlsplit(origin)
    except ValueError:
        return None
    return parts.netloc if parts.scheme in ("http", "https") else None

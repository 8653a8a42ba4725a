"""CORS for the endpoints a browser page calls directly: WebRTC offers and hang-ups.

OpenAI lets a page post its SDP offer with an ephemeral key from any origin, so pages written
for it call hark cross-origin too. Any origin is allowed: these endpoints authenticate with a
bearer key in the ``Authorization`` header, never with cookies, so a foreign page gains
nothing it does not already hold a key for. Minting keys (``client_secrets``) stays
server-to-server: no CORS there.
"""

from __future__ import annotations

import re

from aiohttp import web

from hark.server.access import PUBLIC, requires

# Route resources (as registered, with placeholders) a browser may call cross-origin.
CORS_RESOURCES = frozenset(
    {"/v1/realtime", "/v1/realtime/calls", "/v1/realtime/calls/{call_id}/hangup"}
)
ALLOWED_METHODS = "POST, OPTIONS"
DEFAULT_ALLOWED_HEADERS = "Authorization, Content-Type"
# The call id travels in the answer's Location header; the page needs it to hang up.
EXPOSED_HEADERS = "Location"
PREFLIGHT_MAX_AGE_SECONDS = 600
# A comma-separated list of header names (RFC 9110 tokens), as browsers send it.
_HEADER_LIST = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+(\s*,\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+)*$")


def preflight_routes() -> list[web.RouteDef]:
    """``OPTIONS`` on every CORS resource, answering browsers' preflight requests."""
    return [web.options(path, _preflight) for path in sorted(CORS_RESOURCES)]


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: let pages read responses (errors too) of CORS resources."""
    if "Origin" not in request.headers or not _is_cors_resource(request):
        return
    response.headers["Access-Control-Allow-Origin"] = "*"
    response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
    # Proxies must not serve one origin's answer to another.
    response.headers.add("Vary", "Origin")


def _is_cors_resource(request: web.Request) -> bool:
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in CORS_RESOURCES


@requires(PUBLIC)
async def _preflight(request: web.Request) -> web.Response:
    # SDKs send headers of their own (OpenAI-Beta, X-Stainless-…): allow what is asked for,
    # as long as it is a well-formed list of names.
    asked = request.headers.get("Access-Control-Request-Headers", "").strip()
    allowed = asked if asked and _HEADER_LIST.match(asked) else DEFAULT_ALLOWED_HEADERS
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": ALLOWED_METHODS,
            "Access-Control-Allow-Headers": allowed,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_SECONDS),
        },
    )

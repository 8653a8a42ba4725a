"""HTTP errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from hark.protocol.errors import ProtocolError


def error_response(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> web.Response:
    """An HTTP error with OpenAI's JSON body ``{"error": {message, type, param, code}}``."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    response = web.json_response(body, status=status)
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


@web.middleware
async def route_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Answer a path no route serves, or a method its route does not take, as OpenAI does:
    404 ``Invalid URL (GET /path)`` and 405 ``Invalid method for URL (GET /path)`` in the
    JSON error shape, never aiohttp's plain-text pages (SDKs parse the body as JSON)."""
    unmatched = request.match_info.http_exception
    if unmatched is None:
        try:
            return await handler(request)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as raised:
            unmatched = raised
    where = f"{request.method} {request.path}"
    if isinstance(unmatched, web.HTTPMethodNotAllowed):
        response = error_response(405, f"Invalid method for URL ({where})")
        response.headers["Allow"] = ", ".join(sorted(unmatched.allowed_methods))
        return response
    if unmatched.status == 404:
        return error_response(404, f"Invalid URL ({where})")
    # aiohttp's router answers only 404 and 405; anything else it raises is its own to send.
    raise unmatched


def invalid_request(exc: ProtocolError, status: int = 400) -> web.Response:
    """The answer to a request the client got wrong."""
    return error_response(status, exc.message, type=exc.type, param=exc.param, code=exc.code)


def too_large(limit: int) -> ProtocolError:
    """A request body over ``limit`` bytes."""
    return ProtocolError(
        f"The request body is larger than {limit} bytes.", code="request_too_large"
    )


def unavailable(message: str, code: str | None = None) -> web.Response:
    """A 503 ``server_error``: the request may succeed if tried again shortly."""
    return error_response(503, message, type="server_error", code=code)


def cluster_unavailable() -> web.Response:
    """What a request that needs the shared state gets while the cluster store is down."""
    return unavailable(
        "The service's shared state is unavailable right now; try again shortly.",
        "cluster_unavailable",
    )


def draining() -> web.Response:
    """What a new session gets from a worker that is draining."""
    return unavailable(
        "This server is shutting down and takes no new sessions; try again.",
        "server_shutting_down",
    )


def forbidden(message: str) -> web.Response:
    """A 403 for a key that may not do what it asked (another key's call, say)."""
    return error_response(403, message, code="insufficient_permissions")


def engines_failed() -> web.Response:
    """What a request that needs the engines gets when they failed to load."""
    return unavailable("The server's engines failed to load.")


def engine_failed(what: str) -> web.Response:
    """What a request gets when its engine failed on it (the details go to the log)."""
    return error_response(500, f"The {what} engine failed on this request.", type="server_error")


def rate_limited(message: str) -> web.Response:
    """A request over one of the key's limits."""
    return error_response(429, message, type="rate_limit_error", code="rate_limit_exceeded")

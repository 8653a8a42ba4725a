"""The HTTP application: the Realtime WebSocket endpoint, WebRTC calls, ephemeral keys,
models, health.

The server listens at once and loads the engines in the background: ``/healthz`` answers
from the start, ``/readyz`` once the engines are warm. Sessions opened while the engines
load wait for them after the upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import logging
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any, Literal

from aiohttp import StreamReader, WSCloseCode, web
from aiohttp.abc import AbstractAccessLogger

from hark.cluster import open_store
from hark.cluster.forwarding import Forwarder, ForwardError, is_forwarded
from hark.cluster.limits import FleetLimits
from hark.cluster.node import ClusterNode, Load
from hark.cluster.store import ClusterStore, ClusterUnavailableError, WorkerInfo
from hark.config import Settings
from hark.engines.llm.failover import FailoverLlm
from hark.engines.registry import Engines
from hark.engines.vad.batcher import BatchedSileroVad, Batcher
from hark.observability.metrics import CONTENT_TYPE, Metrics
from hark.observability.tracing import TurnTracer
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import (
    SessionConfig,
    parse_session_config,
    session_config_to_dict,
)
from hark.server import cors
from hark.server.auth import (
    DEFAULT_EPHEMERAL_SECONDS,
    MAX_EPHEMERAL_SECONDS,
    MIN_EPHEMERAL_SECONDS,
    Authenticator,
    Principal,
    bearer_key,
    check_bind_policy,
    offered_subprotocols,
    subprotocol_key,
)
from hark.server.demo import DEMO_KEY_SECONDS, DemoPage
from hark.session.core import SESSION_LIMIT_S
from hark.session.ids import IdGenerator
from hark.session.runner import SessionRunner
from hark.transports.webrtc.call import Call
from hark.transports.webrtc.calls import Calls
from hark.transports.webrtc.sdp import MAX_OFFER_BYTES, OfferError
from hark.transports.webrtc.udp_mux import UdpMux
from hark.transports.websocket import REALTIME_SUBPROTOCOL, run_session, websocket_response

logger = logging.getLogger(__name__)

REALTIME_MODEL = "gpt-realtime"

# Long enough for sessions to say goodbye, short enough that SIGTERM feels prompt.
SHUTDOWN_TIMEOUT_SECONDS = 5.0
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # Responses may carry keys (client_secrets): no cache may keep them.
    "Cache-Control": "no-store",
}


@dataclass(slots=True)
class ServerState:
    """What the app tracks while it runs: engine warm-up and open WebSockets."""

    started_at: int = field(default_factory=lambda: int(time.time()))
    warmup: asyncio.Task[None] | None = None
    # "starting" until the warm-up ends, then "ready" or "failed".
    engines_status: Literal["starting", "ready", "failed"] = "starting"
    websockets: set[web.WebSocketResponse] = field(default_factory=set)
    # The WebSocket sessions running here (sidebands and forwarded sockets are not sessions).
    sessions: set[SessionRunner] = field(default_factory=set)
    # Why WebRTC is unavailable (its UDP port could not be bound), or None.
    webrtc_error: str | None = None
    # Set on SIGTERM: /readyz turns red and nothing new starts here.
    draining: bool = False
    # Set whenever a session or call ends, so that a drain wakes up to count again.
    session_ended: asyncio.Event = field(default_factory=asyncio.Event)
    # Store updates made in the background when calls end.
    background: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` in the background, kept until it ends."""
        task = asyncio.create_task(coro, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


_ids = IdGenerator()

SETTINGS = web.AppKey("settings", Settings)
ENGINES = web.AppKey("engines", Engines)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
STATE = web.AppKey("state", ServerState)
CALLS = web.AppKey("calls", Calls)
METRICS = web.AppKey("metrics", Metrics)
NODE = web.AppKey("node", ClusterNode)
FORWARDER = web.AppKey("forwarder", Forwarder)
LIMITS = web.AppKey("limits", FleetLimits)
# How long a session may last, in seconds.
SESSION_LIMIT = web.AppKey("session_limit", float)
# On every answer: the worker that made it (a forwarded answer keeps its maker's).
WORKER_HEADER = "X-Hark-Worker"
# A session config sent along an offer is a few KB; this leaves room, not abuse.
MAX_SESSION_PART_BYTES = 256 * 1024
# A multipart offer: both parts and the multipart framing around them.
MAX_OFFER_BODY_BYTES = MAX_OFFER_BYTES + MAX_SESSION_PART_BYTES + 16 * 1024
# What a client hears when the server ends its session (drain, shutdown).
SHUTDOWN_MESSAGE = "The server is shutting down; reconnect to continue."
SHUTDOWN_CODE = "server_shutting_down"


def create_app(
    settings: Settings,
    engines: Engines,
    metrics: Metrics | None = None,
    *,
    store: ClusterStore | None = None,
    session_limit_s: float = SESSION_LIMIT_S,
) -> web.Application:
    """The aiohttp application serving hark's HTTP and WebSocket API.

    ``store`` is the cluster store (default: Redis at ``settings.redis_url``, else an
    embedded store in ``settings.run_dir`` or in a private directory removed at cleanup).
    ``session_limit_s`` is the session limit of WebSockets and calls alike (OpenAI's 60
    minutes; tests shorten it).
    Raises ``InsecureBindError`` when no API keys are configured and ``settings.host`` is not
    loopback. The engines stay the caller's to close.
    """
    check_bind_policy(settings.host, settings.api_keys)
    app = web.Application()
    app[SETTINGS] = settings
    app[ENGINES] = engines
    app[STATE] = ServerState()
    if store is None:
        store = _open_store(app, settings)
    app[AUTHENTICATOR] = Authenticator(settings.api_keys, store)
    app[METRICS] = metrics if metrics is not None else metrics_for(settings)
    mux = UdpMux(settings.host, settings.rtc_port, advertise_ip=settings.rtc_advertise_ip)
    app[SESSION_LIMIT] = session_limit_s
    app[CALLS] = Calls(engines, mux, metrics=app[METRICS], session_limit_s=session_limit_s)
    app[NODE] = ClusterNode(
        store,
        url=advertise_url(settings),
        zone=settings.zone,
        load=lambda: _load(app),
    )
    app[FORWARDER] = Forwarder(app[NODE].id)
    app[LIMITS] = FleetLimits(
        store,
        app[NODE].id,
        max_sessions=settings.key_max_sessions,
        requests_per_minute=settings.key_requests_per_minute,
        tokens_per_minute=settings.key_tokens_per_minute,
    )
    app[CALLS].on_closed = lambda call: _call_ended(app, call)
    demo = DemoPage.for_settings(app[AUTHENTICATOR], settings)
    if demo.enabled:
        logger.info(
            "browser demo on at / (it gives a %d-second key to anyone who loads the page)",
            DEMO_KEY_SECONDS,
        )
    app.add_routes(
        [
            web.get("/healthz", _healthz),
            web.get("/readyz", _readyz),
            web.get("/metrics", _metrics),
            web.get("/v1/models", _models),
            web.get("/v1/realtime", _realtime_websocket),
            # The beta dialect's WebRTC endpoint: an SDP offer posted to /v1/realtime.
            web.post("/v1/realtime", _create_call),
            web.post("/v1/realtime/client_secrets", _client_secrets),
            web.post("/v1/realtime/calls", _create_call),
            web.post("/v1/realtime/calls/{call_id}/hangup", _hangup_call),
            *cors.preflight_routes(),
            *demo.routes(),
        ]
    )
    app.on_response_prepare.append(_add_security_headers)
    app.on_response_prepare.append(cors.add_cors_headers)
    app.on_startup.append(_start_warmup)
    app.cleanup_ctx.append(_run_metrics)
    app.on_startup.append(_start_webrtc)
    app.cleanup_ctx.append(_run_cluster)
    app.on_shutdown.append(_close_calls)
    app.on_shutdown.append(_close_websockets)
    app.on_cleanup.append(_stop_warmup)
    app.on_cleanup.append(_stop_webrtc)
    return app


def webrtc_startup_error(app: web.Application) -> str | None:
    """Why WebRTC could not start (its UDP port is taken, say), or None when it runs."""
    return app[STATE].webrtc_error


def advertise_url(settings: Settings, port: int | None = None) -> str:
    """How other workers reach this one: ``--advertise-url``, else the bound host and
    ``port`` (default ``settings.port``); a wildcard host advertises this machine's name's
    address."""
    if settings.advertise_url:
        return settings.advertise_url.rstrip("/")
    host = settings.host
    if host in ("0.0.0.0", "::", ""):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port if port is None else port}"


def set_advertised_port(app: web.Application, port: int) -> None:
    """The worker's HTTP port is known only once it listens (port 0, ``--workers``)."""
    settings = app[SETTINGS]
    if not settings.advertise_url:
        app[NODE].url = advertise_url(settings, port)


def _open_store(app: web.Application, settings: Settings) -> ClusterStore:
    if settings.redis_url:
        return open_store(settings.redis_url, None)
    if settings.run_dir:
        return open_store(None, Path(settings.run_dir))
    # One process alone: a private store, removed with the app.
    run_dir = Path(tempfile.mkdtemp(prefix="hark-run-"))

    async def remove(app: web.Application) -> None:
        shutil.rmtree(run_dir, ignore_errors=True)

    app.on_cleanup.append(remove)
    return open_store(None, run_dir)


def _load(app: web.Application) -> Load:
    """What the heartbeat reports: sessions here, and responses being generated."""
    # Read at every heartbeat, which is also when the store's reachability is known.
    app[METRICS].cluster_store_up.set(1 if app[NODE].store_available else 0)
    state = app[STATE]
    runners = [*state.sessions, *(call.runner for call in app[CALLS])]
    return Load(sessions=len(runners), queue_depth=sum(r.generations_running for r in runners))


def _call_ended(app: web.Application, call: Call) -> None:
    state = app[STATE]
    state.session_ended.set()
    state.spawn(app[NODE].forget_call(call.id), f"forget {call.id}")
    state.spawn(app[LIMITS].close_session(call.owner), f"release {call.id}")


async def _run_cluster(app: web.Application) -> AsyncIterator[None]:
    """Join the cluster while the app runs; leave it (and end what is left) at cleanup."""
    node = app[NODE]
    await node.start()
    logger.info(
        "worker %s in the cluster (store %s, url %s, zone %r)",
        node.id,
        node.store.description,
        node.url,
        node.zone,
    )
    yield
    state = app[STATE]
    if state.background:
        await asyncio.gather(*state.background, return_exceptions=True)
    await app[LIMITS].aclose()
    await app[FORWARDER].aclose()
    await node.stop()


async def drain_app(app: web.Application, timeout_s: float) -> None:
    """Stop taking work, let running sessions and calls finish for up to ``timeout_s``
    seconds, then end the rest, each told why in an ``error`` event."""
    state = app[STATE]
    node = app[NODE]
    state.draining = True
    node.draining = True
    with contextlib.suppress(ClusterUnavailableError):
        await node.beat()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    calls = app[CALLS]
    while (left := len(state.sessions) + len(calls)) and loop.time() < deadline:
        logger.info("draining: %d session(s) still running", left)
        state.session_ended.clear()
        try:
            await asyncio.wait_for(state.session_ended.wait(), deadline - loop.time())
        except TimeoutError:
            break
    await end_sessions(app)


async def end_sessions(app: web.Application) -> None:
    """End every session and call still running, telling each client why."""
    state = app[STATE]
    ending = [r.end(SHUTDOWN_MESSAGE, SHUTDOWN_CODE, "server shutdown") for r in state.sessions]
    ending += [call.end(SHUTDOWN_MESSAGE, SHUTDOWN_CODE, "server shutdown") for call in app[CALLS]]
    if ending:
        logger.info("ending %d session(s) and call(s)", len(ending))
        await asyncio.gather(*ending, return_exceptions=True)


def make_runner(app: web.Application) -> web.AppRunner:
    """An ``AppRunner`` with hark's access log (which never records credentials)."""
    return web.AppRunner(
        app, access_log_class=AccessLogger, shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS
    )


class AccessLogger(AbstractAccessLogger):
    """One line per request, without query strings or headers, where credentials could be."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        """Record method, path, status and duration."""
        self.logger.info(
            '%s "%s %s" %d %.1f ms',
            request.remote,
            request.method,
            request.path,
            response.status,
            time * 1000,
        )


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


async def _add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    # Which worker answered: an operator can follow a request through the fleet. A
    # forwarded answer keeps the header of the worker that made it.
    response.headers.setdefault(WORKER_HEADER, request.app[NODE].id)
    if not isinstance(response, web.WebSocketResponse):
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)


async def _start_warmup(app: web.Application) -> None:
    state = app[STATE]
    state.warmup = asyncio.create_task(_warm(app), name="hark-warmup")


async def _warm(app: web.Application) -> None:
    state = app[STATE]
    try:
        await app[ENGINES].warmup()
    except Exception:
        state.engines_status = "failed"
        logger.exception("loading the engines failed; /readyz stays unready")
        return
    state.engines_status = "ready"
    node = app[NODE]
    node.ready = True
    # Tell the registry now, not at the next heartbeat: calls may be placed here at once.
    with contextlib.suppress(ClusterUnavailableError):
        await node.beat()
    logger.info("engines ready")


async def _stop_warmup(app: web.Application) -> None:
    task = app[STATE].warmup
    if task is not None and not task.done():
        task.cancel()
        await asyncio.wait([task])


async def _start_webrtc(app: web.Application) -> None:
    # A port in use leaves the server up without WebRTC; `hark serve` treats it as fatal.
    mux = app[CALLS].mux
    try:
        await mux.start()
    except OSError as exc:
        app[STATE].webrtc_error = f"cannot listen on UDP {mux.host} port {mux.port}: {exc}"
        logger.error("WebRTC is unavailable: %s", app[STATE].webrtc_error)
        return
    host, port = mux.advertised
    app[NODE].media_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _close_calls(app: web.Application) -> None:
    await end_sessions(app)
    await app[CALLS].close_all()


async def _stop_webrtc(app: web.Application) -> None:
    await app[CALLS].mux.close()


async def _close_websockets(app: web.Application) -> None:
    sockets = list(app[STATE].websockets)
    await asyncio.gather(
        *(ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown") for ws in sockets),
        return_exceptions=True,
    )


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    status = "draining" if state.draining else state.engines_status
    return web.json_response({"status": status}, status=200 if status == "ready" else 503)


def cluster_unavailable() -> web.Response:
    """What a request that needs the shared state gets while the cluster store is down."""
    return error_response(
        503,
        "The service's shared state is unavailable right now; try again shortly.",
        type="server_error",
        code="cluster_unavailable",
    )


def draining() -> web.Response:
    """What a new session gets from a worker that is draining."""
    return error_response(
        503,
        "This server is shutting down and takes no new sessions; try again.",
        type="server_error",
        code="server_shutting_down",
    )


def _rate_limited(message: str) -> web.Response:
    return error_response(429, message, type="rate_limit_error", code="rate_limit_exceeded")


async def _authenticate(
    request: web.Request, *, allow_subprotocol: bool
) -> Principal | web.Response:
    key = bearer_key(request.headers)
    if key is None and allow_subprotocol:
        key = subprotocol_key(request.headers)
    if key is None:
        return error_response(
            401,
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
    try:
        principal = await request.app[AUTHENTICATOR].authenticate(key)
    except ClusterUnavailableError as exc:
        logger.warning("could not check a key for %s: %s", request.path, exc)
        return cluster_unavailable()
    if principal is None:
        logger.info("rejected a request to %s: invalid API key", request.path)
        return error_response(
            401, "Incorrect API key provided, or the ephemeral key expired.", code="invalid_api_key"
        )
    return principal


async def _models(request: web.Request) -> web.Response:
    principal = await _authenticate(request, allow_subprotocol=False)
    if isinstance(principal, web.Response):
        return principal
    created = request.app[STATE].started_at
    names = dict.fromkeys([REALTIME_MODEL, request.app[SETTINGS].llm_model_name])
    data = [{"id": n, "object": "model", "created": created, "owned_by": "hark"} for n in names]
    return web.json_response({"object": "list", "data": data})


async def _client_secrets(request: web.Request) -> web.Response:
    principal = await _authenticate(request, allow_subprotocol=False)
    if isinstance(principal, web.Response):
        return principal
    if principal.ephemeral is not None:
        return error_response(
            403,
            "Ephemeral keys cannot create client secrets; use an API key.",
            code="insufficient_permissions",
        )
    try:
        seconds, session = _parse_client_secret_request(await request.read())
    except ProtocolError as exc:
        return error_response(400, exc.message, type=exc.type, param=exc.param, code=exc.code)
    session_id = _ids.new("sess")
    try:
        refusal = await request.app[LIMITS].admit_request(principal.owner)
        if refusal is not None:
            return _rate_limited(refusal)
        value, record = await request.app[AUTHENTICATOR].mint(
            principal, session, session_id, seconds
        )
    except ClusterUnavailableError as exc:
        logger.warning("could not mint a key: %s", exc)
        return cluster_unavailable()
    return web.json_response(
        {
            "value": value,
            "expires_at": record.expires_at,
            "session": session_config_to_dict(
                session, session_id=session_id, expires_at=record.expires_at
            ),
        }
    )


def _parse_client_secret_request(raw: bytes) -> tuple[int, SessionConfig]:
    """``(seconds, session)`` of a client_secrets body; raises ProtocolError."""
    if not raw.strip():
        return DEFAULT_EPHEMERAL_SECONDS, parse_session_config({})
    try:
        body = json.loads(raw)
    except ValueError:
        raise ProtocolError(
            "We could not parse the JSON body of your request.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ProtocolError("The request body must be a JSON object.", code="invalid_type")
    _reject_unknown(body, {"expires_after", "session"}, prefix="")

    seconds = DEFAULT_EPHEMERAL_SECONDS
    expires_after = body.get("expires_after")
    if expires_after is not None:
        if not isinstance(expires_after, dict):
            raise ProtocolError(
                "Invalid type for 'expires_after': expected an object.",
                param="expires_after",
                code="invalid_type",
            )
        _reject_unknown(expires_after, {"anchor", "seconds"}, prefix="expires_after.")
        if expires_after.get("anchor", "created_at") != "created_at":
            raise ProtocolError(
                "Invalid value for 'expires_after.anchor': supported values are 'created_at'.",
                param="expires_after.anchor",
            )
        seconds = expires_after.get("seconds", DEFAULT_EPHEMERAL_SECONDS)
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise ProtocolError(
                "Invalid type for 'expires_after.seconds': expected an integer.",
                param="expires_after.seconds",
                code="invalid_type",
            )
        if not MIN_EPHEMERAL_SECONDS <= seconds <= MAX_EPHEMERAL_SECONDS:
            raise ProtocolError(
                f"Invalid 'expires_after.seconds': must be between {MIN_EPHEMERAL_SECONDS} "
                f"and {MAX_EPHEMERAL_SECONDS}.",
                param="expires_after.seconds",
                code="integer_below_min_value"
                if seconds < MIN_EPHEMERAL_SECONDS
                else "integer_above_max_value",
            )
    session = parse_session_config(body.get("session", {}), param_prefix="session")
    return seconds, session


def _reject_unknown(obj: dict[str, Any], known: set[str], *, prefix: str) -> None:
    for name in obj:
        if name not in known:
            raise ProtocolError(
                f"Unknown parameter: '{prefix}{name}'.",
                param=f"{prefix}{name}",
                code="unknown_parameter",
            )


async def _realtime_websocket(request: web.Request) -> web.StreamResponse:
    principal = await _authenticate(request, allow_subprotocol=True)
    if isinstance(principal, web.Response):
        return principal
    query = request.query
    if "call_id" in query:
        return await _attach_sideband(request, principal, query["call_id"])
    intent = query.get("intent")
    if intent not in (None, "transcription"):
        return error_response(
            400,
            "Invalid value for 'intent': supported values are 'transcription'.",
            param="intent",
            code="invalid_value",
        )
    ws = websocket_response(
        offered_realtime=REALTIME_SUBPROTOCOL in offered_subprotocols(request.headers)
    )
    if not ws.can_prepare(request).ok:
        return error_response(400, "Expected a WebSocket upgrade request.")
    state = request.app[STATE]
    if state.engines_status == "failed":
        return error_response(503, "The server's engines failed to load.", type="server_error")
    if state.draining:
        return draining()
    limits = request.app[LIMITS]
    refusal = await _admit_session(limits, principal.owner)
    if refusal is not None:
        return refusal
    try:
        initial = principal.ephemeral.session if principal.ephemeral is not None else None
        if intent == "transcription":
            initial = parse_session_config({"type": "transcription"}, base=initial)
        model = query.get("model") or (initial.model if initial is not None else REALTIME_MODEL)
        await ws.prepare(request)
        state.websockets.add(ws)
        logger.info("session opened for %s (model %r)", principal.owner, model)
        try:
            if state.warmup is not None:
                # wait() rather than await: a client leaving must not cancel the shared warm-up.
                await asyncio.wait([state.warmup])
            if state.engines_status != "ready":
                await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"engines failed to load")
                return ws
            runner = SessionRunner(
                request.app[ENGINES],
                model=model,
                initial_config=initial,
                transport="websocket",
                metrics=request.app[METRICS],
                on_usage=_usage_counter(limits, principal.owner),
                max_duration_s=request.app[SESSION_LIMIT],
            )
            state.sessions.add(runner)
            try:
                await run_session(ws, runner)
            finally:
                state.sessions.discard(runner)
                state.session_ended.set()
        finally:
            state.websockets.discard(ws)
            logger.info("session closed for %s", principal.owner)
    finally:
        await limits.close_session(principal.owner)
    return ws


async def _admit_session(limits: FleetLimits, owner: str) -> web.Response | None:
    """Count a new session or call of ``owner`` against its limits; the refusal, or None.

    A session admitted here must be released with ``limits.close_session`` when it ends.
    """
    try:
        refusal = await limits.admit_request(owner)
        if refusal is not None:
            return _rate_limited(refusal)
        refusal = await limits.open_session(owner)
    except ClusterUnavailableError as exc:
        logger.warning("could not check the limits of %s: %s", owner, exc)
        return cluster_unavailable()
    return None if refusal is None else _rate_limited(refusal)


def _usage_counter(limits: FleetLimits, owner: str) -> Callable[[int], None] | None:
    if limits.tokens_per_minute is None:
        return None
    return lambda tokens: limits.add_tokens(owner, tokens)


# ---------------------------------------------------------------------- WebRTC calls


async def _create_call(request: web.Request) -> web.StreamResponse:
    """``POST /v1/realtime/calls`` (and the beta ``POST /v1/realtime``): answer an offer.

    Unless another worker sent it here, the offer goes to the least-loaded ready worker of
    the cluster (this one on a tie), and that worker answers it.
    """
    principal = await _authenticate(request, allow_subprotocol=False)
    if isinstance(principal, web.Response):
        return principal
    try:
        body = await _read_limited(request.content, MAX_OFFER_BODY_BYTES)
    except ProtocolError as exc:
        return error_response(400, exc.message, type=exc.type, param=exc.param, code=exc.code)
    if not is_forwarded(request):
        placed = await _place_call(request, body)
        if placed is not None:
            return placed
    state = request.app[STATE]
    if state.draining:
        return draining()
    calls = request.app[CALLS]
    if state.webrtc_error is not None or not calls.mux.started:
        return error_response(503, "WebRTC is not available on this server.", type="server_error")
    try:
        offer, session = _parse_offer(request.headers.get("Content-Type", ""), body)
        config = principal.ephemeral.session if principal.ephemeral is not None else None
        if session is not None:
            config = parse_session_config(session, base=config, param_prefix="session")
    except ProtocolError as exc:
        return error_response(400, exc.message, type=exc.type, param=exc.param, code=exc.code)
    if state.warmup is not None:
        # wait() rather than await: a client leaving must not cancel the shared warm-up.
        await asyncio.wait([state.warmup])
    if state.engines_status != "ready":
        return error_response(503, "The server's engines failed to load.", type="server_error")
    limits = request.app[LIMITS]
    refusal = await _admit_session(limits, principal.owner)
    if refusal is not None:
        return refusal
    model = request.query.get("model") or (config.model if config is not None else None)
    try:
        call, answer = await calls.create(
            offer,
            owner=principal.owner,
            model=model or REALTIME_MODEL,
            config=config,
            on_usage=_usage_counter(limits, principal.owner),
        )
    except OfferError as exc:
        await limits.close_session(principal.owner)
        return error_response(400, str(exc), param="sdp", code="invalid_offer")
    except BaseException:
        await asyncio.shield(limits.close_session(principal.owner))
        raise
    await request.app[NODE].register_call(call.id, principal.owner)
    logger.info("call %s opened for %s (model %r)", call.id, principal.owner, model)
    return web.Response(
        status=201,
        body=answer.encode(),
        content_type="application/sdp",
        headers={"Location": f"/v1/realtime/calls/{call.id}"},
    )


async def _place_call(request: web.Request, body: bytes) -> web.Response | None:
    """Send a new call's offer to the worker placement picks; None when it is this one.

    A worker that cannot be reached is passed over for the next one. With the store down,
    the call stays here: a call needs no shared state to run, only to be placed.
    """
    node = request.app[NODE]
    draining_here = request.app[STATE].draining
    try:
        candidates = await node.place(
            exclude=frozenset({node.id}) if draining_here else frozenset()
        )
    except ClusterUnavailableError as exc:
        logger.warning("cannot place a call (%s); answering it here", exc)
        return None
    forwarder = request.app[FORWARDER]
    metrics = request.app[METRICS]
    for worker in candidates:
        node.placed(worker.id)
        if worker.id == node.id:
            metrics.placements.labels("here").inc()
            return None
        try:
            answer = await forwarder.http(request, worker, body)
        except ForwardError as exc:
            metrics.forwarded.labels("offer", "unreachable").inc()
            logger.warning("placing a call on %s failed: %s", worker.id, exc)
            continue
        metrics.placements.labels("other").inc()
        metrics.forwarded.labels("offer", "ok").inc()
        logger.info("call placed on worker %s (%s)", worker.id, worker.url)
        return answer
    metrics.placements.labels("here").inc()
    return None


def _parse_offer(content_type: str, body: bytes) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and, from a multipart form, the session object; raises ProtocolError."""
    if not content_type.lower().startswith("multipart/form-data"):
        if len(body) > MAX_OFFER_BYTES:
            raise _too_large(MAX_OFFER_BYTES)
        return _decode_text(body, "sdp"), None
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise ProtocolError("The multipart body could not be parsed.", code="invalid_body")
    sdp: str | None = None
    session: dict[str, Any] | None = None
    for part in message.iter_parts():
        if not isinstance(part, Message) or part.is_multipart():
            raise ProtocolError("Nested multipart bodies are not supported.", code="invalid_body")
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        if name == "sdp":
            if len(data) > MAX_OFFER_BYTES:
                raise _too_large(MAX_OFFER_BYTES)
            sdp = _decode_text(data, "sdp")
        elif name == "session":
            if len(data) > MAX_SESSION_PART_BYTES:
                raise _too_large(MAX_SESSION_PART_BYTES)
            try:
                value = json.loads(data)
            except ValueError:
                raise ProtocolError(
                    "The 'session' part is not valid JSON.", param="session", code="invalid_json"
                ) from None
            if not isinstance(value, dict):
                raise ProtocolError(
                    "Invalid type for 'session': expected an object.",
                    param="session",
                    code="invalid_type",
                )
            session = value
    if sdp is None:
        raise ProtocolError(
            "Missing required parameter: 'sdp'.", param="sdp", code="missing_required_parameter"
        )
    return sdp, session


def _too_large(limit: int) -> ProtocolError:
    return ProtocolError(
        f"The request body is larger than {limit} bytes.", code="request_too_large"
    )


async def _read_limited(stream: StreamReader, limit: int) -> bytes:
    data = bytearray()
    while chunk := await stream.read(8192):
        data += chunk
        if len(data) > limit:
            raise _too_large(limit)
    return bytes(data)


def _decode_text(raw: bytes, param: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(
            f"'{param}' is not valid UTF-8 text.", param=param, code="invalid_value"
        ) from None


async def _hangup_call(request: web.Request) -> web.Response:
    """``POST /v1/realtime/calls/{call_id}/hangup``: end a call, wherever it lives."""
    principal = await _authenticate(request, allow_subprotocol=False)
    if isinstance(principal, web.Response):
        return principal
    call = await _find_call(request, principal, request.match_info["call_id"])
    if isinstance(call, web.Response):
        return call
    if isinstance(call, WorkerInfo):
        forwarded = request.app[METRICS].forwarded
        try:
            answer = await request.app[FORWARDER].http(request, call, await request.read())
        except ForwardError as exc:
            forwarded.labels("hangup", "unreachable").inc()
            logger.warning("a hangup could not reach its call's worker: %s", exc)
            return _owner_unreachable()
        forwarded.labels("hangup", "ok").inc()
        return answer
    await call.close("hangup")
    return web.Response(status=200)


async def _attach_sideband(
    request: web.Request, principal: Principal, call_id: str
) -> web.StreamResponse:
    """A WebSocket to ``/v1/realtime?call_id=rtc_…``: the call's events, both ways."""
    call = await _find_call(request, principal, call_id)
    if isinstance(call, web.Response):
        return call
    ws = websocket_response(
        offered_realtime=REALTIME_SUBPROTOCOL in offered_subprotocols(request.headers)
    )
    if not ws.can_prepare(request).ok:
        return error_response(400, "Expected a WebSocket upgrade request.")
    state = request.app[STATE]
    if isinstance(call, WorkerInfo):
        state.websockets.add(ws)
        forwarded = request.app[METRICS].forwarded
        try:
            piped = await request.app[FORWARDER].websocket(request, call, ws)
        except ForwardError as exc:
            forwarded.labels("sideband", "unreachable").inc()
            logger.warning("a sideband could not reach its call's worker: %s", exc)
            return _owner_unreachable()
        finally:
            state.websockets.discard(ws)
        forwarded.labels("sideband", "ok").inc()
        return piped
    await ws.prepare(request)
    state.websockets.add(ws)
    logger.info("sideband attached to call %s for %s", call.id, principal.owner)
    try:
        await call.attach(ws)
    finally:
        state.websockets.discard(ws)
    return ws


def _owner_unreachable() -> web.Response:
    return error_response(
        503,
        "The server that holds this call cannot be reached; try again.",
        type="server_error",
        code="call_unreachable",
    )


async def _find_call(
    request: web.Request, principal: Principal, call_id: str
) -> Call | WorkerInfo | web.Response:
    """The live call ``call_id`` if it is here, the worker that has it if it is elsewhere,
    or the refusal: 404 for a call that does not exist (or no longer does), 403 for another
    key's call, the same on every worker."""
    not_found = error_response(
        404, f"No call found with id '{call_id[:100]}'.", param="call_id", code="not_found"
    )
    call = request.app[CALLS].get(call_id)
    if call is not None:
        return _check_owner(call.id, call.owner, principal) or call
    node = request.app[NODE]
    if is_forwarded(request):
        return not_found
    try:
        record = await node.find_call(call_id)
        if record is None or record.worker_id == node.id:
            return not_found
        refusal = _check_owner(record.id, record.owner, principal)
        if refusal is not None:
            return refusal
        worker = await node.worker(record.worker_id)
    except ClusterUnavailableError as exc:
        logger.warning("cannot look up call %s: %s", call_id[:100], exc)
        return cluster_unavailable()
    return not_found if worker is None else worker


def _check_owner(call_id: str, owner: str, principal: Principal) -> web.Response | None:
    if owner == principal.owner:
        return None
    logger.info("refused access to call %s for %s", call_id, principal.owner)
    return error_response(
        403,
        "This call was created with another API key.",
        type="invalid_request_error",
        code="insufficient_permissions",
    )


# ---------------------------------------------------------------------- metrics


def metrics_for(settings: Settings) -> Metrics:
    """The process's metrics, with turn traces when ``settings.otel_endpoint`` is set.

    Raises ``TracingUnavailableError`` when traces are asked for without the ``otel`` extra.
    """
    tracer = TurnTracer(settings.otel_endpoint) if settings.otel_endpoint else None
    return Metrics(tracer=tracer)


async def _run_metrics(app: web.Application) -> AsyncIterator[None]:
    """Loop lag and process figures while the app runs; batchers report their batches, and
    LLM backends their requests, failures and health."""
    metrics = app[METRICS]
    engines = app[ENGINES]
    for engine_field in dataclasses.fields(engines):
        batcher = getattr(getattr(engines, engine_field.name), "batcher", None)
        if isinstance(batcher, (Batcher, BatchedSileroVad)):
            batcher.observer = metrics.batch_observer(engine_field.name)
    if isinstance(engines.llm, FailoverLlm):
        engines.llm.observer = metrics.llm_backend_observer()
    task = asyncio.create_task(metrics.run_background(), name="hark-metrics")
    yield
    task.cancel()
    await asyncio.wait([task])
    if metrics.tracer is not None:
        await asyncio.to_thread(metrics.tracer.shutdown)


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus scrape: open to loopback peers, others need an API key (not ephemeral)."""
    if not _is_loopback(request.remote):
        principal = await _authenticate(request, allow_subprotocol=False)
        if isinstance(principal, web.Response):
            return principal
        if principal.ephemeral is not None:
            return error_response(
                403, "Ephemeral keys cannot read metrics.", code="insufficient_permissions"
            )
    # Reading every worker's files in multiprocess mode is blocking file I/O.
    body = await asyncio.to_thread(request.app[METRICS].exposition)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _is_loopback(remote: str | None) -> bool:
    if remote is None:
        return False
    try:
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False

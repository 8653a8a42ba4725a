"""The HTTP application: the Realtime WebSocket endpoint, WebRTC calls, ephemeral keys,
models, health.

The server listens at once and loads the engines in the background: ``/healthz`` answers
from the start, ``/readyz`` once the engines are warm. Sessions opened while the engines
load wait for them after the upgrade.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import BodyPartReader, StreamReader, WSCloseCode, web
from aiohttp.abc import AbstractAccessLogger

from hark.config import Settings
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
    # Why WebRTC is unavailable (its UDP port could not be bound), or None.
    webrtc_error: str | None = None


_ids = IdGenerator()

SETTINGS = web.AppKey("settings", Settings)
ENGINES = web.AppKey("engines", Engines)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
STATE = web.AppKey("state", ServerState)
CALLS = web.AppKey("calls", Calls)
METRICS = web.AppKey("metrics", Metrics)
# A session config sent along an offer is a few KB; this leaves room, not abuse.
MAX_SESSION_PART_BYTES = 256 * 1024


def create_app(
    settings: Settings, engines: Engines, metrics: Metrics | None = None
) -> web.Application:
    """The aiohttp application serving hark's HTTP and WebSocket API.

    Raises ``InsecureBindError`` when no API keys are configured and ``settings.host`` is not
    loopback. The engines stay the caller's to close.
    """
    check_bind_policy(settings.host, settings.api_keys)
    app = web.Application()
    app[SETTINGS] = settings
    app[ENGINES] = engines
    app[AUTHENTICATOR] = Authenticator(settings.api_keys)
    app[STATE] = ServerState()
    app[METRICS] = metrics if metrics is not None else metrics_for(settings)
    mux = UdpMux(settings.host, settings.rtc_port, advertise_ip=settings.rtc_advertise_ip)
    app[CALLS] = Calls(engines, mux, metrics=app[METRICS])
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
    app.on_shutdown.append(_close_calls)
    app.on_shutdown.append(_close_websockets)
    app.on_cleanup.append(_stop_warmup)
    app.on_cleanup.append(_stop_webrtc)
    return app


def webrtc_startup_error(app: web.Application) -> str | None:
    """Why WebRTC could not start (its UDP port is taken, say), or None when it runs."""
    return app[STATE].webrtc_error


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
    if not isinstance(response, web.WebSocketResponse):
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)


async def _start_warmup(app: web.Application) -> None:
    state = app[STATE]
    state.warmup = asyncio.create_task(_warm(app[ENGINES], state), name="hark-warmup")


async def _warm(engines: Engines, state: ServerState) -> None:
    try:
        await engines.warmup()
    except Exception:
        state.engines_status = "failed"
        logger.exception("loading the engines failed; /readyz stays unready")
        return
    state.engines_status = "ready"
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


async def _close_calls(app: web.Application) -> None:
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
    status = request.app[STATE].engines_status
    return web.json_response({"status": status}, status=200 if status == "ready" else 503)


def _authenticate(request: web.Request, *, allow_subprotocol: bool) -> Principal | web.Response:
    key = bearer_key(request.headers)
    if key is None and allow_subprotocol:
        key = subprotocol_key(request.headers)
    if key is None:
        return error_response(
            401,
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
    principal = request.app[AUTHENTICATOR].authenticate(key)
    if principal is None:
        logger.info("rejected a request to %s: invalid API key", request.path)
        return error_response(
            401, "Incorrect API key provided, or the ephemeral key expired.", code="invalid_api_key"
        )
    return principal


async def _models(request: web.Request) -> web.Response:
    principal = _authenticate(request, allow_subprotocol=False)
    if isinstance(principal, web.Response):
        return principal
    created = request.app[STATE].started_at
    names = dict.fromkeys([REALTIME_MODEL, request.app[SETTINGS].llm_model_name])
    data = [{"id": n, "object": "model", "created": created, "owned_by": "hark"} for n in names]
    return web.json_response({"object": "list", "data": data})


async def _client_secrets(request: web.Request) -> web.Response:
    principal = _authenticate(request, allow_subprotocol=False)
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
    value, record = request.app[AUTHENTICATOR].mint(principal, session, session_id, seconds)
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
    principal = _authenticate(request, allow_subprotocol=True)
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
        )
        await run_session(ws, runner)
    finally:
        state.websockets.discard(ws)
        logger.info("session closed for %s", principal.owner)
    return ws


# ---------------------------------------------------------------------- WebRTC calls


async def _create_call(request: web.Request) -> web.StreamResponse:
    """``POST /v1/realtime/calls`` (and the beta ``POST /v1/realtime``): answer an offer."""
    principal = _authenticate(request, allow_subprotocol=False)
    if isinstance(principal, web.Response):
        return principal
    state = request.app[STATE]
    calls = request.app[CALLS]
    if state.webrtc_error is not None or not calls.mux.started:
        return error_response(503, "WebRTC is not available on this server.", type="server_error")
    try:
        offer, session = await _read_offer(request)
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
    model = request.query.get("model") or (config.model if config is not None else None)
    try:
        call, answer = await calls.create(
            offer, owner=principal.owner, model=model or REALTIME_MODEL, config=config
        )
    except OfferError as exc:
        return error_response(400, str(exc), param="sdp", code="invalid_offer")
    logger.info("call %s opened for %s (model %r)", call.id, principal.owner, model)
    return web.Response(
        status=201,
        body=answer.encode(),
        content_type="application/sdp",
        headers={"Location": f"/v1/realtime/calls/{call.id}"},
    )


async def _read_offer(request: web.Request) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and, from a multipart form, the session object; raises ProtocolError."""
    if request.content_type != "multipart/form-data":
        return _decode_text(await _read_limited(request.content, MAX_OFFER_BYTES), "sdp"), None
    sdp: str | None = None
    session: dict[str, Any] | None = None
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise ProtocolError("Nested multipart bodies are not supported.", code="invalid_body")
        if part.name == "sdp":
            sdp = _decode_text(await _read_limited(part, MAX_OFFER_BYTES), "sdp")
        elif part.name == "session":
            raw = await _read_limited(part, MAX_SESSION_PART_BYTES)
            try:
                value = json.loads(raw)
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
        else:
            await part.release()
    if sdp is None:
        raise ProtocolError(
            "Missing required parameter: 'sdp'.", param="sdp", code="missing_required_parameter"
        )
    return sdp, session


async def _read_limited(stream: StreamReader | BodyPartReader, limit: int) -> bytes:
    data = bytearray()
    while chunk := (
        await stream.read_chunk(8192)
        if isinstance(stream, BodyPartReader)
        else await stream.read(8192)
    ):
        data += chunk
        if len(data) > limit:
            raise ProtocolError(
                f"The request body is larger than {limit} bytes.", code="request_too_large"
            )
    return bytes(data)


def _decode_text(raw: bytes, param: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(
            f"'{param}' is not valid UTF-8 text.", param=param, code="invalid_value"
        ) from None


async def _hangup_call(request: web.Request) -> web.Response:
    """``POST /v1/realtime/calls/{call_id}/hangup``: end a call."""
    principal = _authenticate(request, allow_subprotocol=False)
    if isinstance(principal, web.Response):
        return principal
    call = _owned_call(request, principal, request.match_info["call_id"])
    if isinstance(call, web.Response):
        return call
    await call.close("hangup")
    return web.Response(status=200)


async def _attach_sideband(
    request: web.Request, principal: Principal, call_id: str
) -> web.StreamResponse:
    """A WebSocket to ``/v1/realtime?call_id=rtc_…``: the call's events, both ways."""
    call = _owned_call(request, principal, call_id)
    if isinstance(call, web.Response):
        return call
    ws = websocket_response(
        offered_realtime=REALTIME_SUBPROTOCOL in offered_subprotocols(request.headers)
    )
    if not ws.can_prepare(request).ok:
        return error_response(400, "Expected a WebSocket upgrade request.")
    await ws.prepare(request)
    state = request.app[STATE]
    state.websockets.add(ws)
    logger.info("sideband attached to call %s for %s", call.id, principal.owner)
    try:
        await call.attach(ws)
    finally:
        state.websockets.discard(ws)
    return ws


def _owned_call(request: web.Request, principal: Principal, call_id: str) -> Call | web.Response:
    """The live call ``call_id`` if ``principal`` owns it, else a 404 or 403 response."""
    call = request.app[CALLS].get(call_id)
    if call is None:
        return error_response(
            404, f"No call found with id '{call_id[:100]}'.", param="call_id", code="not_found"
        )
    if call.owner != principal.owner:
        logger.info("refused access to call %s for %s", call.id, principal.owner)
        return error_response(
            403,
            "This call was created with another API key.",
            type="invalid_request_error",
            code="insufficient_permissions",
        )
    return call


# ---------------------------------------------------------------------- metrics


def metrics_for(settings: Settings) -> Metrics:
    """The process's metrics, with turn traces when ``settings.otel_endpoint`` is set.

    Raises ``TracingUnavailableError`` when traces are asked for without the ``otel`` extra.
    """
    tracer = TurnTracer(settings.otel_endpoint) if settings.otel_endpoint else None
    return Metrics(tracer=tracer)


async def _run_metrics(app: web.Application) -> AsyncIterator[None]:
    """Loop lag and process figures while the app runs; batchers report their batches."""
    metrics = app[METRICS]
    engines = app[ENGINES]
    for engine_field in dataclasses.fields(engines):
        batcher = getattr(getattr(engines, engine_field.name), "batcher", None)
        if isinstance(batcher, (Batcher, BatchedSileroVad)):
            batcher.observer = metrics.batch_observer(engine_field.name)
    task = asyncio.create_task(metrics.run_background(), name="hark-metrics")
    yield
    task.cancel()
    await asyncio.wait([task])
    if metrics.tracer is not None:
        await asyncio.to_thread(metrics.tracer.shutdown)


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus scrape: open to loopback peers, others need an API key (not ephemeral)."""
    if not _is_loopback(request.remote):
        principal = _authenticate(request, allow_subprotocol=False)
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

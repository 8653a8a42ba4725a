"""The HTTP application: wiring the routes, the middleware and the app's lifecycle.

The routes live in ``hark.server.routes``, one module per resource; who may call them is
declared on each and checked by ``hark.server.access``. The server listens at once and
loads the engines in the background: ``/healthz`` answers from the start, ``/readyz`` once
the engines are warm. Sessions opened while the engines load wait for them after the
upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import WSCloseCode, web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_protocol import RequestHandler

from hark.cluster import open_store
from hark.cluster.forwarding import WORKER_HEADER, Forwarder
from hark.cluster.hop_tls import HopTls, hop_url
from hark.cluster.limits import FleetLimits
from hark.cluster.node import ClusterNode, Load
from hark.cluster.store import ClusterStore, ClusterUnavailableError
from hark.config import Settings
from hark.engines.registry import Engines
from hark.observability.metrics import Metrics
from hark.observability.tracing import TurnTracer
from hark.protocol import prompts
from hark.protocol.limits import SESSION_LIMIT_S
from hark.protocol.prompts import PromptStore
from hark.protocol.session_config import SessionConfig, parse_session_config
from hark.server import cors
from hark.server.access import PUBLIC, authentication, requires
from hark.server.admission import admit_session, release_in_background, usage_counter
from hark.server.auth import Authenticator, check_bind_policy
from hark.server.demo import DEMO_KEY_SECONDS, DemoPage
from hark.server.errors import route_errors
from hark.server.routes import (
    beta_sessions,
    calls,
    client_secrets,
    health,
    models,
    sessions,
    speech,
    transcriptions,
    translations,
)
from hark.server.state import (
    AUTHENTICATOR,
    CALL_HOST,
    CALL_REGISTRIES,
    CALLS,
    ENGINES,
    FORWARDER,
    HOP_TLS,
    LIMITS,
    METRICS,
    NODE,
    REALTIME_MODEL,
    SESSION_LIMIT,
    SETTINGS,
    SIP,
    STATE,
    ServerState,
)
from hark.server.webhooks import WebhookSender, incoming_call_event
from hark.tools import egress
from hark.transports.call import Announce, CallHooks, CallHost, CallRegistry, MediaCall, Ringing
from hark.transports.sip.service import SipService
from hark.transports.sip.transaction import Timers
from hark.transports.twilio import TwilioStreams
from hark.transports.twilio_account import TwilioAccount
from hark.transports.webrtc.calls import Calls
from hark.transports.webrtc.udp_mux import UdpMux, behind_relay

# The app keys are part of this module's interface: tests and the CLI reach the app's
# parts through them.
__all__ = [
    "AUTHENTICATOR",
    "CALLS",
    "CALL_HOST",
    "CALL_REGISTRIES",
    "ENGINES",
    "METRICS",
    "SESSION_LIMIT",
    "SIP",
    "STATE",
    "AccessLogger",
    "advertise_url",
    "create_app",
    "drain_app",
    "end_sessions",
    "make_runner",
    "metrics_for",
    "set_advertised_port",
    "webrtc_startup_error",
]

logger = logging.getLogger(__name__)

# Long enough for sessions to say goodbye, short enough that SIGTERM feels prompt.
SHUTDOWN_TIMEOUT_SECONDS = 5.0
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # Responses may carry keys (client_secrets): no cache may keep them.
    "Cache-Control": "no-store",
}
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
    loopback, ``HopTlsError`` when the hop's certificate, key or CA cannot be loaded. The
    engines stay the caller's to close.
    """
    check_bind_policy(settings.host, settings.api_keys)
    # Validated with the settings: it parses.
    egress.configure(egress.EgressPolicy.parse(settings.egress_allow))
    # Validated with the settings: it loads.
    prompts.configure(PromptStore.load(settings.prompts) if settings.prompts else None)
    # Inside authentication: open mode's Host check answers unmatched requests too.
    app = web.Application(middlewares=[authentication, route_errors])
    app[SETTINGS] = settings
    app[ENGINES] = engines
    app[STATE] = ServerState()
    hop_tls = None
    if settings.hop_tls_cert and settings.hop_tls_key and settings.hop_tls_ca:
        hop_tls = HopTls.load(settings.hop_tls_cert, settings.hop_tls_key, settings.hop_tls_ca)
        app[HOP_TLS] = hop_tls
    if store is None:
        store = _open_store(app, settings)
    app[AUTHENTICATOR] = Authenticator(settings.api_keys, store)
    app[METRICS] = metrics if metrics is not None else metrics_for(settings)
    mux = UdpMux(settings.host, settings.rtc_port, advertise_ip=settings.rtc_advertise_ip)
    app[SESSION_LIMIT] = session_limit_s
    # Built once: every session's runner is made by it.
    app[CALL_HOST] = CallHost(engines, app[METRICS], session_limit_s)
    app[CALLS] = Calls(app[CALL_HOST], mux, echo_cancellation=settings.echo_cancellation == "on")
    app[NODE] = ClusterNode(
        store,
        url=advertise_url(settings),
        zone=settings.zone,
        load=lambda: _load(app),
    )
    behind_relay(mux, settings.relay_address, settings.fleet_secret, app[NODE].id)
    app[FORWARDER] = Forwarder(app[NODE].id, tls=hop_tls.client if hop_tls else None)
    app[LIMITS] = FleetLimits(
        store,
        app[NODE].id,
        max_sessions=settings.key_max_sessions,
        requests_per_minute=settings.key_requests_per_minute,
        tokens_per_minute=settings.key_tokens_per_minute,
    )
    # The call transports: each is registered here once, and the server loops over them.
    registries: list[CallRegistry] = [app[CALLS]]
    webhook = _call_webhook(settings)
    ringing = _ringing(settings, webhook)
    if settings.sip:
        app[SIP] = _sip_service(app, settings, ringing)
        registries.append(app[SIP])
    if settings.twilio_auth_token:
        registries.append(_twilio_streams(app, settings, ringing))
    for registry in registries:
        registry.on_closed = lambda call: _call_ended(app, call)
        app.add_routes(_checked_by_itself(route) for route in registry.routes())
    app[CALL_REGISTRIES] = registries
    demo = DemoPage.for_settings(app[AUTHENTICATOR], settings)
    if demo.enabled:
        logger.info(
            "browser demo on at / (it gives a %d-second key to anyone who loads the page)",
            DEMO_KEY_SECONDS,
        )
    app.add_routes(
        [
            *health.routes(),
            *models.routes(),
            *sessions.routes(),
            *calls.routes(),
            *client_secrets.routes(),
            *beta_sessions.routes(),
            *speech.routes(),
            *transcriptions.routes(),
            *translations.routes(),
            *cors.preflight_routes(),
            *demo.routes(),
        ]
    )
    app.on_response_prepare.append(_add_security_headers)
    app.on_response_prepare.append(cors.add_cors_headers)
    app.on_startup.append(_start_warmup)
    app.cleanup_ctx.append(_run_metrics)
    app.on_startup.append(_start_calls)
    app.cleanup_ctx.append(_run_cluster)
    app.on_shutdown.append(_close_calls)
    app.on_shutdown.append(_close_websockets)
    app.on_cleanup.append(_stop_warmup)
    app.on_cleanup.append(_stop_calls)
    if webhook is not None:
        # After the calls: a delivery still under way is given up only now.
        app.on_cleanup.append(lambda app: webhook.aclose())
    return app


def _call_hooks(app: web.Application) -> CallHooks:
    """What a registry of calls that ring needs of the server."""
    state, limits = app[STATE], app[LIMITS]

    async def admit(owner: str) -> bool:
        return await admit_session(app, owner) is None

    return CallHooks(
        register=lambda call_id, owner: app[NODE].register_call(call_id, owner),
        admit=admit,
        usage=lambda owner: usage_counter(limits, owner),
        ready=state.engines_ready,
        accepting=lambda: not state.draining,
    )


def _ringing(settings: Settings, webhook: WebhookSender | None) -> Ringing:
    """How calls ring, SIP's and Twilio's alike: they raise the call webhook through
    ``webhook`` (None: they are answered at once)."""
    return Ringing(
        REALTIME_MODEL,
        announce=_announcer(webhook) if webhook is not None else None,
        default_session=_call_session(settings),
        accept_timeout_s=settings.sip_accept_timeout,
    )


def _call_session(settings: Settings) -> SessionConfig | None:
    """The session of calls answered without a webhook (``sip_session``)."""
    # Validated with the settings: it parses.
    return parse_session_config(json.loads(settings.sip_session)) if settings.sip_session else None


def _checked_by_itself(route: web.RouteDef) -> web.RouteDef:
    """A registry's own route, which checks its callers itself (Twilio's signature): no
    key is asked of them."""
    handler = route.handler

    async def handle(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    return web.route(route.method, route.path, requires(PUBLIC)(handle), **route.kwargs)


def _call_webhook(settings: Settings) -> WebhookSender | None:
    """The sender of the call webhook, where one is configured."""
    if settings.sip_webhook_url and settings.sip_webhook_secret:
        return WebhookSender(settings.sip_webhook_url, settings.sip_webhook_secret)
    return None


def _announcer(webhook: WebhookSender) -> Announce:
    """How a call that rings raises ``realtime.call.incoming`` through ``webhook``."""

    async def announce(call_id: str, headers: list[tuple[str, str]], security: str | None) -> bool:
        event = incoming_call_event(
            webhook.new_event_id(),
            call_id,
            headers,
            created_at=int(time.time()),
            media_security=security,
        )
        delivery = webhook.send(event)
        return delivery is not None and (await delivery).delivered

    return announce


def _twilio_streams(app: web.Application, settings: Settings, ringing: Ringing) -> TwilioStreams:
    """The Twilio stream endpoint of ``settings``: its calls ring like SIP's (``ringing``)."""
    assert settings.twilio_auth_token is not None
    return TwilioStreams(
        app[CALL_HOST],
        _call_hooks(app),
        ringing,
        account=TwilioAccount(settings.twilio_auth_token, settings.twilio_api_url),
        public_url=settings.twilio_url,
        # A phone line, as SIP's: on unless turned off.
        echo_cancellation=settings.echo_cancellation != "off",
    )


def _sip_service(app: web.Application, settings: Settings, ringing: Ringing) -> SipService:
    """The SIP service of ``settings`` (started with the app); its calls ring as ``ringing``
    says, at most ``sip_max_calls`` at once."""
    host = settings.sip_host or settings.host
    state = app[STATE]
    hooks = _call_hooks(app)
    tls_port, ssl_context = settings.sip_tls_port, None
    if tls_port is not None and settings.sip_tls_cert and settings.sip_tls_key:
        try:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(settings.sip_tls_cert, settings.sip_tls_key)
            if settings.sip_tls_client_ca:
                # Mutual TLS: every peer proves itself with a certificate this CA signed.
                ssl_context.load_verify_locations(settings.sip_tls_client_ca)
                ssl_context.verify_mode = ssl.CERT_REQUIRED
            trunk_cas = sorted({t.client_ca for t in settings.sip_trunks if t.client_ca})
            for path in trunk_cas:
                ssl_context.load_verify_locations(path)
            if not settings.sip_tls_client_ca and any(
                t.needs_certificate for t in settings.sip_trunks
            ):
                # A certificate is asked of every peer and verified against every CA above;
                # which trunk it opens is decided per request (trunk.py), so a peer without
                # one still connects and is refused with a SIP 403, as other refusals are.
                ssl_context.verify_mode = ssl.CERT_OPTIONAL
        except (OSError, ssl.SSLError) as exc:
            why = f"cannot load the SIP TLS certificate, key or client CA: {exc}"
            state.unavailable["sip"] = why
            logger.error("SIP over TLS is unavailable: %s", why)
            tls_port, ssl_context = None, None
    ports = settings.rtp_ports
    return SipService.create(
        app[CALL_HOST],
        hooks,
        dataclasses.replace(ringing, max_calls=settings.sip_max_calls),
        bind_host=host,
        port=settings.sip_port,
        advertise_ip=settings.sip_advertise_ip or _concrete_address(host),
        tls_port=tls_port,
        ssl_context=ssl_context,
        rtp_ports=range(ports[0], ports[1] + 1) if ports is not None else None,
        timers=Timers(t1=settings.sip_t1_ms / 1000),
        trunks=settings.sip_trunks,
        invite_rate=settings.sip_invite_rate,
        rtp_timeout_s=settings.sip_rtp_timeout,
        echo_cancellation=settings.echo_cancellation != "off",
    )


def _concrete_address(host: str) -> str:
    """An address others reach ``host`` at: a wildcard becomes this machine's name's."""
    name = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    try:
        return socket.gethostbyname(name)
    except OSError:
        return "127.0.0.1"


def webrtc_startup_error(app: web.Application) -> str | None:
    """Why WebRTC could not start (its UDP port is taken, say), or None when it runs."""
    return app[STATE].unavailable.get("webrtc")


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


def set_hop_port(app: web.Application, port: int) -> None:
    """The worker's TLS hop listener is bound on ``port``: other workers reach it there, at
    the host ``--advertise-url`` (or the bound host) names."""
    app[NODE].url = hop_url(advertise_url(app[SETTINGS]), port)


def set_advertised_port(app: web.Application, port: int) -> None:
    """The worker's HTTP port is known only once it listens (port 0, ``--workers``)."""
    settings = app[SETTINGS]
    if not settings.advertise_url:
        app[NODE].url = advertise_url(settings, port)


def _open_store(app: web.Application, settings: Settings) -> ClusterStore:
    if settings.redis_url:
        return open_store(
            settings.redis_url,
            None,
            settings.fleet_secret,
            redis_password=settings.redis_password,
        )
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
    runners = [*state.sessions]
    for registry in app[CALL_REGISTRIES]:
        runners += [call.runner for call in registry if call.runner is not None]
    return Load(
        sessions=len(runners),
        queue_depth=sum(r.generations_running for r in runners),
        calls_opened=app[CALLS].opened,
    )


def _call_ended(app: web.Application, call: MediaCall) -> None:
    state = app[STATE]
    state.opened_by_ephemeral.pop(call.id, None)
    state.session_ended.set()
    state.spawn(app[NODE].forget_call(call.id), f"forget {call.id}")
    if call.admitted:
        release_in_background(app, call.owner, f"release {call.id}")


def _calls_running(app: web.Application) -> int:
    return sum(len(registry) for registry in app[CALL_REGISTRIES])


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
    while (left := len(state.sessions) + _calls_running(app)) and loop.time() < deadline:
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
    for registry in app[CALL_REGISTRIES]:
        ending += [
            call.end(SHUTDOWN_MESSAGE, SHUTDOWN_CODE, "server shutdown") for call in registry
        ]
    if ending:
        logger.info("ending %d session(s) and call(s)", len(ending))
        await asyncio.gather(*ending, return_exceptions=True)


def make_runner(app: web.Application) -> web.AppRunner:
    """An ``AppRunner`` with hark's access log (which never records credentials) and the
    connection limits of the app's settings: ``http_idle_timeout`` (aiohttp's keep-alive
    timer, which also runs from the moment a connection opens until a request's headers
    are in, so it bounds a slow sender too) and ``max_connections``."""
    settings = app[SETTINGS]
    return _Runner(
        app,
        access_log_class=AccessLogger,
        shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS,
        keepalive_timeout=settings.http_idle_timeout,
    )


class _Runner(web.AppRunner):
    """The app's runner, whose server closes connections beyond ``max_connections``."""

    async def setup(self) -> None:
        """As ``AppRunner.setup``, then the cap on the server it made."""
        await super().setup()
        assert self.server is not None
        _limit_connections(self.server, self.app[SETTINGS].max_connections)


def _limit_connections(server: web.Server, most: int) -> None:
    """Close each connection accepted while ``most`` are open (it gets no answer), logging
    once each time the server fills up."""
    accept = server.connection_made
    full = False

    def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
        nonlocal full
        accept(handler, transport)
        if len(server.connections) <= most:
            full = False
            return
        if not full:
            logger.warning("%d HTTP connections are open; closing new ones", most)
            full = True
        transport.close()

    # aiohttp's Server takes no limit of its own: its accounting hook is wrapped instead.
    server.connection_made = connection_made  # type: ignore[method-assign]


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


async def _start_calls(app: web.Application) -> None:
    # A port in use leaves the server up without that transport, and /readyz says why;
    # `hark serve` treats WebRTC's as fatal.
    state, node = app[STATE], app[NODE]
    for registry in app[CALL_REGISTRIES]:
        try:
            await registry.start()
        except OSError as exc:
            state.unavailable[registry.name] = f"cannot listen on {registry.listening}: {exc}"
            logger.error("%s is unavailable: %s", registry.name, state.unavailable[registry.name])
            continue
        address = registry.media_address
        if address is not None:
            node.media_address = address


async def _close_calls(app: web.Application) -> None:
    await end_sessions(app)
    for registry in app[CALL_REGISTRIES]:
        await registry.close_all()


async def _stop_calls(app: web.Application) -> None:
    for registry in app[CALL_REGISTRIES]:
        await registry.stop()


async def _close_websockets(app: web.Application) -> None:
    sockets = list(app[STATE].websockets)
    await asyncio.gather(
        *(ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown") for ws in sockets),
        return_exceptions=True,
    )


def metrics_for(settings: Settings) -> Metrics:
    """The process's metrics, with turn traces when ``settings.otel_endpoint`` is set.

    Raises ``TracingUnavailableError`` when traces are asked for without the ``otel`` extra.
    """
    tracer = TurnTracer(settings.otel_endpoint) if settings.otel_endpoint else None
    return Metrics(tracer=tracer)


async def _run_metrics(app: web.Application) -> AsyncIterator[None]:
    """Loop lag and process figures while the app runs; engines that report figures of their
    own (batches, LLM backends) are handed the metrics."""
    metrics = app[METRICS]
    app[ENGINES].observe(metrics)
    task = asyncio.create_task(metrics.run_background(), name="hark-metrics")
    yield
    task.cancel()
    await asyncio.wait([task])
    if metrics.tracer is not None:
        await asyncio.to_thread(metrics.tracer.shutdown)

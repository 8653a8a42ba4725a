"""The SIP side of a worker: the user agent server, its calls, and how each is answered.

Every INVITE becomes a ``PhoneCall`` with an ``rtc_…`` id, rings (180), and is recorded in
the cluster store, so that the accept, reject, refer and hangup requests reach this worker
from any other. With a webhook URL the ``realtime.call.incoming`` event goes to the
backend, which accepts (``POST /v1/realtime/calls/{id}/accept``) or rejects the call; one
neither accepted nor rejected within ``accept_timeout_s``, or whose webhook could not be
delivered at all, is rejected (480). Without a webhook every call is answered at once with
the default session, so that a PBX can dial hark with nothing else running.

Who may call: the ``InviteAdmission`` in front of the user agent (``admission.py``) rate-limits
new INVITEs per source address and, when ``trunks`` are configured, admits only their
sources and credentials; at most ``max_calls`` calls ring or talk at once (one more gets
503). The settings refuse SIP on a non-loopback address with neither trunks nor a webhook.

Each call has an RTP port of its own, taken from ``rtp_ports``; the RTP of all of them is
paced by one ``RtpPacer``. The worker's calls count toward its load and its owners' session
limits like WebRTC calls; the server's drain and shutdown end them with BYE.
``SipService`` is a ``hark.transports.call.CallRegistry``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from aiohttp import web

from hark.driver.runner import SessionRunner
from hark.protocol.session_config import SessionConfig
from hark.server.webhooks import WebhookSender, incoming_call_event
from hark.session.ids import IdGenerator
from hark.transports.call import CALL_ID_PREFIX, CallHooks, CallHost, MediaCall
from hark.transports.sip.admission import DEFAULT_RATE, InviteAdmission
from hark.transports.sip.media import RtpPacer, RtpSession
from hark.transports.sip.phone_call import PhoneCall
from hark.transports.sip.sdp import media_security
from hark.transports.sip.transaction import RFC_TIMERS, Timers
from hark.transports.sip.trunk import InboundTrunk
from hark.transports.sip.user_agent import IncomingCall, UserAgentServer

logger = logging.getLogger(__name__)

DEFAULT_ACCEPT_TIMEOUT_S = 30.0
# Calls at once on this worker, ringing or answered; one more is turned away with 503.
DEFAULT_MAX_CALLS = 100
# Seconds without RTP from the caller after which an answered call is hung up.
DEFAULT_RTP_TIMEOUT_S = 60.0
# The status of a call nobody accepted in time, or whose webhook went nowhere.
NOT_ACCEPTED_STATUS = 480
# The status of a call turned away because the server cannot take it (draining, full).
UNAVAILABLE_STATUS = 503
# The status of a call its owner's session limit refuses.
BUSY_STATUS = 486


class SipService:
    """The user agent server and the phone calls of one worker."""

    def __init__(
        self,
        host: CallHost,
        server: UserAgentServer,
        hooks: CallHooks,
        *,
        model: str,
        bind_host: str,
        advertise_ip: str,
        rtp_ports: range | None,
        webhook: WebhookSender | None = None,
        default_session: SessionConfig | None = None,
        accept_timeout_s: float = DEFAULT_ACCEPT_TIMEOUT_S,
        max_calls: int = DEFAULT_MAX_CALLS,
        rtp_timeout_s: float | None = DEFAULT_RTP_TIMEOUT_S,
        echo_cancellation: bool = True,
    ) -> None:
        """``server`` must be made with ``on_invite=service.on_invite`` (see ``create``);
        ``host`` makes the calls' sessions. ``echo_cancellation``: calls take the reply's
        echo out of the caller's audio."""
        self.host = host
        self.server = server
        self.hooks = hooks
        self.model = model
        self.bind_host = bind_host
        self.advertise_ip = advertise_ip
        self.rtp_ports = rtp_ports
        self.webhook = webhook
        self.default_session = default_session
        self.accept_timeout_s = accept_timeout_s
        self.max_calls = max_calls
        self.rtp_timeout_s = rtp_timeout_s
        self.echo_cancellation = echo_cancellation
        self.started = False
        self._calls: dict[str, PhoneCall] = {}
        # One 20 ms wake-up for the RTP of every call rather than one per call.
        self.pacer = RtpPacer()
        self._ids = IdGenerator()
        self._tasks: set[asyncio.Task[None]] = set()
        # Told of every call that ended (the cluster forgets it, the limits release it).
        self.on_closed: Callable[[MediaCall], None] | None = None

    name = "sip"

    @property
    def listening(self) -> str:
        """The SIP port, in words."""
        return f"SIP {self.bind_host} port {self.server.port}"

    @property
    def media_address(self) -> None:
        """None: each call has an RTP port of its own."""
        return None

    @classmethod
    def create(
        cls,
        host: CallHost,
        hooks: CallHooks,
        *,
        bind_host: str,
        port: int,
        advertise_ip: str,
        tls_port: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timers: Timers = RFC_TIMERS,
        trunks: tuple[InboundTrunk, ...] = (),
        invite_rate: float = DEFAULT_RATE,
        **options: Any,
    ) -> SipService:
        """A service with its ``UserAgentServer`` on ``bind_host:port`` (not started yet), its
        transactions on ``timers``, new INVITEs admitted by ``trunks`` (none: all) at
        ``invite_rate`` a second per source address."""
        service: SipService

        def on_invite(incoming: IncomingCall) -> None:
            service.on_invite(incoming)

        server = UserAgentServer(
            on_invite=on_invite,
            host=bind_host,
            port=port,
            advertise_ip=advertise_ip,
            tls_port=tls_port,
            ssl_context=ssl_context,
            timers=timers,
            admission=InviteAdmission(trunks, rate=invite_rate),
        )
        service = cls(
            host, server, hooks, bind_host=bind_host, advertise_ip=advertise_ip, **options
        )
        return service

    async def start(self) -> None:
        """Listen for calls; raises ``OSError`` when the SIP port cannot be bound."""
        await self.server.start()
        self.started = True
        admission = self.server.admission
        trunks = admission.trunks if admission is not None else ()
        logger.info(
            "SIP listening on %s port %d (UDP, TCP%s); calls from %s; %s",
            self.bind_host,
            self.server.port,
            f", TLS {self.server.tls_port}" if self.server.tls_port else "",
            f"trunks {', '.join(t.name for t in trunks)}" if trunks else "any address",
            "calls raise a webhook" if self.webhook else "calls are answered at once",
        )

    async def stop(self) -> None:
        """End every call and stop listening."""
        await self.close_all()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.webhook is not None:
            await self.webhook.aclose()
        if self.started:
            await self.server.stop()
            self.started = False

    def get(self, call_id: str) -> PhoneCall | None:
        """The live call with this id, if any."""
        return self._calls.get(call_id)

    def routes(self) -> list[web.RouteDef]:
        """None: SIP is answered on its own port, not over HTTP."""
        return []

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[PhoneCall]:
        return iter(list(self._calls.values()))

    async def close_all(self, reason: str = "server shutdown") -> None:
        """End every call (BYE, or a reject for those still ringing)."""
        await asyncio.gather(
            *(call.close(reason) for call in list(self._calls.values())), return_exceptions=True
        )

    # ------------------------------------------------------------------ calls

    def on_invite(self, incoming: IncomingCall) -> None:
        """A new INVITE (the stack has sent 100 Trying)."""
        if not self.hooks.accepting() or len(self._calls) >= self.max_calls:
            logger.info("SIP call %s turned away: not taking calls", incoming.sip_call_id[:100])
            incoming.reject(UNAVAILABLE_STATUS)
            return
        call = PhoneCall(
            self._ids.new(CALL_ID_PREFIX),
            incoming,
            self._runner_for,
            bind_host=self.bind_host,
            advertise_ip=self.advertise_ip,
            rtp_ports=self.rtp_ports,
            pacer=self.pacer,
            on_closed=self._forget,
            rtp_timeout_s=self.rtp_timeout_s,
            echo_cancellation=self.echo_cancellation,
        )
        self._calls[call.id] = call
        call.ring()
        logger.info("call %s rings (from %s)", call.id, incoming.remote[0])
        self._spawn(self._route(call), f"{call.id} route")

    def _runner_for(
        self, media: RtpSession, config: SessionConfig | None, owner: str
    ) -> SessionRunner:
        """The session of an accepted call: ``config`` (the default session when None) for
        ``owner``, played by ``media``."""
        config = config if config is not None else self.default_session
        return self.host.runner(
            transport="sip",
            model=(config.model if config is not None else None) or self.model,
            config=config,
            player=media,
            on_usage=self.hooks.usage(owner),
        )

    async def _route(self, call: PhoneCall) -> None:
        """Tell the backend (webhook) or answer at once; reject what nobody accepts."""
        await self.hooks.register(call.id, call.owner)
        if self.webhook is None:
            await self._answer_at_once(call)
            return
        event = incoming_call_event(
            self.webhook.new_event_id(),
            call.id,
            call.incoming.headers,
            created_at=int(time.time()),
            media_security=media_security(call.incoming.offer, secure=call.incoming.secure),
        )
        delivery = self.webhook.send(event)
        if delivery is None:
            self._reject_pending(call, "the webhook queue is full")
            return
        # The timeout runs from the INVITE, not from the delivery: retries of a webhook that
        # fails (backoff, and up to a minute for a receiver that hangs) must not keep the
        # phone ringing past it. The delivery goes on; a late accept finds the call gone.
        settled = asyncio.create_task(call.settled.wait())
        try:
            async with asyncio.timeout(self.accept_timeout_s):
                await asyncio.wait({delivery, settled}, return_when=asyncio.FIRST_COMPLETED)
                if delivery.done() and not delivery.result().delivered:
                    self._reject_pending(call, "its webhook could not be delivered")
                    return
                await settled
        except TimeoutError:
            pass
        finally:
            settled.cancel()
        if call.state == "pending":
            self._reject_pending(call, f"not accepted within {self.accept_timeout_s:g} s")

    async def _answer_at_once(self, call: PhoneCall) -> None:
        if not await self.hooks.ready():
            self._reject_pending(call, "the engines failed to load", UNAVAILABLE_STATUS)
            return
        if not await self.hooks.admit(call.owner):
            self._reject_pending(call, "the session limit is reached", BUSY_STATUS)
            return
        call.admitted = True
        try:
            await call.accept(None, call.owner)
            await self.hooks.register(call.id, call.owner)
        except Exception as exc:
            logger.warning("call %s could not be answered: %s", call.id, exc)

    def _reject_pending(self, call: PhoneCall, why: str, status: int = NOT_ACCEPTED_STATUS) -> None:
        if call.state != "pending" or call.closed.is_set():
            return
        logger.info("call %s rejected (%d): %s", call.id, status, why)
        call.reject(status)

    def _forget(self, call: PhoneCall) -> None:
        if self._calls.get(call.id) is call:
            del self._calls[call.id]
            if self.on_closed is not None:
                self.on_closed(call)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

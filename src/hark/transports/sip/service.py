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
paced by the worker's one ``Pacer`` (the ``CallHost``'s). The worker's calls count toward its
load and its owners' session limits like WebRTC calls; the server's drain and shutdown end
them with BYE. ``SipService`` is a ``hark.transports.call.CallRegistry``.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from hark.transports.call import (
    CALL_ID_PREFIX,
    UNAVAILABLE_STATUS,
    CallHooks,
    CallHost,
    Ringing,
    RingingCalls,
)
from hark.transports.sip.admission import DEFAULT_RATE, InviteAdmission
from hark.transports.sip.phone_call import CallMedia, PhoneCall
from hark.transports.sip.sdp import media_security
from hark.transports.sip.transaction import RFC_TIMERS, Timers
from hark.transports.sip.trunk import InboundTrunk
from hark.transports.sip.user_agent import IncomingCall, UserAgentServer

logger = logging.getLogger(__name__)

# Seconds without RTP from the caller after which an answered call is hung up.
DEFAULT_RTP_TIMEOUT_S = 60.0


class SipService(RingingCalls[PhoneCall]):
    """The user agent server and the phone calls of one worker."""

    def __init__(
        self,
        host: CallHost,
        server: UserAgentServer,
        hooks: CallHooks,
        ringing: Ringing,
        *,
        bind_host: str,
        advertise_ip: str,
        rtp_ports: range | None,
        rtp_timeout_s: float | None = DEFAULT_RTP_TIMEOUT_S,
        echo_cancellation: bool = True,
    ) -> None:
        """``server`` must be made with ``on_invite=service.on_invite`` (see ``create``);
        ``host`` makes the calls' sessions. ``echo_cancellation``: calls take the reply's
        echo out of the caller's audio."""
        super().__init__(host, hooks, ringing)
        self.server = server
        self.started = False
        # One 20 ms wake-up (the host's pacer) for the RTP of every call of the worker.
        self.media = CallMedia(
            bind_host,
            advertise_ip,
            rtp_ports,
            pacer=host.pacer,
            rtp_timeout_s=rtp_timeout_s,
            echo_cancellation=echo_cancellation,
        )

    name = "sip"

    @property
    def listening(self) -> str:
        """The SIP port, in words."""
        return f"SIP {self.media.bind_host} port {self.server.port}"

    @property
    def media_address(self) -> None:
        """None: each call has an RTP port of its own."""
        return None

    @classmethod
    def create(
        cls,
        host: CallHost,
        hooks: CallHooks,
        ringing: Ringing,
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
            host, server, hooks, ringing, bind_host=bind_host, advertise_ip=advertise_ip, **options
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
            self.media.bind_host,
            self.server.port,
            f", TLS {self.server.tls_port}" if self.server.tls_port else "",
            f"trunks {', '.join(t.name for t in trunks)}" if trunks else "any address",
            "calls raise a webhook" if self.ringing.announce else "calls are answered at once",
        )

    async def stop(self) -> None:
        """End every call and stop listening."""
        await self._stop_calls()
        if self.started:
            await self.server.stop()
            self.started = False

    def routes(self) -> list[web.RouteDef]:
        """None: SIP is answered on its own port, not over HTTP."""
        return []

    # ------------------------------------------------------------------ calls

    def on_invite(self, incoming: IncomingCall) -> None:
        """A new INVITE (the stack has sent 100 Trying)."""
        if self._turns_away():
            logger.info("SIP call %s turned away: not taking calls", incoming.sip_call_id[:100])
            incoming.reject(UNAVAILABLE_STATUS)
            return
        call = PhoneCall(
            self._ids.new(CALL_ID_PREFIX),
            incoming,
            self._runner_for,
            self.media,
            on_closed=self._forget,
        )
        call.ring()
        logger.info("call %s rings (from %s)", call.id, incoming.remote[0])
        self._add(call)

    def _announce(self, call: PhoneCall) -> Awaitable[bool] | None:
        """``realtime.call.incoming`` with the INVITE's headers (None: no webhook)."""
        announce = self.ringing.announce
        if announce is None:
            return None
        incoming = call.incoming
        security = media_security(incoming.offer, secure=incoming.secure)
        return announce(call.id, incoming.headers, security)

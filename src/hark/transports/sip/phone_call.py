"""One phone call: the SIP dialog, its RTP session, and the Realtime session it drives.

A call rings (``pending``) until the backend accepts or rejects it (or the accept timeout
does). On accept the caller's SDP offer is answered by a fresh ``RtpSession``, the 200 OK
goes out, and a ``SessionRunner`` with the accepted config starts, the RTP session as its
player: caller audio goes into the session, reply audio leaves as G.711 paced by the
server's playout, DTMF (RFC 4733 or SIP INFO) becomes ``input_audio_buffer.dtmf_event_received``
and never reaches the VAD. Events leave on every sideband WebSocket attached with
``?call_id=`` (a phone has no data channel), and client events from any of them go to the
session.

The media starts once the caller has acknowledged the answer (its ACK), not at the answer:
a phone that has not processed the 200 OK yet drops what it receives, and a greeting asked
for right after accept would lose its first syllable. Audio the session makes before then
waits in the playout, which starts its clock with the first frame it sends; from then on
RTP leaves every 20 ms, silence included, which keeps NAT bindings open.

The RTP session sends only to where the caller's RTP comes from (``media.py``), unless the
inbound trunk that admitted the call is trusted, and ends the call when the caller's RTP
stops for ``rtp_timeout_s``.

The session, the sidebands, the fan-out of events, ending and closing are the
``MediaCall``'s (``hark.transports.call``); this module adds the SIP dialog and the RTP.

A call ends on hang-up (the API), BYE or CANCEL from the phone, a transfer that
completed, the end of its session, silence on the RTP port, and server shutdown; ending
releases the session, the media and the sidebands, and sends BYE when the phone has not
hung up itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from hark.driver.runner import SessionRunner
from hark.protocol.session_config import SessionConfig
from hark.transports.call import CallOfferError, CallStateError, MediaCall
from hark.transports.sip.dtmf import digit_from_info
from hark.transports.sip.media import RtpSession
from hark.transports.sip.sdp import SdpError
from hark.transports.sip.user_agent import IncomingCall
from hark.transports.ticker import Pacer

logger = logging.getLogger(__name__)

# How long the media waits for the caller's ACK before it starts anyway (the stack ends a
# call without one after 32 s; by then the media no longer matters).
ACK_WAIT_S = 32.0

# The session of an accepted call: made around its RTP session (the player), from the
# accepted config (None: the service's default) for the accepting owner.
RunnerFor = Callable[[RtpSession, SessionConfig | None, str], SessionRunner]

__all__ = ["ACK_WAIT_S", "CallStateError", "PhoneCall", "RunnerFor"]


@dataclass(frozen=True, slots=True)
class CallMedia:
    """How a worker's phone calls carry their RTP, the same for every call of a service.

    ``pacer`` paces the RTP of the worker's calls (None: one of each call's own).
    ``rtp_timeout_s``: a call ends (BYE) when the caller's RTP stops for that long (None:
    never). ``echo_cancellation``: the reply's echo is taken out of the caller's audio.
    """

    bind_host: str
    advertise_ip: str
    rtp_ports: range | None
    pacer: Pacer | None = None
    rtp_timeout_s: float | None = None
    echo_cancellation: bool = True


class PhoneCall(MediaCall):
    """A SIP call (``rtc_…``), the same surface as ``hark.transports.webrtc.call.Call``.

    ``owner`` is the key that accepted it (``""`` while pending: any real key of the server
    may accept or reject it, as OpenAI lets the project that owns the trunk); ``runner``
    exists once accepted. ``media`` says how its RTP goes. ``on_closed`` is called once, at
    the end of ``close``. A phone has no event channel: the events made before the first
    sideband attaches (the backend connects after its accept) are held for it.
    ``runner_for`` makes the session of an accepted call.
    """

    kind = "SIP"
    actions = frozenset({"accept", "reject", "refer"})

    def __init__(
        self,
        call_id: str,
        incoming: IncomingCall,
        runner_for: RunnerFor,
        media: CallMedia,
        *,
        on_closed: Callable[[PhoneCall], None] | None = None,
    ) -> None:
        super().__init__(call_id, "", on_closed=on_closed, hold_for_sideband=True)
        self.incoming = incoming
        self.media: RtpSession | None = None
        self.state = "pending"
        self._runner_for = runner_for
        self._media = media
        incoming.on_ended = self._on_sip_ended
        incoming.on_info = self._on_info
        incoming.on_reoffer = self._on_reoffer

    # ------------------------------------------------------------------ life cycle

    def ring(self) -> None:
        """Tell the caller the call is ringing (180)."""
        self.incoming.ringing()

    async def accept(self, config: SessionConfig | None, owner: str) -> None:
        """Answer the caller with a session of ``config`` for ``owner``, around the call's
        RTP session (its player). Raises ``CallOfferError`` for an offer it cannot answer
        (the call is rejected with 488 then) and ``CallStateError``; an ``OSError`` when no
        RTP port is free (rejected with 503)."""
        if self.state != "pending" or self._closing:
            raise CallStateError(f"The call is {self._public_state()}; it cannot be accepted.")
        self.state = "accepted"
        self.settled.set()
        self.owner = owner
        try:
            trunk = self.incoming.trunk
            media = await RtpSession.open(
                bind_host=self._media.bind_host,
                ports=self._media.rtp_ports,
                pacer=self._media.pacer,
                trusted=trunk is not None and trunk.trusted,
                peer_ip=self.incoming.remote[0],
            )
            if self._closing:
                # The caller hung up (CANCEL) while the port was being opened.
                await media.close()
                raise CallStateError("The call ended before it could be answered.")
            self.media = media
            answer = media.negotiate(
                self.incoming.offer, self._media.advertise_ip, secure=self.incoming.secure
            )
            self.runner = runner = self._runner_for(media, config, owner)
        except CallStateError:
            raise
        except SdpError as exc:
            await self._fail_setup(488, "Not Acceptable Here")
            raise CallOfferError(f"The caller's SDP offer could not be answered: {exc}") from None
        except OSError:
            await self._fail_setup(503, "Service Unavailable")
            raise
        except BaseException:
            await asyncio.shield(self._fail_setup(500, "Server Internal Error"))
            raise
        self.incoming.answer(answer)
        await runner.start()
        self._start_events()
        self._spawn(self._start_media(), "media")
        logger.info("call %s answered (session %s)", self.id, runner.id)

    async def _fail_setup(self, status: int, reason: str) -> None:
        self.incoming.reject(status, reason)
        await self.close("setup failed")

    async def _start_media(self) -> None:
        """Start RTP once the caller has taken the answer (see the module's docstring)."""
        try:
            await asyncio.wait_for(self.incoming.acked.wait(), ACK_WAIT_S)
        except TimeoutError:
            logger.info("call %s: no ACK seen; starting the media anyway", self.id)
        media, runner = self.media, self.runner
        if media is None or runner is None or self._closing:
            return
        media.start(
            input_rate=runner.input_rate,
            on_audio=runner.receive_audio,
            on_dtmf=runner.receive_dtmf,
            listener=runner,
            metrics=runner.metrics,
            rtp_timeout=self._media.rtp_timeout_s,
            on_inactive=self._on_rtp_inactive,
            echo_cancellation=self._media.echo_cancellation,
        )

    def _on_rtp_inactive(self) -> None:
        if not self._closing:
            self._spawn(self.close("no RTP from the caller"), "close")

    def reject(self, status: int = 603) -> None:
        """Decline the ringing call with ``status``; raises ``CallStateError``."""
        if self.state != "pending" or self._closing:
            raise CallStateError(f"The call is {self._public_state()}; it cannot be rejected.")
        self.incoming.reject(status)
        self.settled.set()
        self._spawn(self.close("rejected"), "close")

    async def refer(self, target_uri: str) -> int:
        """Transfer the answered call to ``target_uri``; the final SIP status of the
        transfer (2xx: it succeeded). Raises ``CallStateError`` and ``TimeoutError``."""
        if self.state != "accepted" or self._closing:
            raise CallStateError(f"The call is {self._public_state()}; it cannot be referred.")
        try:
            status = await self.incoming.refer(target_uri)
        except RuntimeError as exc:
            # The stack's word for a call that ended, or a transfer already under way.
            raise CallStateError(f"The call cannot be referred: {exc}.") from None
        logger.info("call %s: transfer answered %d", self.id, status)
        return status

    def _close_begins(self) -> None:
        if self.incoming.state != "ended":
            self.incoming.hangup()

    async def _release(self) -> None:
        if self.media is not None:
            await self.media.close()

    def _released(self) -> None:
        self.incoming.on_ended = None
        self.incoming.on_info = None
        self.incoming.on_reoffer = None

    def _public_state(self) -> str:
        return "ended" if self._closing else self.state

    # ------------------------------------------------------------------ SIP events

    def _on_sip_ended(self, reason: str) -> None:
        if not self._closing:
            self._spawn(self.close(f"phone: {reason}"), "close")

    def _on_info(self, content_type: str, body: bytes) -> None:
        key = digit_from_info(content_type, body)
        if key is not None and self.runner is not None and self.state == "accepted":
            self.runner.receive_dtmf(key)

    def _on_reoffer(self, offer: str) -> str | None:
        if self.media is None:
            return None
        try:
            advertise_ip = self._media.advertise_ip
            return self.media.negotiate(offer, advertise_ip, secure=self.incoming.secure)
        except SdpError as exc:
            logger.info("call %s: re-INVITE refused: %s", self.id, exc)
            return None

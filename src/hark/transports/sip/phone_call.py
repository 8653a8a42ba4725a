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

A call ends on hang-up (the API), BYE or CANCEL from the phone, a transfer that
completed, the end of its session, silence on the RTP port, and server shutdown; ending
releases the session, the media and the sidebands, and sends BYE when the phone has not
hung up itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Literal

from aiohttp import web

from hark.session.runner import SessionRunner
from hark.transports.sideband import Sidebands
from hark.transports.sip.dtmf import digit_from_info
from hark.transports.sip.media import RtpPacer, RtpSession
from hark.transports.sip.sdp import SdpError
from hark.transports.sip.user_agent import IncomingCall

logger = logging.getLogger(__name__)

# Events held until the first sideband attaches (the backend connects after its accept);
# beyond that the oldest are dropped.
MAX_PENDING_EVENTS = 1000
# How long a call ended by the server waits for its last events to leave.
END_FLUSH_TIMEOUT_S = 1.0
# How long the media waits for the caller's ACK before it starts anyway (the stack ends a
# call without one after 32 s; by then the media no longer matters).
ACK_WAIT_S = 32.0

CallState = Literal["pending", "accepted", "ended"]


class CallStateError(Exception):
    """The call is not in a state that allows the request (accept twice, refer unanswered)."""


class PhoneCall:
    """A SIP call (``rtc_…``), the same surface as ``hark.transports.webrtc.call.Call``.

    ``owner`` is the key that accepted it (``""`` while pending: any real key of the server
    may accept or reject it, as OpenAI lets the project that owns the trunk); ``runner``
    exists once accepted. ``pacer`` paces the RTP of the worker's calls (None: one of the
    call's own). ``on_closed`` is called once, at the end of ``close``. ``rtp_timeout_s``:
    the call ends (BYE) when the caller's RTP stops for that long (None: never).
    ``echo_cancellation``: the reply's echo is taken out of the caller's audio.
    """

    def __init__(
        self,
        call_id: str,
        incoming: IncomingCall,
        *,
        bind_host: str,
        advertise_ip: str,
        rtp_ports: range | None,
        pacer: RtpPacer | None = None,
        on_closed: Callable[[PhoneCall], None] | None = None,
        rtp_timeout_s: float | None = None,
        echo_cancellation: bool = True,
    ) -> None:
        self.id = call_id
        self.incoming = incoming
        self.owner = ""
        self.runner: SessionRunner | None = None
        self.media: RtpSession | None = None
        self.state: CallState = "pending"
        # Set once the call is no longer pending (accepted, rejected or ended).
        self.settled = asyncio.Event()
        # Whether the call counts against its owner's session limit (released at the end).
        self.admitted = False
        self._bind_host = bind_host
        self._advertise_ip = advertise_ip
        self._rtp_ports = rtp_ports
        self._pacer = pacer
        self._on_closed = on_closed
        self._rtp_timeout_s = rtp_timeout_s
        self._echo_cancellation = echo_cancellation
        self._sidebands = Sidebands(call_id)
        self._pending: deque[str] = deque(maxlen=MAX_PENDING_EVENTS)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fan_out_task: asyncio.Task[None] | None = None
        self._acked = asyncio.Event()
        self._end_reason: str | None = None
        self._closing = False
        self.closed = asyncio.Event()
        self.close_reason: str | None = None
        incoming.on_ended = self._on_sip_ended
        incoming.on_info = self._on_info
        incoming.on_reoffer = self._on_reoffer

    # ------------------------------------------------------------------ life cycle

    def ring(self) -> None:
        """Tell the caller the call is ringing (180)."""
        self.incoming.ringing()

    async def accept(self, runner_for: Callable[[RtpSession], SessionRunner], owner: str) -> None:
        """Answer the caller with the session ``runner_for`` makes around the call's RTP
        session (its player). Raises ``SdpError`` (the call is rejected with 488 then) and
        ``CallStateError``; an ``OSError`` when no RTP port is free (rejected with 503)."""
        if self.state != "pending" or self._closing:
            raise CallStateError(f"The call is {self._public_state()}; it cannot be accepted.")
        self.state = "accepted"
        self.settled.set()
        self.owner = owner
        try:
            trunk = self.incoming.trunk
            media = await RtpSession.open(
                bind_host=self._bind_host,
                ports=self._rtp_ports,
                pacer=self._pacer,
                trusted=trunk is not None and trunk.trusted,
                peer_ip=self.incoming.remote[0],
            )
            if self._closing:
                # The caller hung up (CANCEL) while the port was being opened.
                await media.close()
                raise CallStateError("The call ended before it could be answered.")
            self.media = media
            answer = media.negotiate(
                self.incoming.offer, self._advertise_ip, secure=self.incoming.secure
            )
            self.runner = runner = runner_for(media)
        except CallStateError:
            raise
        except SdpError:
            await self._fail_setup(488, "Not Acceptable Here")
            raise
        except OSError:
            await self._fail_setup(503, "Service Unavailable")
            raise
        except BaseException:
            await asyncio.shield(self._fail_setup(500, "Server Internal Error"))
            raise
        self.incoming.answer(answer)
        await runner.start()
        self._fan_out_task = self._spawn(self._fan_out(), "events")
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
            input_rate=lambda: runner.session.input_rate,
            on_audio=runner.receive_audio,
            on_dtmf=runner.receive_dtmf,
            listener=runner,
            metrics=runner.metrics,
            rtp_timeout=self._rtp_timeout_s,
            on_inactive=self._on_rtp_inactive,
            echo_cancellation=self._echo_cancellation,
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

    async def end(self, message: str, code: str, reason: str) -> None:
        """End the call from the server's side (drain, shutdown): the sidebands are told
        why in an ``error`` event, then the call closes (BYE)."""
        if not self._closing and self.runner is not None:
            self._end_reason = reason
            await self.runner.end(message, code, reason)
            if self._fan_out_task is not None:
                await asyncio.wait([self._fan_out_task], timeout=END_FLUSH_TIMEOUT_S)
        await self.close(reason)

    async def close(self, reason: str) -> None:
        """End the call and release everything it holds. Idempotent."""
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        self.close_reason = reason
        logger.info("call %s ends: %s", self.id, reason)
        try:
            if self.incoming.state != "ended":
                self.incoming.hangup()
            if self.runner is not None:
                await self.runner.close()
            current = asyncio.current_task()
            tasks = [t for t in self._tasks if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # A cancelled task keeps its traceback, whose frames refer back to this call: held
            # here, that cycle would keep the call, its session and audio until a collection.
            self._fan_out_task = None
            if self.media is not None:
                await self.media.close()
        except Exception:
            logger.exception("call %s: error while closing", self.id)
        finally:
            self.state = "ended"
            self.settled.set()
            self.incoming.on_ended = None
            self.incoming.on_info = None
            self.incoming.on_reoffer = None
            self._sidebands.end()
            self.closed.set()
            if self._on_closed is not None:
                self._on_closed(self)

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
            return self.media.negotiate(offer, self._advertise_ip, secure=self.incoming.secure)
        except SdpError as exc:
            logger.info("call %s: re-INVITE refused: %s", self.id, exc)
            return None

    # ------------------------------------------------------------------ sideband

    async def attach(self, ws: web.WebSocketResponse) -> None:
        """Serve a sideband WebSocket until it or the call ends (the call must be
        accepted); the first one gets the events made before it attached."""
        if self.runner is None:
            raise CallStateError("The call has not been accepted.")
        held = [] if self._sidebands else list(self._pending)
        self._pending.clear()
        await self._sidebands.serve(ws, self.runner, held)

    @property
    def sidebands(self) -> int:
        """How many sideband sockets are attached."""
        return len(self._sidebands)

    async def _fan_out(self) -> None:
        assert self.runner is not None
        async for text in self.runner.outgoing():
            if self._sidebands:
                self._sidebands.publish(text)
            else:
                self._pending.append(text)
        # The session ended (its time limit, or the server ending it): the call ends with it.
        self._spawn(self.close(self._end_reason or "session ended"), "close")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=f"{self.id} {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

"""One WebRTC call: a peer connection, the session it drives, and the sockets attached to it.

Events travel on the client's ``oai-events`` data channel exactly as over WebSocket, and on
every sideband WebSocket attached with ``?call_id=``: each server event goes to all of
them, and client events from any of them go to the session. The caller's audio track feeds
the session's input; the reply plays on the outgoing ``PlayoutTrack``. Once the peer
connection is connected, the audio in both directions runs on the lean ``AudioPath``
(``hark.transports.webrtc.rtp_audio``), the reply paced by the worker's ``Pacer``.

The session, the sidebands, the fan-out of events, ending and closing are the
``MediaCall``'s (``hark.transports.call``); this module adds the peer connection, its data
channel and the audio path.

A call ends on hang-up, when the session ends, when the peer connection fails or closes
(ICE failure, consent freshness lost, the client's DTLS close), when it is not connected
within ``SETUP_TIMEOUT_SECONDS``, and at server shutdown. Ending always releases the same
things in the same order: the session (its engine work), the media tasks, the peer
connection (tracks, data channel, SCTP, DTLS, ICE and with it the mux registration) and the
sideband sockets; aiortc leaks sockets, threads and memory otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpSender,
    RTCRtpTransceiver,
    RTCSessionDescription,
)

from hark.driver.backlog import BACKLOG_EXCEEDED, MAX_BACKLOG_BYTES
from hark.driver.runner import SessionRunner
from hark.protocol import server_events as se
from hark.session.ids import IdGenerator
from hark.tools import egress
from hark.transports.beta import Dialect
from hark.transports.call import END_FLUSH_TIMEOUT_S, MediaCall
from hark.transports.echo import CallEcho
from hark.transports.input_budget import InputBudget, InputGate
from hark.transports.ticker import Pacer
from hark.transports.webrtc.aiortc_internals import sctp_receive, set_sctp_receive
from hark.transports.webrtc.candidates import CandidatePolicy
from hark.transports.webrtc.ice import use_shared_port
from hark.transports.webrtc.input_audio import InputAudio
from hark.transports.webrtc.playout import PLAYOUT_RATE, PlayoutTrack
from hark.transports.webrtc.rtp_audio import AudioPath
from hark.transports.webrtc.sdp import OfferError, check_offer
from hark.transports.webrtc.udp_mux import UdpMux

logger = logging.getLogger(__name__)
# The code of the error sent in place of a server event too large for the data channel.
EVENT_TOO_LARGE = "event_too_large"
# Ids for the events this module makes itself.
_ids = IdGenerator()

EVENTS_CHANNEL = "oai-events"
# ICE and DTLS take well under a second on a working path; a client that has not connected
# by then never will, and its call holds a session.
SETUP_TIMEOUT_SECONDS = 30.0
# Events held while the data channel is not open yet; beyond that the oldest are dropped.
MAX_PENDING_EVENTS = 1000
# The most the data channel may hold unsent (SCTP waits for a peer that reads); past it the
# caller is not reading events and the call ends, as a WebSocket session's backlog does.
MAX_CHANNEL_BACKLOG_BYTES = MAX_BACKLOG_BYTES


# aiortc's Opus codec, the one audio codec a call offers or answers with.
OPUS_CODECS = [
    codec
    for codec in RTCRtpSender.getCapabilities("audio").codecs
    if codec.mimeType.lower() == "audio/opus"
]


class Call(MediaCall):
    """A WebRTC call (``rtc_…``) owned by ``owner`` (see ``hark.server.auth.Principal``).

    ``negotiate`` answers the offer, ``start`` runs the session, ``close`` ends it all;
    ``on_closed`` is called once, at the end of ``close``. ``pacer`` paces the reply audio
    (one for all the calls of a worker). The call is admitted: its owner's limits counted
    it before it was made.
    """

    runner: SessionRunner
    has_channel = True
    kind = "WebRTC"

    def __init__(
        self,
        call_id: str,
        owner: str,
        runner: SessionRunner,
        track: PlayoutTrack,
        *,
        pacer: Pacer,
        on_closed: Callable[[Call], None] | None = None,
        setup_timeout_s: float = SETUP_TIMEOUT_SECONDS,
        dialect: Dialect | None = None,
        echo_cancellation: bool = True,
    ) -> None:
        super().__init__(call_id, owner, on_closed=on_closed)
        self.runner = runner
        self.admitted = True
        self.track = track
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._pacer = pacer
        self._transceiver: RTCRtpTransceiver | None = None
        self.audio: AudioPath | None = None
        # The reply's echo taken out of the caller's audio (``hark.transports.echo``).
        playout = track.playout
        self.echo = (
            CallEcho(PLAYOUT_RATE, runner.receive_audio, lambda: playout.frames_skipped)
            if echo_cancellation
            else None
        )
        self._setup_timeout_s = setup_timeout_s
        self._channel: RTCDataChannel | None = None
        self._gate: InputGate[None] | None = None
        self._pending: deque[str] = deque(maxlen=MAX_PENDING_EVENTS)
        # The data channel's dialect; sidebands speak GA.
        self._channel_dialect = dialect or Dialect(beta=False)
        # Set once the data channel's backlog passed its bound and the call began to close.
        self._overflowed = False
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)

    # ------------------------------------------------------------------ life cycle

    async def negotiate(self, offer: str, mux: UdpMux) -> str:
        """Answer ``offer`` with ICE on ``mux``; returns the SDP answer.

        The server checks only the offer's candidates that are within policy for the
        address its candidate carries, with the process's egress allow-list
        (``hark.transports.webrtc.candidates``). Raises ``OfferError`` when the offer
        cannot be answered (the call is closed then).
        """
        try:
            policy = CandidatePolicy.serving_at(mux.candidate[0], egress.current())
            offer, kinds = check_offer(offer, policy)
            if "audio" in kinds:
                # Made before the offer is applied, so that it takes the offer's first audio
                # section with Opus only: the playout track sends Opus packets.
                transceiver = self.pc.addTransceiver(self.track, direction="sendrecv")
                transceiver.setCodecPreferences(OPUS_CODECS)
                self._transceiver = transceiver
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            use_shared_port(self.pc, mux)
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except OfferError:
            await self.close("bad offer")
            raise
        except Exception as exc:
            await self.close("bad offer")
            reason = str(exc) or type(exc).__name__
            raise OfferError(f"The SDP offer could not be answered: {reason}") from None
        return self.pc.localDescription.sdp

    async def start(self) -> None:
        """Start the session and its event fan-out; the call is live."""
        self.track.attach(self.runner)
        await self.runner.start()
        self._start_events()
        self._spawn(self._setup_deadline(), "setup deadline")

    async def _flush(self) -> None:
        """Wait (boundedly) until the data channel has handed its queued events to SCTP."""
        channel = self._channel
        if channel is None or channel.readyState != "open" or channel.bufferedAmount == 0:
            return
        emptied = asyncio.Event()
        channel.bufferedAmountLowThreshold = 0
        channel.on("bufferedamountlow", emptied.set)
        try:
            await asyncio.wait_for(emptied.wait(), END_FLUSH_TIMEOUT_S)
        except TimeoutError:
            logger.info("call %s: events still queued on the data channel at the end", self.id)
        finally:
            channel.remove_listener("bufferedamountlow", emptied.set)

    def _close_begins(self) -> None:
        if self._gate is not None:
            self._gate.close()

    async def _release(self) -> None:
        if self.audio is not None:
            self.audio.close()
        self.track.stop()
        if self._channel is not None:
            self._channel.remove_all_listeners()
            self._channel = None
        self._pending.clear()
        await self.pc.close()

    def _released(self) -> None:
        self.pc.remove_all_listeners()

    # ------------------------------------------------------------------ events

    def _send_to_channel(self, text: str) -> None:
        channel = self._channel
        if channel is None or channel.readyState != "open":
            self._pending.append(text)
            return
        _send(channel, text)
        if (
            channel.bufferedAmount > MAX_CHANNEL_BACKLOG_BYTES
            and not self._closing
            and not self._overflowed
        ):
            self._overflowed = True
            logger.warning("call %s: the data channel's backlog passed its bound", self.id)
            self._spawn(self._not_reading(), "close")

    async def _not_reading(self) -> None:
        # The session first, so that it is counted as ended for its backlog.
        await self.runner.close(BACKLOG_EXCEEDED)
        await self.close(BACKLOG_EXCEEDED)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self._channel is not None:
            logger.info("call %s: ignoring data channel %r", self.id, channel.label)
            return
        self._channel = channel
        self._budget_channel()
        channel.on("message", self._on_message)
        channel.on("open", self._flush_pending)
        channel.on("close", self._on_channel_closed)
        if channel.readyState == "open":
            self._flush_pending()

    def _flush_pending(self) -> None:
        channel = self._channel
        while channel is not None and channel.readyState == "open" and self._pending:
            _send(channel, text=self._pending.popleft())

    def _on_channel_closed(self) -> None:
        if self._channel is not None:
            self._channel.remove_all_listeners()
            self._channel = None

    def _budget_channel(self) -> None:
        """Charge the data channel's events to an input budget, as a WebSocket's are.

        While the budget is dry the call's SCTP association hands over no message: its DTLS
        loop waits, so the caller's window closes and it stops sending (the audio, taken
        over by ``AudioPath`` before DTLS, flows on). Messages are handed over one at a time,
        so none has to be held.
        """
        sctp = self.pc.sctp
        if sctp is None:
            return
        gate: InputGate[None] = InputGate(
            InputBudget(time.perf_counter()),
            pause_reading=_no_reading_to_pause,
            resume_reading=_no_reading_to_pause,
            deliver=_nothing_held,
            throttled=self.runner.metrics.input_throttled,
        )
        receive = sctp_receive(sctp)

        async def receive_within_budget(stream_id: int, pp_id: int, data: bytes) -> None:
            await gate.wait()
            await receive(stream_id, pp_id, data)

        set_sctp_receive(sctp, receive_within_budget)
        self._gate = gate

    def _on_message(self, message: str | bytes) -> None:
        # Other sessions' VAD results, handed out first, are not this call's input.
        self.runner.catch_up()
        start = time.perf_counter()
        if isinstance(message, str):
            self.runner.receive_text(self._channel_dialect.incoming(message))
        else:
            self.runner.receive_bytes(message)
        if self._gate is not None:
            self._gate.spent(start)

    # ------------------------------------------------------------------ media and state

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        logger.debug("call %s: connection %s", self.id, state)
        if state == "connected" and self._transceiver is not None and self.audio is None:
            # Now, before aiortc starts its sender and receiver: DTLS has just made the
            # SRTP keys, and no RTP has gone through aiortc yet.
            runner = self.runner
            sink: Callable[[npt.NDArray[np.int16]], None] = runner.receive_audio
            echo = self.echo
            if echo is not None:
                self.track.playout.tap = echo.played

                def sink(pcm: npt.NDArray[np.int16]) -> None:
                    runner.receive_audio(echo.heard(pcm, runner.input_rate()))

            try:
                self.audio = AudioPath.take_over(
                    self._transceiver,
                    self.track,
                    self._pacer,
                    InputAudio(runner.input_rate, sink, runner.metrics),
                )
            except Exception:
                logger.exception("call %s: the audio path could not start", self.id)
                self._spawn(self.close("audio failed"), "close")
        if state in ("failed", "closed") and not self._closing:
            self._spawn(self.close(f"connection {state}"), "close")

    async def _setup_deadline(self) -> None:
        await asyncio.sleep(self._setup_timeout_s)
        if self.pc.connectionState != "connected":
            self._spawn(self.close("not connected in time"), "close")


def _send(channel: RTCDataChannel, text: str) -> None:
    """Send an event on the channel, or, when it is larger than the peer takes in one message
    (its SDP's max-message-size, 256 KiB in Chrome and aiortc: the ``conversation.item.
    retrieved`` of an audio item of four seconds or more, say), an ``error`` saying so in
    its place: the client hears why, and the call's events go on."""
    try:
        channel.send(text)
    except ValueError:
        channel.send(too_large_for_channel(text))


def too_large_for_channel(text: str) -> str:
    """The ``error`` event sent in place of the server event ``text``, too large for the
    call's data channel."""
    kind = json.loads(text).get("type", "server")
    size = len(text.encode("utf-8"))
    error = se.Error(
        event_id=_ids.new("event"),
        error=se.ErrorDetail(
            type="invalid_request_error",
            code=EVENT_TOO_LARGE,
            message=(
                f"The {kind} event ({size} bytes) is larger than the data channel carries in "
                "one message, so it was not sent. The call's sideband WebSocket carries it."
            ),
            param=None,
            event_id=None,
        ),
    )
    return se.encode_event(error).decode()


def _no_reading_to_pause() -> None:
    """The data channel's reading waits in ``Call._budget_channel`` instead."""


def _nothing_held(item: None) -> None:
    """Nothing is held: SCTP hands messages over one at a time."""

"""One call's audio over RTP: G.711 both ways, DTMF in, RTCP, paced reply audio out.

``RtpSession`` owns one UDP socket, taken from the worker's RTP port range (or an ephemeral
port): calls share the range, each has its own port, and RTCP travels on that port too
(``sdp`` says so in the answer). It answers the SDP offers of the call, initial and
re-INVITE, and is the session's ``AudioPlayer`` through a
``hark.transports.playout.Playout`` at 8 kHz, so reply audio is paced, ordered, cleared and
reported exactly as over WebRTC; the one resampling step out is the playout's, the one in
is a soxr stream from 8 kHz to the session's input rate, rebuilt if that rate changes.

Pacing: the calls of a worker share the worker's one ``hark.transports.ticker.Pacer`` (a
session opened without one gets its own) rather than a timer each: one wake-up of the event
loop per frame for all calls, and on each tick every call's packets leave before any call's
input is passed on (``frames_sent``), so the last call's packets do not wait for the others'
voice activity detection. Frames are due on the playout's schedule (the n-th frame at
start + n × 20 ms, so the error never accumulates), and the frames of ticks the ticker
skipped are caught up; behind by more than ``MAX_LAG_SECONDS`` after a stalled loop, the
schedule restarts from now instead of bursting, and the RTP timestamp jumps over the gap.
For each frame due the session sends one RTP packet (the next playout frame, or, when
nothing plays, a silence packet encoded once per codec) and hands the caller's next frame
out of the jitter buffer to ``on_audio``.

Symmetric RTP with strict latching (Asterisk's ``strictrtp``): packets go only to where the
caller's RTP comes from (a phone behind NAT cannot know its public address), learned from
the caller's first packets, and nothing is sent before then, so an INVITE cannot aim our
RTP at a third party by naming it in its SDP. Only a ``trusted`` session (a trunk whose
SBC sends from where its SDP says) sends to the SDP's address until then. The first packet
with a negotiated payload type latches at once when it comes from the SDP's address or the
SIP peer's (``peer_ip``); from any other address, ``RELATCH_PACKETS`` packets in a row of
one SSRC with consecutive sequence numbers are needed. Once latched the latch moves only
for a packet that continues the caller's stream (its SSRC, a sequence number at most
``RELATCH_MAX_GAP`` ahead: a NAT binding that changed), or, once the caller has been
silent for ``RELATCH_SILENCE_S``, for a new source that passes the same test as a first
one. Anything else from another address is dropped: not heard, not a digit, not answered.
RTCP is taken only from the latched host. A session ``start``ed with ``rtp_timeout`` calls
``on_inactive`` when the caller has sent nothing for that long while the call is neither
held nor on hold (Asterisk's ``rtp_timeout``, FreeSWITCH's ``media_timeout``).

SRTP (SDES, ``sdes.py``): an offer on ``RTP/SAVP`` is taken only when ``negotiate`` is told
the signalling is secure (TLS); then every packet both ways is SRTP or SRTCP, a packet that
does not authenticate is dropped before anything else looks at it, and a re-offer may not
fall back to plain RTP.

Hold: an offer that stops listening (``sendonly``, ``inactive``, ``c=0.0.0.0``) stops the
packets and pauses the playout, so what the caller does not hear is not counted as played;
the caller's audio and DTMF are not passed on while held (music on hold is not speech).
Resuming restarts both, with the RTP timestamp moved on by the time held and the marker set.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pylibsrtp

from hark.audio.codecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from hark.observability.session_metrics import SessionMetrics
from hark.transports.echo import CallEcho
from hark.transports.phone_media import RATE, PhoneMedia
from hark.transports.playout import Playout, PlayoutListener
from hark.transports.rtp import ReceptionStats, RtpError, RtpSender, is_rtcp, parse_rtp, seq_diff
from hark.transports.sip import rtcp
from hark.transports.sip.dtmf import DtmfError, DtmfReceiver
from hark.transports.sip.jitter import JitterBuffer
from hark.transports.sip.sdes import Crypto, SrtpContext, our_crypto
from hark.transports.sip.sdp import (
    HOLD_ADDRESSES,
    Answerer,
    Negotiated,
    SdpError,
    negotiate,
    parse_offer,
)
from hark.transports.ticker import Pacer

logger = logging.getLogger(__name__)

FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000
FRAME_SECONDS = FRAME_MS / 1000
RELATCH_PACKETS = 3
RELATCH_MAX_GAP = 100
RELATCH_SILENCE_S = 5.0
# Frames whose lateness is kept for the percentiles: the last minute of a call.
_LATENESS_KEPT = 3000

__all__ = ["RtpSession", "RtpStats", "SdpError"]

_Encode = Callable[[npt.NDArray[np.int16]], bytes]
_Decode = Callable[[bytes], npt.NDArray[np.int16]]
_CODECS: dict[str, tuple[_Encode, _Decode]] = {
    "PCMU": (ulaw_encode, ulaw_decode),
    "PCMA": (alaw_encode, alaw_decode),
}


@functools.cache
def _silence_payload(codec: str) -> bytes:
    return _CODECS[codec][0](np.zeros(FRAME_SAMPLES, np.int16))


@dataclass(slots=True)
class RtpStats:
    """A call's media so far. Lateness is how long after its due time a frame went out."""

    packets_sent: int = 0
    bytes_sent: int = 0
    packets_received: int = 0
    bytes_received: int = 0
    lost: int = 0
    late: int = 0
    reordered: int = 0
    duplicates: int = 0
    concealed: int = 0
    jitter_ms: float = 0.0
    target_delay_ms: float = 0.0
    dtmf_events: int = 0
    ignored: int = 0
    late_frames: int = 0
    late_restarts: int = 0
    round_trip_ms: float | None = None
    send_lateness_ms: list[float] = field(default_factory=list)

    def send_lateness_percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of recent frames' lateness in ms (0 before any)."""
        if not self.send_lateness_ms:
            return 0.0
        return float(np.percentile(self.send_lateness_ms, q))


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.session: RtpSession | None = None

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.session is not None:
            self.session._receive(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable while the caller's port is not open yet: expected, harmless.
        logger.debug("rtp: %s", exc)


class RtpSession(PhoneMedia):
    """One call's RTP and RTCP; the session's ``AudioPlayer``. Made by ``open``."""

    def __init__(
        self,
        transport: asyncio.DatagramTransport,
        protocol: _Protocol,
        pacer: Pacer | None = None,
        *,
        trusted: bool = False,
        peer_ip: str | None = None,
    ) -> None:
        super().__init__()
        self._transport = transport
        self._trusted = trusted
        self._peer_ip = peer_ip
        self._pacer = pacer if pacer is not None else Pacer()
        protocol.session = self
        self._loop = asyncio.get_running_loop()
        self.local_port: int = transport.get_extra_info("sockname")[1]
        self._answerer = Answerer()
        self._agreed: Negotiated | None = None
        self._encode: _Encode = ulaw_encode
        self._decode: _Decode = ulaw_decode
        self._sender = RtpSender(payload_type=0)
        self._reception = ReceptionStats(clock_rate=RATE)
        self._jitter = JitterBuffer(clock_rate=RATE, frame_ms=FRAME_MS)
        self._dtmf = DtmfReceiver()
        # The reply audio, whose schedule the pacer follows.
        self.playout = Playout(RATE, frame_ms=FRAME_MS, clock=self._loop.time)
        self._sdp_remote: tuple[str, int] | None = None
        # Where packets go before the caller's arrive: the SDP's address, trusted only.
        self._fallback: tuple[str, int] | None = None
        self._fallback_rtcp: tuple[str, int] | None = None
        # Addresses whose first packet latches at once: the SDP's and the SIP peer's.
        self._expected: frozenset[str] = frozenset()
        self._latched: tuple[str, int] | None = None
        self._candidate: tuple[str, int] | None = None
        self._candidate_ssrc = 0
        self._candidate_seq = 0
        self._candidate_count = 0
        self._rtcp_latched: tuple[str, int] | None = None
        # SDES: the offerer's key, ours, and the SRTP they make (None: plain RTP).
        self._crypto: tuple[Crypto, Crypto] | None = None
        self._srtp: SrtpContext | None = None
        self._heard_at = self._loop.time()
        self._rtp_timeout = math.inf
        self._on_inactive: Callable[[], None] | None = None
        self._report_timer = rtcp.ReportTimer(self._loop.time())
        self._their_sr: tuple[int, float] | None = None
        self._sent_at_report = 0
        self._on_dtmf: Callable[[str], None] | None = None
        self._echo: CallEcho | None = None
        self._metrics = SessionMetrics.disabled()
        # The jitter buffer's late and dropped counts already handed to the metrics.
        self._counted_late = 0
        self._counted_dropped = 0
        self._running = False
        # Frames sent this tick whose input counterpart is still to be passed on.
        self._input_due = 0
        self._lateness: deque[float] = deque(maxlen=_LATENESS_KEPT)
        self._late_frames = 0
        # The playout's frames_skipped already added to the RTP timestamp.
        self._skipped = 0
        self._received = 0
        self._received_bytes = 0
        self._dtmf_events = 0
        self._ignored = 0
        self._round_trip: float | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        *,
        bind_host: str,
        ports: range | None = None,
        pacer: Pacer | None = None,
        trusted: bool = False,
        peer_ip: str | None = None,
    ) -> RtpSession:
        """A session on its own UDP socket: a free even port of ``ports`` (None: ephemeral),
        paced by ``pacer`` (the worker's, shared by its calls; None: one of its own).
        ``peer_ip`` is the SIP peer's address; ``trusted`` sends to the SDP's address before
        the caller's RTP arrives (see the module's docstring).

        ``OSError`` when every port of the range is taken.
        """
        loop = asyncio.get_running_loop()
        if ports is None:
            candidates = [0]
        else:
            candidates = [p for p in ports if p % 2 == 0] or list(ports)
            # Start somewhere random so that concurrent calls do not all try the same ports.
            first = random.randrange(len(candidates)) if candidates else 0
            candidates = candidates[first:] + candidates[:first]
        for port in candidates:
            try:
                transport, protocol = await loop.create_datagram_endpoint(
                    _Protocol, local_addr=(bind_host, port)
                )
            except OSError as exc:
                if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                    raise
                continue
            return cls(transport, protocol, pacer, trusted=trusted, peer_ip=peer_ip)
        raise OSError(f"no free RTP port in {ports}")

    # ------------------------------------------------------------------ negotiation

    def negotiate(self, offer_sdp: str, advertise_ip: str, *, secure: bool = False) -> str:
        """The SDP answer to an offer (initial or re-INVITE); ``SdpError`` when there is none.
        ``secure``: the offer came over encrypted signalling (TLS), where SRTP may be keyed."""
        offer = parse_offer(offer_sdp)
        agreed = negotiate(offer)
        theirs = agreed.crypto
        if theirs is not None and not secure:
            raise SdpError("SRTP keys (SDES) are taken only over SIP over TLS")
        if theirs is None and self._crypto is not None:
            raise SdpError("a call on SRTP cannot fall back to plain RTP")
        ours = None
        if theirs is not None:
            if self._crypto is not None and self._crypto[0] == theirs:
                ours = self._crypto[1]
            else:
                ours = our_crypto(theirs)
                self._crypto, self._srtp = (theirs, ours), SrtpContext(theirs, ours)
        answer = self._answerer.answer(
            offer, agreed, address=advertise_ip, port=self.local_port, crypto=ours
        )
        self._apply(agreed)
        return answer

    def _apply(self, agreed: Negotiated) -> None:
        previous, self._agreed = self._agreed, agreed
        if previous is None or previous.codec.name != agreed.codec.name:
            self._encode, self._decode = _CODECS[agreed.codec.name]
            self._jitter.reset()
        self._sender.payload_type = agreed.codec.payload_type
        if agreed.remote[0] not in HOLD_ADDRESSES and agreed.remote != self._sdp_remote:
            # Somewhere new: what we latched onto belonged to the old address. (A hold
            # address is nowhere; the latch stays for the resume.)
            self._sdp_remote = agreed.remote
            self._latched = None
            self._candidate = None
            self._rtcp_latched = None
            self._expected = frozenset(
                ip for ip in (agreed.remote[0], self._peer_ip) if ip is not None
            )
            if self._trusted:
                self._fallback, self._fallback_rtcp = agreed.remote, agreed.remote_rtcp
        # A new offer is a sign of life: the inactivity timeout starts again.
        self._heard_at = self._loop.time()
        if previous is not None and previous.sending and not agreed.sending:
            self._sender.pause()
        if previous is not None and previous.receiving and not agreed.receiving:
            self._jitter.reset()

    # ------------------------------------------------------------------ running

    def start(
        self,
        *,
        input_rate: Callable[[], int],
        on_audio: Callable[[npt.NDArray[np.int16]], None],
        on_dtmf: Callable[[str], None],
        listener: PlayoutListener,
        metrics: SessionMetrics | None = None,
        rtp_timeout: float | None = None,
        on_inactive: Callable[[], None] | None = None,
        echo_cancellation: bool = True,
    ) -> None:
        """Start the 20 ms ticks: caller audio to ``on_audio``, digits to ``on_dtmf``, RTP out.

        ``metrics`` (the session's) counts the caller's packets that came too late for their
        place in the jitter buffer, and audio it dropped (full, or skipped to catch up).
        ``on_inactive`` is called once when no RTP has come from the caller for
        ``rtp_timeout`` seconds of an active call (None: never). ``echo_cancellation``:
        the reply's echo is taken out of the caller's audio (``hark.transports.echo``), at
        8 kHz before it is resampled."""
        if self._agreed is None:
            raise RuntimeError("negotiate an offer before starting the media")
        if self._running or self._closed:
            return
        self._input_rate = input_rate
        self._on_audio = on_audio
        self._on_dtmf = on_dtmf
        if metrics is not None:
            self._metrics = metrics
        if rtp_timeout is not None and on_inactive is not None:
            self._rtp_timeout, self._on_inactive = rtp_timeout, on_inactive
        self._heard_at = self._loop.time()
        self.playout.attach(listener)
        if echo_cancellation:
            self._echo = CallEcho(RATE, self._pass_heard)
            self.playout.tap = self._echo.played
        self._running = True
        self._pacer.add(self)

    async def close(self) -> None:
        """Stop the ticks, say BYE in RTCP, drop queued audio and close the socket."""
        if self._closed:
            return
        self._closed = True
        if self._running:
            self._pacer.remove(self)
            self._running = False
        # The callback is the call's: held here it would tie the call to its media in a cycle.
        # So is the echo canceller, whose release is this session's own method.
        self._on_inactive = None
        self._echo = None
        if self._agreed is not None:
            try:
                self._send_report(bye=True)
            except OSError as exc:
                logger.debug("rtcp: BYE not sent: %s", exc)
        self.playout.stop()
        self._transport.close()

    @property
    def stats(self) -> RtpStats:
        """The call's media counters, as of now."""
        jitter = self._jitter.stats
        return RtpStats(
            packets_sent=self._sender.packets,
            bytes_sent=self._sender.octets,
            packets_received=self._received,
            bytes_received=self._received_bytes,
            lost=max(0, self._reception.lost),
            late=jitter.late,
            reordered=self._reception.reordered,
            duplicates=self._reception.duplicates + jitter.duplicates,
            concealed=jitter.concealed,
            jitter_ms=self._reception.jitter * 1000 / RATE,
            target_delay_ms=self._jitter.target_delay * 1000,
            dtmf_events=self._dtmf_events,
            ignored=self._ignored,
            late_frames=self._late_frames,
            late_restarts=self.playout.late_restarts,
            round_trip_ms=None if self._round_trip is None else self._round_trip * 1000,
            send_lateness_ms=[x * 1000 for x in self._lateness],
        )

    # ------------------------------------------------------------------ ticks

    def send_frame(self, due: float) -> None:
        """The frame due at ``due``: its packet, when the call is sending (the pacer's first
        pass)."""
        # uvloop's clock is the monotonic one read once per loop turn, in whole milliseconds:
        # the time this packet really leaves is read afresh, or a turn's last call would look
        # as punctual as its first.
        lateness = time.monotonic() - due
        skipped = self.playout.frames_skipped - self._skipped
        if skipped:
            # The frames a stall skipped are a gap on the sampling clock, not a slower one.
            self._skipped += skipped
            self._sender.advance(skipped * FRAME_SAMPLES)
            lateness += skipped * FRAME_SECONDS
        if lateness >= FRAME_SECONDS:
            self._late_frames += 1
        self._lateness.append(lateness)
        self._input_due += 1
        try:
            self._send_frame()
        except Exception:
            logger.exception("rtp: sending failed")

    def frames_sent(self) -> None:
        """Pass on the caller's audio, one frame for each frame sent, and send what else is
        due (the pacer's second pass)."""
        self._pass_input()
        now = self._loop.time()
        try:
            if self._report_timer.poll(now):
                self._send_report()
        except Exception:
            logger.exception("rtp: sending a report failed")
        if now - self._heard_at > self._rtp_timeout:
            self._inactive()

    def _inactive(self) -> None:
        agreed = self._agreed
        if agreed is None or not (agreed.sending and agreed.receiving):
            # Held, or holding: silence is expected; the timeout starts again on resume.
            self._heard_at = self._loop.time()
            return
        on_inactive, self._on_inactive = self._on_inactive, None
        self._rtp_timeout = math.inf
        if on_inactive is not None:
            logger.info(
                "rtp: nothing from the caller for %.0f s", self._loop.time() - self._heard_at
            )
            try:
                on_inactive()
            except Exception:
                logger.exception("rtp: on_inactive failed")

    def _pass_input(self) -> None:
        """Hand the caller's frames to ``on_audio``, one per frame sent."""
        now = self._loop.time()
        try:
            while self._input_due:
                self._input_due -= 1
                frame = self._jitter.get(now)
                if frame is None or self._on_audio is None or self._input_rate is None:
                    continue
                if self._echo is not None:
                    frame = self._echo.heard(frame, RATE)
                self._pass_heard(frame)
            self._count_losses()
        except Exception:
            logger.exception("rtp: passing the caller's audio on failed")

    def _count_losses(self) -> None:
        """Hand what the jitter buffer dropped since the last tick to the metrics."""
        stats = self._jitter.stats
        if stats.late != self._counted_late:
            self._metrics.audio_late(stats.late - self._counted_late)
            self._counted_late = stats.late
        dropped = stats.overflow + stats.dropped
        if dropped != self._counted_dropped:
            self._metrics.audio_dropped(dropped - self._counted_dropped)
            self._counted_dropped = dropped

    def _send_frame(self) -> None:
        agreed = self._agreed
        target = self._latched or self._fallback
        if agreed is not None and agreed.sending and target is not None:
            frame = self.playout.next_frame()
            if frame is self.playout.silence:
                payload = _silence_payload(agreed.codec.name)
            else:
                payload = self._encode(frame)
            packet = self._sender.packet(payload)
            if self._srtp is not None:
                packet = self._srtp.protect(packet)
            self._transport.sendto(packet, target)
        else:
            # Nobody hears it (held, or the caller's address not known yet): what is queued
            # waits, and only the sampling clock moves on.
            self.playout.pass_frame()
        self._sender.advance(FRAME_SAMPLES)

    def _send_report(self, *, bye: bool = False) -> None:
        agreed = self._agreed
        assert agreed is not None
        sender = self._sender
        blocks: tuple[rtcp.ReportBlock, ...] = ()
        reception = self._reception
        if reception.ssrc is not None:
            fraction, cumulative = reception.report_interval()
            last_sr, delay = 0, 0
            if self._their_sr is not None:
                last_sr = self._their_sr[0]
                delay = int((self._loop.time() - self._their_sr[1]) * 65536)
            blocks = (
                rtcp.ReportBlock(
                    ssrc=reception.ssrc,
                    fraction_lost=fraction,
                    cumulative_lost=cumulative,
                    highest_sequence=reception.extended_max,
                    jitter=int(reception.jitter),
                    last_sr=last_sr,
                    delay_since_last_sr=delay,
                ),
            )
        report: rtcp.SenderReport | rtcp.ReceiverReport
        if sender.packets > self._sent_at_report:
            report = rtcp.SenderReport(
                ssrc=sender.ssrc,
                ntp_timestamp=rtcp.ntp_time(time.time()),
                rtp_timestamp=sender.timestamp,
                packets=sender.packets,
                octets=sender.octets,
                blocks=blocks,
            )
        else:
            report = rtcp.ReceiverReport(ssrc=sender.ssrc, blocks=blocks)
        self._sent_at_report = sender.packets
        packets: list[rtcp.RtcpPacket] = [
            report,
            rtcp.SourceDescription(((sender.ssrc, f"hark@{self.local_port}"),)),
        ]
        if bye:
            packets.append(rtcp.Bye((sender.ssrc,)))
        latched = self._latched
        target: tuple[str, int] | None
        if agreed.rtcp_mux:
            target = latched or self._fallback
        elif self._rtcp_latched is not None:
            target = self._rtcp_latched
        elif latched is not None:
            # The offered RTCP port, on the host the caller's RTP comes from.
            target = (latched[0], agreed.remote_rtcp[1])
        else:
            target = self._fallback_rtcp
        if target is not None:
            data = rtcp.pack_compound(*packets)
            if self._srtp is not None:
                data = self._srtp.protect_rtcp(data)
            self._transport.sendto(data, target)

    # ------------------------------------------------------------------ receiving

    def _receive(self, data: bytes, addr: tuple[str, int]) -> None:
        agreed = self._agreed
        if agreed is None or self._closed:
            return
        srtp = self._srtp
        if srtp is not None:
            try:
                data = srtp.unprotect_rtcp(data) if is_rtcp(data) else srtp.unprotect(data)
            except pylibsrtp.Error:
                self._ignored += 1
                return
        if is_rtcp(data):
            self._receive_rtcp(data, addr)
            return
        try:
            payload_type, _, sequence, timestamp, ssrc, payload = parse_rtp(data)
        except RtpError:
            self._ignored += 1
            return
        events = agreed.telephone_event
        negotiated = payload_type == agreed.codec.payload_type or (
            events is not None and payload_type == events.payload_type
        )
        now = self._loop.time()
        if addr == self._latched:
            # Any packet of the caller's (comfort noise too) shows it is still there.
            self._heard_at = now
        elif not negotiated or not self._latch(addr, ssrc, sequence, now):
            self._ignored += 1
            return
        if not negotiated:
            self._ignored += 1
            return
        self._received += 1
        self._received_bytes += len(payload)
        if not self._running or not agreed.receiving:
            # Before start (early media) and on hold the caller's audio goes nowhere.
            return
        if self._reception.ssrc is not None and ssrc != self._reception.ssrc:
            self._jitter.reset()
            self._dtmf = DtmfReceiver()
        if not self._reception.update(ssrc, sequence, timestamp, now):
            return
        if events is not None and payload_type == events.payload_type:
            self._receive_dtmf(timestamp, payload)
            return
        self._jitter.put(timestamp, self._decode(payload), now)

    def _latch(self, addr: tuple[str, int], ssrc: int, sequence: int, now: float) -> bool:
        """Whether a packet (of a negotiated payload type) from ``addr``, not the latched
        address, is the caller's: it latches, or moves the latch, by the rules of the
        module's docstring."""
        latched, reception = self._latched, self._reception
        if latched is None:
            if addr[0] not in self._expected and not self._on_probation(addr, ssrc, sequence):
                return False
        elif not (
            ssrc == reception.ssrc and 0 < seq_diff(sequence, reception.max_seq) <= RELATCH_MAX_GAP
        ) and not (
            now - self._heard_at >= RELATCH_SILENCE_S and self._on_probation(addr, ssrc, sequence)
        ):
            return False
        if latched is not None:
            logger.info("rtp: caller moved from %s to %s", latched, addr)
        if latched is None or addr[0] != latched[0]:
            self._rtcp_latched = None
        self._latched, self._candidate, self._heard_at = addr, None, now
        return True

    def _on_probation(self, addr: tuple[str, int], ssrc: int, sequence: int) -> bool:
        """Count a packet of a would-be source: True once it has sent ``RELATCH_PACKETS`` in
        a row of one SSRC with consecutive sequence numbers."""
        if (
            addr == self._candidate
            and ssrc == self._candidate_ssrc
            and seq_diff(sequence, self._candidate_seq) == 1
        ):
            self._candidate_count += 1
        else:
            self._candidate, self._candidate_ssrc, self._candidate_count = addr, ssrc, 1
        self._candidate_seq = sequence
        return self._candidate_count >= RELATCH_PACKETS

    def _receive_dtmf(self, timestamp: int, payload: bytes) -> None:
        try:
            digit = self._dtmf.receive(timestamp, payload)
        except DtmfError:
            self._ignored += 1
            return
        if digit is not None and self._on_dtmf is not None:
            self._dtmf_events += 1
            self._on_dtmf(digit)

    def _receive_rtcp(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            packets = rtcp.parse_compound(data)
        except rtcp.RtcpError:
            self._ignored += 1
            return
        if self._latched is None or addr[0] != self._latched[0]:
            # Only the caller's host is heard (and answered) in RTCP.
            self._ignored += 1
            return
        # Reports go back where the caller's come from.
        self._rtcp_latched = addr
        now = self._loop.time()
        for packet in packets:
            if isinstance(packet, rtcp.SenderReport):
                self._their_sr = (rtcp.middle_ntp(packet.ntp_timestamp), now)
            if isinstance(packet, rtcp.SenderReport | rtcp.ReceiverReport):
                for block in packet.blocks:
                    if block.ssrc == self._sender.ssrc and block.last_sr:
                        arrived = rtcp.middle_ntp(rtcp.ntp_time(time.time()))
                        round_trip = (
                            arrived - block.last_sr - block.delay_since_last_sr
                        ) & 0xFFFFFFFF
                        self._round_trip = round_trip / 65536
            elif isinstance(packet, rtcp.Bye):
                logger.debug("rtcp: BYE from %s: %s", addr, packet.reason)

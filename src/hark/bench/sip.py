"""``hark bench sip``: how fast hark answers a phone, how many calls one core carries, and how
soon a caller hears the answer.

Each call is a lean SIP caller of the bench's own (asyncio, UDP, one SIP and one RTP socket
per call): an INVITE offering PCMU and telephone-event, the ACK, RTP every 20 ms (silence
unless it is asking a question), BYE. SIPp can place calls too, but it cannot time the RTP it
receives, which is what the capacity is about. Point it at a server with no webhook
configured, so that every call is answered at once.

**Setup** (``--calls N`` calls, one after another): on the caller's clock, from sending the
INVITE to receiving the 200 OK.

**Capacity** (``--capacity``): calls are added ``--step`` at a time. Every call says a short
question every ``--ask-every`` seconds, so the server runs the VAD on every call and plays
replies on most (with ``--engines fake`` the replies are the fake voice). After each step the
server's RTP is watched for ``--hold`` seconds: a packet's *jitter* is how much later it
arrived than the schedule its RTP timestamps set (the earliest packet of its stream in the
window defines on time), and a packet more than ``--late-ms`` behind is *late* (a phone with
that much jitter buffer would have played a gap). The ramp stops at the first step whose p99
jitter exceeds ``--threshold-ms`` or that has a late packet, in two windows in a row, or at
``--max-calls``; the figure is the last step within both. With ``--server-pid`` each step
also reports the server's CPU time per call-second. Pin the server to one core (``taskset -c
0 hark serve --engines fake``) and the bench to another (``taskset -c 1 hark bench sip``), or
the bench competes with what it measures.

**Turns** (``--turns N``, against the embedded models): one call asks N spoken questions and
waits for each answer. *V2V* is from sending the packet with the question's last voiced
sample to receiving the first audible packet of the answer. With ``--webhook-listen
HOST:PORT`` (and the server's ``--sip-webhook-url http://HOST:PORT/``) the bench accepts its
calls itself (the setup figure then includes the webhook's round trip) and reads the
sideband: *E2A on the phone* is from the server's end-of-turn decision
(``input_audio_buffer.speech_stopped`` arriving on the sideband) to the first audible
packet, which is the WebSocket E2A plus playout, RTP and the path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import re
import secrets
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
from aiohttp import web

from hark.audio.codecs.g711 import ulaw_decode, ulaw_encode
from hark.audio.resample import resample
from hark.bench import capacity
from hark.bench.command import Bench, Result, config_from
from hark.bench.report import BenchError, ServerUrl, api_key, percentile_or_nan, timing_figures
from hark.bench.spoken_questions import QUESTIONS, RATE, SpokenQuestion, spoken_questions
from hark.config.options import BenchOption, shared
from hark.transports.rtp import RtpError, RtpPacket, RtpSender, is_rtcp

logger = logging.getLogger(__name__)

CLOCK = 8000
FRAME = 160
FRAME_S = FRAME / CLOCK
PCMU = 0
TELEPHONE_EVENT = 101
# A frame is audio rather than silence above this RMS (int16).
AUDIBLE_RMS = 200.0
DEFAULT_THRESHOLD_MS = 10.0
DEFAULT_LATE_MS = 60.0
# RFC 3261's T1: the first retransmission interval of a request over UDP.
_T1_S = 0.5
_SILENCE = ulaw_encode(np.zeros(FRAME, np.int16))
# After a reply's last audible packet, this much quiet means it has ended.
_REPLY_OVER_S = 1.5
_THINK_S = 1.0


# ---------------------------------------------------------------------- one caller


@dataclass
class Received:
    """One packet of the server's RTP as the caller got it."""

    arrival: float
    sequence: int
    timestamp: int
    ssrc: int
    audible: bool
    payload: bytes = b""


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Any) -> None:
        self.on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.on_datagram(data, addr)


class SipCaller:
    """One phone: a SIP user agent client over UDP and its RTP stream, written from RFC 3261
    directly and sharing no code with hark's SIP stack, so that the SIP tests, which call
    with it too, check the stack rather than mirror it.

    ``invite`` places the call as the benches do (answered or ``BenchError``); ``call``
    returns whatever final response came (the tests' refusals, timeouts, an ACK held back).
    Requests the server sends in the dialog are answered at once, as a phone does (200; 202
    to a REFER), and kept for ``request``. ``say`` queues audio (8 kHz int16) for the
    microphone; ``tick`` sends the next 20 ms of it, or silence, as RTP. The server's packets
    land in ``received``. Used as an async context manager, the sockets open and close with
    the block.
    """

    def __init__(self, server: tuple[str, int], *, host: str = "127.0.0.1") -> None:
        self.server = server
        self.host = host
        self.call_id = f"{secrets.token_hex(8)}@hark-bench"
        self.tag = secrets.token_hex(4)
        self.received: list[Received] = []
        # Whether to decode what arrives to find audible packets (the turns need it; the
        # capacity ramp, which only times packets, saves the bench that work).
        self.listening = True
        self.first_audio_at: float | None = None
        self.audio_event = asyncio.Event()
        self.ended = asyncio.Event()
        self.sender = RtpSender(payload_type=PCMU)
        # The INVITE's provisional statuses, and the SDP of its 2xx.
        self.provisional: list[int] = []
        self.answer_sdp = ""
        # Requests the server sent that ``request`` has not taken yet (at most _KEPT).
        self.requests: list[SipMessage] = []
        self._request_came = asyncio.Event()
        self._sip: asyncio.DatagramTransport | None = None
        self._rtp: asyncio.DatagramTransport | None = None
        self._responses: asyncio.Queue[SipMessage] = asyncio.Queue(64)
        self._remote_tag = ""
        self._remote_target = ""
        self._routes: list[str] = []
        self._rtp_remote: tuple[str, int] | None = None
        self._cseq = 1
        self._acked = False
        self._speech: list[bytes] = []
        # Send time of the packet that holds the last voiced sample of what was said.
        self.last_voiced_sent_at: float | None = None
        self._last_voiced_frame: int | None = None
        # ``next_rtp``'s place in ``received``, and what it waits on while it has caught up.
        self._read = 0
        self._arrival: asyncio.Future[None] | None = None

    @property
    def sip_port(self) -> int:
        """The caller's SIP port."""
        assert self._sip is not None
        return int(self._sip.get_extra_info("sockname")[1])

    @property
    def rtp_port(self) -> int:
        """The caller's RTP port."""
        assert self._rtp is not None
        return int(self._rtp.get_extra_info("sockname")[1])

    @property
    def server_rtp(self) -> tuple[str, int] | None:
        """Where the 2xx's SDP says the server takes RTP (None before it)."""
        return self._rtp_remote

    async def open(self) -> None:
        """Bind the SIP and RTP sockets."""
        loop = asyncio.get_running_loop()
        self._sip, _ = await loop.create_datagram_endpoint(
            lambda: _Endpoint(self._on_sip), local_addr=(self.host, 0)
        )
        self._rtp, _ = await loop.create_datagram_endpoint(
            lambda: _Endpoint(self._on_rtp), local_addr=(self.host, 0)
        )

    async def __aenter__(self) -> SipCaller:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def invite(self, limit_s: float = 10.0) -> float:
        """Call; returns INVITE → 200 OK in seconds. ``BenchError`` on a refusal or timeout."""
        started = time.monotonic()
        response = await self.call(limit_s=limit_s)
        elapsed = time.monotonic() - started
        if response.status != 200:
            raise BenchError(f"INVITE answered {response.start}")
        return elapsed

    async def call(
        self, headers: Sequence[tuple[str, str]] = (), *, limit_s: float = 30.0, ack: bool = True
    ) -> SipMessage:
        """Send the INVITE (the offer, and ``headers``) and return its final
        response, acknowledged: a 2xx only if ``ack`` (``send_ack`` does it later)."""
        branch = _branch()
        offer = self._offer().encode()
        headers = (("Content-Type", "application/sdp"), *headers)
        message = self._request("INVITE", branch, cseq=1, body=offer, headers=headers)
        response = await self._transact(message, "INVITE", 1, limit_s)
        self._remote_tag = tag_of(response.header("to"))
        if response.status >= 300:
            # A refusal's ACK belongs to the INVITE's transaction: its branch, its URI.
            self._send(self._request("ACK", branch, cseq=1))
            return response
        contact = response.header("contact")
        self._remote_target = uri_of(contact) if contact else f"sip:hark@{self.server[0]}"
        routes = [r.strip() for value in response.all("record-route") for r in value.split(",")]
        self._routes = list(reversed(routes))
        self.answer_sdp = response.body.decode(errors="replace")
        self._rtp_remote = _sdp_address(self.answer_sdp)
        if ack:
            self.send_ack()
        return response

    def send_ack(self) -> None:
        """Acknowledge the 2xx (a request of its own: a new branch, to the remote target)."""
        self._acked = True
        self._send(self._request("ACK", _branch(), cseq=1, in_dialog=True))

    async def in_dialog(
        self,
        method: str,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
        limit_s: float = 30.0,
    ) -> SipMessage:
        """Send a request in the dialog (BYE, INFO, NOTIFY …); its final response."""
        self._cseq += 1
        message = self._request(
            method, _branch(), cseq=self._cseq, body=body, headers=headers, in_dialog=True
        )
        return await self._transact(message, method, self._cseq, limit_s)

    async def bye(self, limit_s: float = 5.0) -> None:
        """Hang up (unless the server already has)."""
        if self.ended.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await self.in_dialog("BYE", limit_s=limit_s)
        self.ended.set()

    async def notify_transfer(self, status_line: str) -> SipMessage:
        """Report a transfer's progress as a ``message/sipfrag`` NOTIFY (RFC 3515)."""
        final = int(status_line.split()[1]) >= 200
        state = "terminated;reason=noresource" if final else "active"
        return await self.in_dialog(
            "NOTIFY",
            status_line.encode() + b"\r\n",
            (
                ("Event", "refer"),
                ("Subscription-State", state),
                ("Content-Type", "message/sipfrag;version=2.0"),
            ),
        )

    async def request(self, method: str, timeout_s: float = 30.0) -> SipMessage:
        """The next request ``method`` the server sent (already answered)."""
        async with asyncio.timeout(timeout_s):
            while True:
                for message in self.requests:
                    if message.method == method:
                        self.requests.remove(message)
                        return message
                self._request_came.clear()
                await self._request_came.wait()

    def say(self, pcm: npt.NDArray[np.int16], last_voiced: int | None = None) -> None:
        """Queue ``pcm`` (8 kHz) for the microphone; ``last_voiced`` marks its last voiced
        sample, whose send time becomes ``last_voiced_sent_at``."""
        frames = [pcm[i : i + FRAME] for i in range(0, len(pcm), FRAME)]
        if frames and len(frames[-1]) < FRAME:
            frames[-1] = np.concatenate([frames[-1], np.zeros(FRAME - len(frames[-1]), np.int16)])
        self._last_voiced_frame = (
            None if last_voiced is None else len(self._speech) + last_voiced // FRAME
        )
        self.last_voiced_sent_at = None
        self._speech.extend(ulaw_encode(frame) for frame in frames)

    @property
    def saying(self) -> bool:
        """Audio is still queued for the microphone."""
        return bool(self._speech)

    def tick(self, now: float) -> None:
        """Send the next 20 ms of the microphone."""
        if self._rtp is None or self._rtp_remote is None or self.ended.is_set():
            return
        payload = self._speech.pop(0) if self._speech else _SILENCE
        if self._last_voiced_frame is not None:
            if self._last_voiced_frame == 0:
                self.last_voiced_sent_at = now
            self._last_voiced_frame -= 1
            if self._last_voiced_frame < 0:
                self._last_voiced_frame = None
        self._rtp.sendto(self.sender.packet(payload), self._rtp_remote)
        self.sender.advance(FRAME)

    def send_dtmf(self, digit: str) -> None:
        """Press a key: an RFC 4733 event of 80 ms at the microphone's timestamp, three
        updates and the end sent three times."""
        assert self._rtp is not None and self._rtp_remote is not None
        code = "0123456789*#ABCD".index(digit)
        # The event's first packet is marked, as the first after a pause is.
        self.sender.pause()
        for n in range(6):
            end = 0x80 if n >= 3 else 0
            payload = struct.pack("!BBH", code, end | 10, FRAME * min(n + 1, 4))
            packet = self.sender.packet(payload, payload_type=TELEPHONE_EVENT)
            self._rtp.sendto(packet, self._rtp_remote)
        self.sender.advance(FRAME * 4)

    async def next_rtp(self, timeout_s: float = 30.0) -> Received:
        """The next packet in ``received`` that this has not returned yet."""
        async with asyncio.timeout(timeout_s):
            while len(self.received) <= self._read:
                self._arrival = asyncio.get_running_loop().create_future()
                await self._arrival
        self._read += 1
        return self.received[self._read - 1]

    def close(self) -> None:
        """Close both sockets."""
        for transport in (self._sip, self._rtp):
            if transport is not None:
                transport.close()

    # ------------------------------------------------------------------ SIP

    def _offer(self) -> str:
        return (
            f"v=0\r\no=hark-bench {secrets.randbits(31)} 1 IN IP4 {self.host}\r\ns=-\r\n"
            f"c=IN IP4 {self.host}\r\nt=0 0\r\n"
            f"m=audio {self.rtp_port} RTP/AVP {PCMU} {TELEPHONE_EVENT}\r\n"
            f"a=rtpmap:{PCMU} PCMU/8000\r\na=rtpmap:{TELEPHONE_EVENT} telephone-event/8000\r\n"
            f"a=fmtp:{TELEPHONE_EVENT} 0-15\r\na=ptime:20\r\na=sendrecv\r\n"
        )

    def _request(
        self,
        method: str,
        branch: str,
        *,
        cseq: int,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
        in_dialog: bool = False,
    ) -> bytes:
        host, port = self.server
        uri = self._remote_target if in_dialog else f"sip:hark@{host}:{port}"
        to = f"<sip:hark@{host}:{port}>" + (f";tag={self._remote_tag}" if self._remote_tag else "")
        lines = [
            f"{method} {uri} SIP/2.0",
            f"Via: SIP/2.0/UDP {self.host}:{self.sip_port};branch={branch};rport",
            "Max-Forwards: 70",
            f"From: <sip:bench@{self.host}>;tag={self.tag}",
            f"To: {to}",
            f"Call-ID: {self.call_id}",
            f"CSeq: {cseq} {method}",
            f"Contact: <sip:bench@{self.host}:{self.sip_port}>",
        ]
        if in_dialog:
            lines += [f"Route: {route}" for route in self._routes]
        lines += [f"{name}: {value}" for name, value in headers]
        lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    async def _transact(self, message: bytes, method: str, cseq: int, limit_s: float) -> SipMessage:
        """Send a request, retransmitting as RFC 3261 does over UDP, until a final response."""
        interval = _T1_S
        async with asyncio.timeout(limit_s):
            self._send(message)
            provisional = False
            while True:
                try:
                    async with asyncio.timeout(interval):
                        response = await self._responses.get()
                except TimeoutError:
                    if not provisional:
                        self._send(message)
                    interval = min(interval * 2, 4.0)
                    continue
                if response.method != method or response.sequence != cseq:
                    continue
                if response.status < 200:
                    provisional = True
                    self.provisional.append(response.status)
                    continue
                return response

    def _send(self, message: bytes) -> None:
        assert self._sip is not None
        self._sip.sendto(message, self.server)

    def _on_sip(self, data: bytes, addr: tuple[str, int]) -> None:
        message = SipMessage.parse(data)
        if message.is_response:
            if message.method == "INVITE" and 200 <= message.status < 300 and self._acked:
                # Our ACK was lost: the 200 OK comes again, and so does the ACK.
                self.send_ack()
                return
            with contextlib.suppress(asyncio.QueueFull):
                self._responses.put_nowait(message)
            return
        if message.method == "ACK":
            return
        if message.method == "BYE":
            self.ended.set()
        status = "202 Accepted" if message.method == "REFER" else "200 OK"
        response = "\r\n".join(
            [f"SIP/2.0 {status}"]
            + [f"{_ECHOED[name]}: {value}" for name, value in message.headers if name in _ECHOED]
            + ["Content-Length: 0", "", ""]
        )
        assert self._sip is not None
        self._sip.sendto(response.encode(), addr)
        if len(self.requests) < _KEPT:
            self.requests.append(message)
            self._request_came.set()

    # ------------------------------------------------------------------ RTP

    def _on_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        if is_rtcp(data):
            return
        now = time.monotonic()
        try:
            packet = RtpPacket.parse(data)
        except RtpError:
            return
        if packet.payload_type != PCMU:
            return
        audible = False
        if self.listening:
            pcm = ulaw_decode(packet.payload)
            audible = bool(pcm.size) and _rms(pcm) > AUDIBLE_RMS
        if audible:
            if self.first_audio_at is None:
                self.first_audio_at = now
            self.audio_event.set()
        self.received.append(
            Received(now, packet.sequence, packet.timestamp, packet.ssrc, audible, packet.payload)
        )
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)


class Microphones:
    """One ticker for every caller: 20 ms of RTP each, on an absolute grid (no drift)."""

    def __init__(self) -> None:
        self.callers: list[SipCaller] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start ticking."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop ticking."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            now = time.monotonic()
            for caller in list(self.callers):
                caller.tick(now)
            next_at += FRAME_S
            delay = next_at - loop.time()
            if delay < -FRAME_S:
                # The bench fell behind by more than a frame: skip ahead rather than burst.
                next_at = loop.time()
                delay = 0.0
            await asyncio.sleep(max(0.0, delay))


# ---------------------------------------------------------------------- setup


@dataclass
class SetupResult:
    """One call's INVITE → 200 OK in milliseconds; None with an error when it failed."""

    answer_ms: float | None = None
    error: str | None = None


async def measure_setup(server: tuple[str, int], limit_s: float = 10.0) -> SetupResult:
    """Place one call, time its answer, hang up."""
    caller = SipCaller(server)
    result = SetupResult()
    try:
        await caller.open()
        result.answer_ms = await caller.invite(limit_s) * 1000
        await caller.bye()
    except (TimeoutError, BenchError, OSError) as exc:
        result.error = str(exc) or type(exc).__name__
    finally:
        caller.close()
    return result


# ---------------------------------------------------------------------- capacity


@dataclass
class CapacityStep:
    """The server's RTP to ``calls`` simultaneous calls over one hold window."""

    calls: int
    packets: int
    p50_jitter_ms: float
    p99_jitter_ms: float
    max_jitter_ms: float
    late_packets: int
    lost_packets: int
    setup_failures: int
    # The server's CPU use over the window, in cores (with --server-pid), else None.
    server_cores: float | None = None
    # The bench's own CPU use over the window, in cores: near 1, its timings are its own.
    bench_cores: float | None = None

    @property
    def server_cpu_ms_per_call_s(self) -> float | None:
        """The server's CPU time per call-second in milliseconds (with --server-pid)."""
        return capacity.ms_per_call_second(self.server_cores, self.calls)

    def within(self, threshold_ms: float) -> bool:
        """No late packet and p99 jitter within ``threshold_ms``."""
        return self.late_packets == 0 and self.p99_jitter_ms <= threshold_ms


def jitter_ms(packets: Sequence[Received]) -> list[float]:
    """Each packet's delay behind the on-time schedule its stream's RTP timestamps set."""
    by_stream: dict[int, list[Received]] = {}
    for packet in packets:
        by_stream.setdefault(packet.ssrc, []).append(packet)
    delays: list[float] = []
    for stream in by_stream.values():
        # Timestamps unwrapped against the first, so a wrap inside the window is harmless.
        first = stream[0].timestamp
        offsets = [
            p.arrival - (((p.timestamp - first + (1 << 31)) % (1 << 32)) - (1 << 31)) / CLOCK
            for p in stream
        ]
        best = min(offsets)
        delays += [(o - best) * 1000 for o in offsets]
    return delays


def lost(packets: Sequence[Received]) -> int:
    """Packets missing from each stream's sequence numbers within the window."""
    missing = 0
    by_stream: dict[int, set[int]] = {}
    for packet in packets:
        by_stream.setdefault(packet.ssrc, set()).add(packet.sequence)
    for sequences in by_stream.values():
        ordered = sorted(sequences)
        # A stream spanning the wrap looks like one huge gap; count the window's gaps instead.
        gaps = [(b - a - 1) for a, b in itertools.pairwise(ordered) if b - a < 1000]
        missing += sum(gaps)
    return missing


async def measure_capacity(
    config: SipBenchConfig, question: SpokenQuestion, *, progress: bool = True
) -> tuple[list[CapacityStep], int]:
    """Ramp up calls until the server's RTP runs late; returns the steps and calls carried."""
    speech = resample(question.pcm, RATE, CLOCK)
    microphones = Microphones()
    microphones.start()
    talkers: list[asyncio.Task[None]] = []

    async def add(count: int) -> int:
        batch = [SipCaller(config.server) for _ in range(count)]
        for caller in batch:
            caller.listening = False
        outcomes = await asyncio.gather(
            *(_connect(caller) for caller in batch), return_exceptions=True
        )
        failures = 0
        for index, (caller, outcome) in enumerate(zip(batch, outcomes, strict=True)):
            if isinstance(outcome, BaseException):
                failures += 1
                caller.close()
                continue
            microphones.callers.append(caller)
            # Staggered, so that the calls do not all speak at once.
            every_s = config.ask_every_s
            offset = every_s * index / max(1, len(batch))
            talkers.append(asyncio.create_task(_keep_asking(caller, speech, every_s, offset)))
        return failures

    try:
        return await capacity.ramp(
            step=config.step,
            max_calls=config.max_calls,
            settle_s=0.5,
            add=add,
            watch=lambda failures: _watch(microphones.callers, config, failures),
            within=lambda result: result.within(config.threshold_ms),
            show=_print_step if progress else None,
        )
    finally:
        for task in talkers:
            task.cancel()
        await asyncio.gather(*talkers, return_exceptions=True)
        await microphones.stop()
        await asyncio.gather(*(c.bye() for c in microphones.callers), return_exceptions=True)
        for caller in microphones.callers:
            caller.close()


async def _connect(caller: SipCaller) -> None:
    await caller.open()
    await caller.invite()


async def _keep_asking(
    caller: SipCaller, speech: npt.NDArray[np.int16], every_s: float, offset_s: float
) -> None:
    """Say the question every ``every_s`` seconds, like a conversation that never ends."""
    await asyncio.sleep(offset_s)
    while True:
        caller.say(speech)
        await asyncio.sleep(every_s)


async def _watch(callers: list[SipCaller], config: SipBenchConfig, failures: int) -> CapacityStep:
    """Watch the server's RTP to every call for ``--hold`` seconds."""
    for caller in callers:
        caller.received.clear()
    server, bench = capacity.CpuMeter(config.server_pid), capacity.CpuMeter(os.getpid())
    window_start = time.monotonic()
    await asyncio.sleep(config.hold_s)
    cores, bench_cores = server.cores(), bench.cores()
    delays: list[float] = []
    packets = missing = 0
    for caller in callers:
        window = [p for p in caller.received if p.arrival >= window_start]
        caller.received.clear()
        packets += len(window)
        delays += jitter_ms(window)
        missing += lost(window)
    return CapacityStep(
        calls=len(callers),
        packets=packets,
        p50_jitter_ms=percentile_or_nan(delays, 50),
        p99_jitter_ms=percentile_or_nan(delays, 99),
        max_jitter_ms=max(delays, default=math.nan),
        late_packets=sum(d > config.late_ms for d in delays),
        lost_packets=missing,
        setup_failures=failures,
        server_cores=cores,
        bench_cores=bench_cores,
    )


def _print_step(result: CapacityStep, again: bool) -> None:
    print(
        f"{result.calls:4d} calls{' (again)' if again else ''}: RTP jitter p50 "
        f"{result.p50_jitter_ms:6.1f} ms, p99 {result.p99_jitter_ms:6.1f} ms, max "
        f"{result.max_jitter_ms:6.1f} ms; {result.late_packets} late, {result.lost_packets} lost"
        + (
            f"; server CPU {result.server_cores:.2f} cores, "
            f"{result.server_cpu_ms_per_call_s:.1f} ms per call-second"
            if result.server_cores is not None and result.server_cpu_ms_per_call_s is not None
            else ""
        )
        + (f"; bench {result.bench_cores:.2f} cores" if result.bench_cores is not None else "")
        + (f"; {result.setup_failures} failed to set up" if result.setup_failures else ""),
        flush=True,
    )


# ---------------------------------------------------------------------- turns


@dataclass
class TurnResult:
    """One spoken question and when its answer was heard, in milliseconds."""

    question: str
    v2v_ms: float | None = None
    e2a_ms: float | None = None
    error: str | None = None


class WebhookAcceptor:
    """The customer's backend, reduced to what the turns need: it accepts every incoming call
    and attaches to its sideband, noting when each ``speech_stopped`` arrives."""

    def __init__(self, url: str, key: str, listen: tuple[str, int]) -> None:
        self.url = url
        self.key = key
        self.listen = listen
        self.speech_stopped: asyncio.Queue[float] = asyncio.Queue(64)
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Listen for webhooks."""
        self._http = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._incoming)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, *self.listen).start()

    async def stop(self) -> None:
        """Stop listening and leave the sidebands."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _incoming(self, request: web.Request) -> web.Response:
        event = json.loads(await request.read())
        if event.get("type") == "realtime.call.incoming":
            task = asyncio.create_task(self._accept(event["data"]["call_id"]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return web.Response(text="ok")

    async def _accept(self, call_id: str) -> None:
        try:
            await self._attend(call_id)
        except aiohttp.ClientError as exc:
            # A setup call hangs up at once: its sideband may be gone before it is joined.
            logger.debug("call %s: %s", call_id, exc)

    async def _attend(self, call_id: str) -> None:
        assert self._http is not None
        headers = {"Authorization": f"Bearer {self.key}"}
        base = ServerUrl.parse(self.url)
        path = f"/v1/realtime/calls/{call_id}/accept"
        body = {"type": "realtime", "model": "gpt-realtime"}
        async with self._http.post(base.http(path), json=body, headers=headers) as response:
            if response.status >= 300:
                logger.warning("accept %s: %s %s", call_id, response.status, await response.text())
                return
        url = base.ws(f"/v1/realtime?call_id={call_id}")
        async with self._http.ws_connect(url, headers=headers) as ws:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                if json.loads(message.data).get("type") == "input_audio_buffer.speech_stopped":
                    with contextlib.suppress(asyncio.QueueFull):
                        self.speech_stopped.put_nowait(time.monotonic())


async def measure_turns(
    server: tuple[str, int],
    questions: Sequence[SpokenQuestion],
    turns: int,
    *,
    acceptor: WebhookAcceptor | None = None,
    limit_s: float = 30.0,
    progress: bool = True,
) -> list[TurnResult]:
    """One call asks ``turns`` questions in turn; each answer is timed on the phone."""
    caller = SipCaller(server)
    microphones = Microphones()
    results: list[TurnResult] = []
    try:
        await caller.open()
        await caller.invite(limit_s)
        microphones.callers.append(caller)
        microphones.start()
        await asyncio.sleep(1.0)
        for turn in range(turns):
            question = questions[turn % len(questions)]
            result = TurnResult(question.text)
            results.append(result)
            try:
                await _ask(caller, question, result, acceptor, limit_s)
            except TimeoutError:
                result.error = "no answer"
            if progress:
                print(
                    f"turn {turn + 1}: "
                    + (result.error or f"V2V {result.v2v_ms:.0f} ms")
                    + (f", E2A {result.e2a_ms:.0f} ms" if result.e2a_ms is not None else "")
                    + f"  ({question.text})",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        await microphones.stop()
        with contextlib.suppress(Exception):
            await caller.bye()
        caller.close()
    return results


async def _ask(
    caller: SipCaller,
    question: SpokenQuestion,
    result: TurnResult,
    acceptor: WebhookAcceptor | None,
    limit_s: float,
) -> None:
    speech = resample(question.pcm, RATE, CLOCK)
    last_voiced = min(len(speech) - 1, question.last_voiced * CLOCK // RATE)
    if acceptor is not None:
        while not acceptor.speech_stopped.empty():
            acceptor.speech_stopped.get_nowait()
    caller.first_audio_at = None
    caller.audio_event.clear()
    # The turns time audible packets only; the record of packets restarts with each one.
    caller.received.clear()
    caller.say(speech, last_voiced)
    async with asyncio.timeout(limit_s):
        await caller.audio_event.wait()
    heard = caller.first_audio_at
    assert heard is not None
    if caller.last_voiced_sent_at is not None:
        result.v2v_ms = (heard - caller.last_voiced_sent_at) * 1000
    if acceptor is not None and not acceptor.speech_stopped.empty():
        stopped = acceptor.speech_stopped.get_nowait()
        result.e2a_ms = (heard - stopped) * 1000
    # Listen to the whole answer before thinking of the next question.
    async with asyncio.timeout(limit_s):
        while True:
            caller.audio_event.clear()
            try:
                async with asyncio.timeout(_REPLY_OVER_S):
                    await caller.audio_event.wait()
            except TimeoutError:
                break
    await asyncio.sleep(_THINK_S)


# ---------------------------------------------------------------------- report


@dataclass
class SipReport(capacity.CapacityReport[SetupResult, CapacityStep]):
    """Everything one run measured."""

    server: str
    threshold_ms: float = DEFAULT_THRESHOLD_MS
    late_ms: float = DEFAULT_LATE_MS
    turns: list[TurnResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        answers = [r.answer_ms for r in self.setup if r.answer_ms is not None]
        return {
            "server": self.server,
            "setup": {
                "calls": len(self.setup),
                "failures": sum(1 for r in self.setup if r.error is not None),
                "invite_to_200_ms": timing_figures(answers),
                "calls_detail": [asdict(r) for r in self.setup],
            },
            "capacity": {
                "threshold_ms": self.threshold_ms,
                "late_ms": self.late_ms,
                "calls_carried": self.capacity_calls,
                "steps": [
                    {**asdict(s), "server_cpu_ms_per_call_s": s.server_cpu_ms_per_call_s}
                    for s in self.capacity
                ],
            },
            "turns": {
                "count": len(self.turns),
                "failures": sum(1 for t in self.turns if t.error is not None),
                "v2v_ms": timing_figures([t.v2v_ms for t in self.turns if t.v2v_ms is not None]),
                "e2a_ms": timing_figures([t.e2a_ms for t in self.turns if t.e2a_ms is not None]),
                "detail": [asdict(t) for t in self.turns],
            },
        }


def format_summary(report: SipReport) -> str:
    """A human summary of the report."""
    lines = [f"hark bench sip against {report.server}"]
    if report.setup:
        failures = [r for r in report.setup if r.error is not None]
        answers = timing_figures([r.answer_ms for r in report.setup if r.answer_ms is not None])
        lines.append(
            f"setup: {len(report.setup)} calls, {len(failures)} failed; INVITE → 200 OK "
            f"p50 {answers['p50']:.1f} ms, p99 {answers['p99']:.1f} ms"
        )
        lines += [f"  failure: {failure.error}" for failure in failures[:3]]
    if report.capacity:
        last = report.knee()
        lines.append(
            f"capacity: {report.capacity_calls} simultaneous calls with p99 RTP jitter "
            f"≤ {report.threshold_ms:.0f} ms and no packet later than {report.late_ms:.0f} ms"
        )
        if last is not None:
            lines.append(
                f"  at {last.calls} calls: jitter p50 {last.p50_jitter_ms:.1f} ms, p99 "
                f"{last.p99_jitter_ms:.1f} ms, max {last.max_jitter_ms:.1f} ms, "
                f"{last.lost_packets} lost"
                + (
                    f", server CPU {last.server_cpu_ms_per_call_s:.1f} ms per call-second"
                    if last.server_cpu_ms_per_call_s is not None
                    else ""
                )
            )
    if report.turns:
        data = report.to_json()["turns"]
        lines.append(
            f"turns: {data['count']}, {data['failures']} unanswered; V2V p50 "
            f"{data['v2v_ms']['p50']:.0f} ms"
            + (
                f"; end of turn → first reply audio on the phone p50 "
                f"{data['e2a_ms']['p50']:.0f} ms, p90 {data['e2a_ms']['p90']:.0f} ms"
                if data["e2a_ms"]["count"]
                else "; E2A needs --webhook-listen"
            )
        )
    return "\n".join(lines)


async def run_sip_bench(config: SipBenchConfig) -> SipReport:
    """Time ``calls`` setups, then ramp the capacity and ask ``turns`` questions if asked."""
    server = config.server
    report = SipReport(
        server=f"sip:{server[0]}:{server[1]}",
        threshold_ms=config.threshold_ms,
        late_ms=config.late_ms,
    )
    acceptor = None
    if config.webhook_listen is not None:
        if config.url is None:
            raise BenchError("--webhook-listen needs --url (the server's HTTP root)")
        acceptor = WebhookAcceptor(config.url, config.key, config.webhook_listen)
        await acceptor.start()
    try:
        for _ in range(config.calls):
            report.setup.append(await measure_setup(server))
            if len(report.setup) == 3 and all(r.error for r in report.setup):
                raise BenchError(f"no answer from {report.server}: {report.setup[-1].error}")
        if config.capacity or config.turns:
            texts = QUESTIONS[: max(1, min(config.turns, len(QUESTIONS)))]
            questions = await spoken_questions(texts)
        if config.capacity:
            report.capacity, report.capacity_calls = await measure_capacity(config, questions[0])
        if config.turns:
            report.turns = await measure_turns(server, questions, config.turns, acceptor=acceptor)
    finally:
        if acceptor is not None:
            await acceptor.stop()
    return report


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _address_option(name: str, help: str, *, required: bool = False) -> BenchOption:
    """An option whose value is a ``HOST:PORT`` address."""
    return BenchOption(name, help, _address, metavar="HOST:PORT", required=required)


OPTIONS: tuple[BenchOption | str, ...] = (
    _address_option("sip", "the server's SIP address (UDP), e.g. 127.0.0.1:5060", required=True),
    *capacity.capacity_options(
        step=10, max_calls=300, threshold_ms=DEFAULT_THRESHOLD_MS, bound="p99 RTP jitter"
    ),
    BenchOption(
        "late_ms",
        "a packet this far behind its schedule is late, and ends the ramp (default 60)",
        float,
        DEFAULT_LATE_MS,
    ),
    BenchOption(
        "ask_every",
        "each capacity call says a question this often, in seconds (default 6)",
        float,
        6.0,
    ),
    BenchOption("turns", "spoken questions to time on one call (default 0)", int, 0),
    "api_key",
    shared(
        "url",
        required=False,
        help="the server's HTTP root, for --webhook-listen (e.g. http://127.0.0.1:8000)",
    ),
    _address_option(
        "webhook_listen",
        "accept the turns' call as the server's webhook receiver here, and time end of "
        "turn → first reply audio from its sideband",
    ),
    "json",
)


@dataclass(frozen=True)
class SipBenchConfig(capacity.CapacityConfig):
    """What ``hark bench sip`` measures: its options."""

    server: tuple[str, int]
    late_ms: float
    ask_every_s: float
    turns: int
    url: str | None
    key: str
    webhook_listen: tuple[str, int] | None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SipBenchConfig:
        """The config of the parsed options."""
        return config_from(
            cls,
            options,
            server=options["sip"],
            key=api_key(options["api_key"]),
        )


def run(config: SipBenchConfig) -> Result:
    """Time the setups, ramp and ask if asked; the run passes when no call or turn failed."""
    report = asyncio.run(run_sip_bench(config))
    failed = any(r.error is not None for r in report.setup) or any(
        t.error is not None for t in report.turns
    )
    return Result(report.to_json(), format_summary(report), not failed)


BENCH = Bench("sip", OPTIONS, SipBenchConfig.from_options, run)
configure_parser, command = BENCH.configure_parser, BENCH.command


# ---------------------------------------------------------------------- SIP text


def _branch() -> str:
    return "z9hG4bK" + secrets.token_hex(8)


# How many of the server's requests a caller keeps for ``request``.
_KEPT = 64
# The headers a response copies from its request, by their names in a SipMessage.
_ECHOED = {"via": "Via", "from": "From", "to": "To", "call-id": "Call-ID", "cseq": "CSeq"}
# Compact header names (RFC 3261 §7.3.3) and the full names they stand for.
_COMPACT = {
    "i": "call-id",
    "f": "from",
    "t": "to",
    "v": "via",
    "m": "contact",
    "l": "content-length",
    "c": "content-type",
    "r": "refer-to",
    "b": "referred-by",
}


@dataclass
class SipMessage:
    """A request or response as a caller reads it: the start line, the headers (names in
    lower case, compact forms spelled out) and the body."""

    start: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def is_response(self) -> bool:
        """Whether this is a response (``SIP/2.0 …``)."""
        return self.start.startswith("SIP/2.0 ")

    @property
    def status(self) -> int:
        """A response's status (0 when the start line has none)."""
        try:
            return int(self.start.split()[1])
        except (IndexError, ValueError):
            return 0

    @property
    def sequence(self) -> int:
        """The CSeq number (0 when there is none)."""
        number = self.header("cseq").split(" ", 1)[0]
        return int(number) if number.isdigit() else 0

    @property
    def method(self) -> str:
        """A request's method, or a response's CSeq method."""
        if self.is_response:
            cseq = self.header("cseq").split()
            return cseq[1] if len(cseq) > 1 else ""
        return self.start.split(" ", 1)[0]

    def header(self, name: str) -> str:
        """The first value of a header ("" when absent)."""
        values = self.all(name)
        return values[0] if values else ""

    def all(self, name: str) -> list[str]:
        """Every value of a header, in order."""
        return [value for key, value in self.headers if key == name.lower()]

    @classmethod
    def parse(cls, data: bytes) -> SipMessage:
        """Parse one datagram."""
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode(errors="replace").split("\r\n")
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            headers.append((_COMPACT.get(key, key), value.strip()))
        return cls(lines[0], headers, body)


def tag_of(value: str) -> str:
    """The ``tag`` parameter of a From or To value ("" when it has none)."""
    for part in value.split(";")[1:]:
        key, _, tag = part.partition("=")
        if key.strip().lower() == "tag":
            return tag.strip(" >")
    return ""


def uri_of(value: str) -> str:
    """The URI of a name-addr (``<sip:…>``) or of an addr-spec."""
    if "<" in value:
        return value.split("<", 1)[1].split(">", 1)[0]
    return value.split(";", 1)[0].strip()


def _sdp_address(sdp: str) -> tuple[str, int]:
    host = re.search(r"(?m)^c=IN IP4 (\S+)", sdp)
    port = re.search(r"(?m)^m=audio (\d+)", sdp)
    if host is None or port is None:
        raise BenchError("the 200 OK's SDP has no audio address")
    return host.group(1), int(port.group(1))


def _rms(pcm: npt.NDArray[np.int16]) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))

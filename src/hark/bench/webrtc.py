"""``hark bench webrtc``: how fast a WebRTC call is set up, and how many calls a core carries.

Each call is a real aiortc peer that calls the server as a browser does: a microphone
track, an ``oai-events`` data channel, an SDP offer posted to ``/v1/realtime/calls``.

**Setup** (``--calls N`` calls, one after another): on the client's clock, from the POST
to the SDP answer, to the data channel being open, to ``session.created``, and to the first
non-silent frame of reply audio after a ``response.create`` sent as soon as the channel
opened. The last includes the client's own jitter buffer (aiortc holds about four frames,
80 ms, before decoding). Run it against ``--engines fake`` to time the transport rather
than the models.

**Capacity** (``--capacity``): calls are added ``--step`` at a time. The callers are cheap, so
that the bench is not what runs late: each is a real peer connection (ICE, DTLS, SRTP, SCTP)
whose microphone sends Opus packets encoded once before the ramp, a spoken question every
few seconds and silence between, on the 20 ms grid; the server's packets are logged as they
arrive, before aiortc's jitter buffer, and never decoded (but for one call per window, to
see that replies were heard). The server runs the VAD on every call and answers each
question, so it plays audio on about half of them. The calls are spread over
``--client-processes`` processes; each reports its own event loop's lag and how late its
microphones' packets left, which must stay far below the server's lateness for the figure
to be the server's.

After each step the received audio is watched for ``--hold`` seconds: a frame's
*lateness* is how much later it arrived than the on-time schedule its RTP timestamp sets
(the earliest frame of the window defines on time). The ramp stops at the first step whose
p99 lateness exceeds ``--threshold-ms`` in two windows in a row; the figure is the last
step within it. With ``--server-pid`` each step also reports the server's CPU use, in
cores and in milliseconds per call-second. Pin the server to one core (``taskset -c 0 hark
serve --engines fake``) and the bench to others, or the bench competes with what it measures.
"""

from __future__ import annotations

import asyncio
import fractions
import itertools
import json
import logging
import math
import multiprocessing
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtpPacket
from av import AudioCodecContext, AudioFrame, CodecContext, Packet

from hark.audio.codecs.opus import OpusDecoder
from hark.audio.resample import resample
from hark.bench import capacity, webrtc_profile
from hark.bench.command import Bench, Result, config_from, positive
from hark.bench.report import BenchError, ServerUrl, api_key, percentile_or_nan, timing_figures
from hark.bench.spoken_questions import QUESTIONS, spoken_questions
from hark.bench.spoken_questions import RATE as QUESTION_RATE
from hark.cluster.forwarding import WORKER_HEADER
from hark.config.options import BenchOption, shared
from hark.transports.webrtc.call import OPUS_CODECS
from hark.transports.webrtc.playout import PlayoutTrack

logger = logging.getLogger(__name__)

CALLS_PATH = "/v1/realtime/calls"
# A frame is audio rather than silence above this RMS (int16); Opus leaves silence near 0.
AUDIBLE_RMS = 200.0
DEFAULT_THRESHOLD_MS = 20.0
OPUS_RATE = 48000
FRAME_S = 0.02
FRAME_SAMPLES = 960
_TIME_BASE = fractions.Fraction(1, OPUS_RATE)
# What capacity callers ask ("What is two plus two?", 1.4 s), and how often: the server's
# VAD ends the turn about 0.5 s after it and the fake reply plays for 2.4 s.
PROMPT_TEXT = QUESTIONS[4]
_TALK_EVERY_S = 5.0
# Successive calls start this many frames apart in their talk cycle (coprime with it).
_PHASE_STRIDE = 37
# A browser's Opus for speech.
_CALLER_BITRATE = 32000
# The event loop's punctuality is sampled with a timer of this period.
_TICK_S = 0.01
# A capacity call is set up (answer, data channel, first packet) within this or fails.
_CONNECT_LIMIT_S = 10.0
# The bench's own lateness is negligible when it is this many times below the server's, or
# below this many milliseconds (a scheduler's tick on a busy machine).
_CLIENT_MARGIN = 3.0
_CLIENT_NEGLIGIBLE_MS = 5.0
# Between a step's new calls and the window that watches them: their set-up (ICE, DTLS,
# SCTP, the session) is over by then and not counted as the server's cost of a call.
_SETTLE_S = 2.0


def frame_to_mono(frame: AudioFrame) -> npt.NDArray[np.int16]:
    """The frame's samples as mono int16, channels averaged."""
    channels = len(frame.layout.channels)
    if frame.format.name == "s16":
        # The common case (aiortc's decoder), read straight from the plane: a tenth of the
        # cost of to_ndarray on every 20 ms frame of every call.
        packed = np.frombuffer(memoryview(frame.planes[0]), np.int16, frame.samples * channels)
        if channels == 1:
            return packed.copy()
        if channels == 2:
            return ((packed[0::2].astype(np.int32) + packed[1::2]) >> 1).astype(np.int16)
    samples = frame.to_ndarray()
    if frame.format.is_planar:
        planes = samples.reshape(channels, -1)
    else:
        planes = samples.reshape(-1, channels).T
    if planes.dtype.kind == "f":
        mono = planes.mean(axis=0) * 32768.0
        return np.clip(np.rint(mono), -32768, 32767).astype(np.int16)
    return (planes.astype(np.int32).sum(axis=0) // channels).astype(np.int16)


@dataclass
class ReceivedFrame:
    """One frame of the server's audio as the client got it."""

    arrival: float
    pts: int
    rms: float
    pcm: npt.NDArray[np.int16] | None = None


@dataclass(frozen=True)
class Answer:
    """The server's answer to an offer, with when the POST left and how long it took."""

    sdp: str
    location: str
    # The worker that answered (hark's X-Hark-Worker header).
    worker: str | None
    posted_at: float
    elapsed: float


async def post_offer(
    http: aiohttp.ClientSession,
    url: str,
    api_key: str,
    offer: str,
    *,
    path: str = CALLS_PATH,
    model: str | None = None,
    session: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """POST ``offer`` as a browser does; ``BenchError`` unless the server answers 201.

    With ``session`` the offer goes as ``multipart/form-data`` (``sdp`` and ``session``),
    otherwise as a raw ``application/sdp`` body; ``headers`` go with it.
    """
    params = {"model": model} if model else None
    headers = {**(headers or {}), "Authorization": f"Bearer {api_key}"}
    body: aiohttp.FormData | str
    if session is None:
        body = offer
        headers["Content-Type"] = "application/sdp"
    else:
        body = aiohttp.FormData()
        body.add_field("sdp", offer)
        body.add_field("session", json.dumps(session), content_type="application/json")
    posted_at = time.monotonic()
    async with http.post(url + path, data=body, headers=headers, params=params) as response:
        text = await response.text()
        if response.status != 201:
            raise BenchError(f"POST {path}: {response.status} {text[:300]}")
        location = response.headers.get("Location", "")
        worker = response.headers.get(WORKER_HEADER)
    return Answer(text, location, worker, posted_at, time.monotonic() - posted_at)


class CallClient:
    """A WebRTC client of hark's ``/v1/realtime/calls``: what a browser does, with aiortc.

    ``microphone`` is what it sends (a ``PlayoutTrack``: silence until told to ``play``);
    every server event lands in ``events`` as a dict with its arrival time under
    ``"_received"``; the server's audio lands in ``frames`` (with samples when
    ``keep_audio``).
    """

    def __init__(self, *, keep_audio: bool = False) -> None:
        self.keep_audio = keep_audio
        # The worker that answered the offer (hark's X-Hark-Worker header), once connected.
        self.worker: str | None = None
        self.microphone = PlayoutTrack()
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTrack(self.microphone)
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.frames: list[ReceivedFrame] = []
        self.call_id: str | None = None
        self.answer: str | None = None
        self.posted_at: float | None = None
        self.opened = asyncio.Event()
        self.receiving = asyncio.Event()
        self.first_audio = asyncio.Event()
        self.first_audio_at: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.channel.on("open", self.opened.set)
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)

    async def connect(
        self,
        http: aiohttp.ClientSession,
        url: str,
        *,
        api_key: str,
        path: str = CALLS_PATH,
        model: str | None = None,
        session: dict[str, Any] | None = None,
    ) -> float:
        """Offer, POST, apply the answer; returns the POST round trip in seconds.

        With ``session`` the offer goes as ``multipart/form-data`` (``sdp`` and
        ``session``), otherwise as a raw ``application/sdp`` body. Raises ``BenchError``
        when the server does not answer 201.
        """
        answer = await post_offer(
            http,
            url,
            api_key,
            await self.offer(),
            path=path,
            model=model,
            session=session,
        )
        self.posted_at = answer.posted_at
        self.worker = answer.worker
        self.call_id = answer.location.rsplit("/", 1)[-1]
        self.answer = answer.sdp
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.sdp, type="answer"))
        return answer.elapsed

    async def offer(self) -> str:
        """The client's offer (its local description, set now), as a browser makes it."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    def send(self, event: dict[str, Any]) -> None:
        """Send a client event on the data channel."""
        self.channel.send(json.dumps(event))

    async def next_event(self, kind: str, limit_s: float = 30.0) -> dict[str, Any]:
        """Wait for the next event of type ``kind``, skipping others."""
        async with asyncio.timeout(limit_s):
            while True:
                event = await self.events.get()
                if event["type"] == kind:
                    return event

    def audio(self, since: float = 0.0) -> npt.NDArray[np.int16]:
        """The server's audio received after ``since`` (needs ``keep_audio``), at 48 kHz."""
        chunks = [f.pcm for f in self.frames if f.arrival >= since and f.pcm is not None]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)

    async def close(self) -> None:
        """Hang up from the client side (DTLS close) and stop the tasks."""
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.pc.remove_all_listeners()
        self.channel.remove_all_listeners()

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        event["_received"] = time.monotonic()
        self.events.put_nowait(event)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.create_task(self._record(track)))

    async def _record(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, AudioFrame):
                continue
            now = time.monotonic()
            self.receiving.set()
            pcm = frame_to_mono(frame)
            self._heard(pcm, int(frame.pts or 0))
            rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0
            if rms > AUDIBLE_RMS and self.first_audio_at is None:
                self.first_audio_at = now
                self.first_audio.set()
            self.frames.append(
                ReceivedFrame(now, int(frame.pts or 0), rms, pcm if self.keep_audio else None)
            )

    def _heard(self, pcm: npt.NDArray[np.int16], pts: int) -> None:
        """A frame of the server's audio as it came (48 kHz mono), at ``pts`` on the track's
        clock: for a client whose microphone hears its loudspeaker."""


# ---------------------------------------------------------------------- setup


@dataclass
class SetupResult:
    """One call's setup, in milliseconds from the POST; None where it never happened."""

    answer_ms: float | None = None
    channel_open_ms: float | None = None
    session_created_ms: float | None = None
    first_audio_ms: float | None = None
    error: str | None = None


async def measure_setup(
    http: aiohttp.ClientSession, url: str, api_key: str, *, limit_s: float = 30.0
) -> SetupResult:
    """Set up one call, ask for a reply, time each step, hang up."""
    result = SetupResult()
    client = CallClient()
    try:
        async with asyncio.timeout(limit_s):
            result.answer_ms = await client.connect(http, url, api_key=api_key) * 1000
            # The offer is the client's own work: the clock starts at the POST.
            assert client.posted_at is not None
            started = client.posted_at
            await client.opened.wait()
            result.channel_open_ms = (time.monotonic() - started) * 1000
            client.send({"type": "response.create"})
            created = await client.next_event("session.created")
            result.session_created_ms = (created["_received"] - started) * 1000
            await client.first_audio.wait()
            assert client.first_audio_at is not None
            result.first_audio_ms = (client.first_audio_at - started) * 1000
    except (TimeoutError, BenchError, aiohttp.ClientError) as exc:
        result.error = str(exc) or type(exc).__name__
    finally:
        await client.close()
    return result


# ---------------------------------------------------------------------- the cheap caller


@dataclass(frozen=True)
class CallerAudio:
    """What a capacity caller sends: a spoken prompt and silence as 20 ms Opus packets."""

    prompt: tuple[bytes, ...]
    silence: bytes


def opus_packets(pcm: npt.NDArray[np.int16]) -> list[bytes]:
    """``pcm`` (48 kHz mono) as 20 ms Opus packets, the last frame padded with silence."""
    encoder = _caller_encoder()
    padded = np.zeros(-(-len(pcm) // FRAME_SAMPLES) * FRAME_SAMPLES, np.int16)
    padded[: len(pcm)] = pcm
    packets: list[bytes] = []
    for index in range(len(padded) // FRAME_SAMPLES):
        frame = _audio_frame(padded[index * FRAME_SAMPLES : (index + 1) * FRAME_SAMPLES])
        frame.pts = index * FRAME_SAMPLES
        packets += [bytes(p) for p in encoder.encode(frame)]
    packets += [bytes(p) for p in encoder.encode(None)]
    return packets


def opus_silence() -> bytes:
    """One 20 ms Opus packet of silence, as an encoder makes it once its look-ahead is quiet."""
    return opus_packets(np.zeros(4 * FRAME_SAMPLES, np.int16))[-2]


async def caller_audio(text: str = PROMPT_TEXT) -> CallerAudio:
    """``text`` spoken (Piper, cached as the other benches' questions are), encoded once."""
    (question,) = await spoken_questions([text])
    voiced = question.pcm[: question.last_voiced + 1]
    return CallerAudio(
        tuple(opus_packets(resample(voiced, QUESTION_RATE, OPUS_RATE))), opus_silence()
    )


def _caller_encoder() -> AudioCodecContext:
    encoder = CodecContext.create("libopus", "w")
    encoder.bit_rate = _CALLER_BITRATE
    encoder.format = "s16"
    encoder.layout = "mono"
    encoder.sample_rate = OPUS_RATE
    encoder.time_base = _TIME_BASE
    encoder.options = {"application": "voip"}
    return encoder


def _audio_frame(samples: npt.NDArray[np.int16]) -> AudioFrame:
    frame = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = OPUS_RATE
    frame.time_base = _TIME_BASE
    return frame


class PacketMicrophone(MediaStreamTrack):
    """A microphone that sends packets encoded beforehand on the 20 ms grid.

    Frame ``n`` is due ``n × 20 ms`` after the first; it is the prompt's packet while the
    call is within the first part of its ``period`` frames (shifted by ``phase``), the
    silence packet otherwise. How late each packet left goes to ``lateness`` (seconds).
    """

    kind = "audio"

    def __init__(
        self, audio: CallerAudio, *, period: int, phase: int, lateness: deque[float]
    ) -> None:
        super().__init__()
        self.audio = audio
        self.period = max(period, len(audio.prompt) + 1)
        self.phase = phase
        self.lateness = lateness
        self._start: float | None = None
        self._sent = 0

    async def recv(self) -> Packet:
        """The next packet, released at its time."""
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._sent * FRAME_S
        if due > now:
            await asyncio.sleep(due - now)
            now = time.monotonic()
        self.lateness.append(now - due)
        position = (self._sent + self.phase) % self.period
        prompt = self.audio.prompt
        packet = Packet(prompt[position] if position < len(prompt) else self.audio.silence)
        packet.pts = self._sent * FRAME_SAMPLES
        packet.time_base = _TIME_BASE
        self._sent += 1
        return packet


@dataclass(frozen=True)
class Arrival:
    """One RTP packet of the server's audio: when it arrived, its timestamp, its payload."""

    at: float
    timestamp: int
    payload: bytes


class CheapCall:
    """A capacity caller: a real peer connection (ICE, DTLS, SRTP, SCTP) that encodes and
    decodes nothing.

    Its microphone is a ``PacketMicrophone``; the server's RTP packets are taken from the
    receiver before aiortc's jitter buffer and decoder and logged in ``arrivals`` (the
    last ``keep`` of them).
    """

    def __init__(
        self, audio: CallerAudio, *, period: int, phase: int, keep: int, lateness: deque[float]
    ) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.microphone = PacketMicrophone(audio, period=period, phase=phase, lateness=lateness)
        transceiver = self.pc.addTransceiver(self.microphone, direction="sendrecv")
        # The packets are Opus already: any other codec would carry them mislabelled.
        transceiver.setCodecPreferences(OPUS_CODECS)
        # aiortc would queue every packet for a jitter buffer and a decoder thread; the
        # bench needs only when each packet came.
        transceiver.receiver._handle_rtp_packet = self._on_rtp  # type: ignore[method-assign]
        self.channel = self.pc.createDataChannel("oai-events")
        self.arrivals: deque[Arrival] = deque(maxlen=keep)
        self.opened = asyncio.Event()
        self.receiving = asyncio.Event()
        self.channel.on("open", self.opened.set)

    async def connect(self, http: aiohttp.ClientSession, url: str, api_key: str) -> None:
        """Offer, POST, apply the answer; ``BenchError`` when the server does not answer."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        answer = await post_offer(http, url, api_key, self.pc.localDescription.sdp)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.sdp, type="answer"))

    async def close(self) -> None:
        """Hang up (DTLS close)."""
        await self.pc.close()
        self.pc.remove_all_listeners()
        self.channel.remove_all_listeners()

    async def _on_rtp(self, packet: RtpPacket, arrival_time_ms: int) -> None:
        self.arrivals.append(Arrival(time.monotonic(), packet.timestamp, packet.payload))
        self.receiving.set()


def lateness_ms(arrivals: Sequence[Arrival]) -> list[float]:
    """Each packet's delay behind the on-time schedule its RTP timestamps define.

    The packet that arrived earliest relative to its timestamp is on time; timestamps are
    unwrapped across 2³² from the first packet's.
    """
    if not arrivals:
        return []
    first = arrivals[0].timestamp
    offsets = [a.at - ((a.timestamp - first + 2**31) % 2**32 - 2**31) / OPUS_RATE for a in arrivals]
    best = min(offsets)
    return [(o - best) * 1000 for o in offsets]


def audible_share(payloads: Sequence[bytes]) -> float:
    """The share of 20 ms Opus ``payloads`` that decode to audio rather than silence."""
    if not payloads:
        return math.nan
    decoder = OpusDecoder(OPUS_RATE)
    audible = 0
    for payload in payloads:
        pcm = decoder.decode(payload).astype(np.float64)
        audible += bool(len(pcm)) and float(np.sqrt(np.mean(pcm**2))) > AUDIBLE_RMS
    return audible / len(payloads)


@dataclass
class ClientFigures:
    """How punctual one client process was over a window: the bench's own lateness."""

    calls: int
    # How late a 10 ms timer of the process's event loop fired, p99.
    loop_lag_p99_ms: float
    # How late the microphones' packets left behind their 20 ms grid, p99 and max.
    send_lateness_p99_ms: float
    send_lateness_max_ms: float
    # The process's CPU use over the window, in cores.
    cpu: float


@dataclass
class GroupWindow:
    """What the calls of one client process received over one window."""

    lateness_ms: list[float]
    gaps_ms: list[float]
    frames: int
    # The share of one call's frames that decoded to audio (NaN when nothing arrived).
    audible_share: float
    client: ClientFigures


def window_of(
    calls: Sequence[Sequence[Arrival]], client: ClientFigures, sample: int
) -> GroupWindow:
    """The figures of one window from the packets each call received in it; the audio of
    call ``sample`` (modulo the calls) is decoded to see that replies were heard."""
    lateness: list[float] = []
    gaps: list[float] = []
    for arrivals in calls:
        lateness += lateness_ms(arrivals)
        gaps += [(b.at - a.at) * 1000 for a, b in itertools.pairwise(arrivals)]
    sampled = calls[sample % len(calls)] if calls else []
    return GroupWindow(
        lateness_ms=lateness,
        gaps_ms=gaps,
        frames=sum(len(arrivals) for arrivals in calls),
        audible_share=audible_share([a.payload for a in sampled]),
        client=client,
    )


class CallerGroup:
    """The capacity calls of one process, on its event loop, with that loop's punctuality."""

    def __init__(self, url: str, api_key: str, audio: CallerAudio, *, keep: int) -> None:
        self.url = url
        self.api_key = api_key
        self.audio = audio
        self.keep = keep
        self.calls: list[CheapCall] = []
        self._http: aiohttp.ClientSession | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._loop_lag: deque[float] = deque(maxlen=keep)
        self._send_lateness: deque[float] = deque(maxlen=keep * 4)
        self._window_start = 0.0
        self._cpu_start = 0.0
        self._windows = 0

    async def start(self) -> None:
        """Open the HTTP session and start timing the loop."""
        self._http = aiohttp.ClientSession()
        self._ticker = asyncio.create_task(self._tick())

    async def add(self, count: int, first: int) -> int:
        """Set up ``count`` more calls (numbered from ``first``); returns how many failed."""
        assert self._http is not None
        period = round(_TALK_EVERY_S / FRAME_S)
        batch = [
            CheapCall(
                self.audio,
                period=period,
                # Spread the prompts over the period, so that calls do not all talk at once.
                phase=(first + index) * _PHASE_STRIDE % period,
                keep=self.keep,
                lateness=self._send_lateness,
            )
            for index in range(count)
        ]
        outcomes = await asyncio.gather(
            *(self._connect(call) for call in batch), return_exceptions=True
        )
        failures = 0
        for call, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failures += 1
                await call.close()
            else:
                self.calls.append(call)
        return failures

    def open_window(self) -> None:
        """Forget what arrived so far: a window starts now."""
        for call in self.calls:
            call.arrivals.clear()
        self._loop_lag.clear()
        self._send_lateness.clear()
        self._window_start = time.monotonic()
        self._cpu_start = time.process_time()

    def close_window(self) -> GroupWindow:
        """The figures of the window opened last."""
        elapsed = time.monotonic() - self._window_start
        lag = [s * 1000 for s in self._loop_lag]
        late = [s * 1000 for s in self._send_lateness]
        client = ClientFigures(
            calls=len(self.calls),
            loop_lag_p99_ms=percentile_or_nan(lag, 99),
            send_lateness_p99_ms=percentile_or_nan(late, 99),
            send_lateness_max_ms=max(late, default=math.nan),
            cpu=(time.process_time() - self._cpu_start) / elapsed if elapsed > 0 else math.nan,
        )
        window = window_of([list(c.arrivals) for c in self.calls], client, self._windows)
        self._windows += 1
        return window

    async def close(self) -> None:
        """Hang up every call and stop."""
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        await asyncio.gather(*(call.close() for call in self.calls), return_exceptions=True)
        self.calls.clear()
        if self._http is not None:
            await self._http.close()

    async def _connect(self, call: CheapCall) -> None:
        assert self._http is not None
        await call.connect(self._http, self.url, self.api_key)
        # Connected means the server's audio is flowing.
        async with asyncio.timeout(_CONNECT_LIMIT_S):
            await call.opened.wait()
            await call.receiving.wait()

    async def _tick(self) -> None:
        while True:
            due = time.monotonic() + _TICK_S
            await asyncio.sleep(_TICK_S)
            self._loop_lag.append(max(0.0, time.monotonic() - due))


# ---------------------------------------------------------------------- client processes


def _caller_process(
    connection: Connection, url: str, api_key: str, audio: CallerAudio, keep: int
) -> None:
    """A client process: serves ``CallerGroup`` commands from ``connection`` until "stop"."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # aiortc leaves tasks failing noisily when many client peers close at once.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    asyncio.run(_serve_group(connection, CallerGroup(url, api_key, audio, keep=keep)))


async def _serve_group(connection: Connection, group: CallerGroup) -> None:
    await group.start()
    try:
        while True:
            command, argument = await asyncio.to_thread(connection.recv)
            if command == "add":
                connection.send(await group.add(*argument))
            elif command == "open":
                group.open_window()
                connection.send(None)
            elif command == "close":
                connection.send(group.close_window())
            else:
                break
    finally:
        await group.close()
        connection.send(None)


class CallerProcesses:
    """``count`` client processes, each a ``CallerGroup``, driven from this event loop."""

    def __init__(
        self, count: int, url: str, api_key: str, audio: CallerAudio, *, keep: int
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._connections: list[Connection] = []
        self._processes: list[BaseProcess] = []
        self._calls = [0] * count
        self._next = 0
        # One thread per process waits for its answers, so that all of them wait at once.
        self._executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix="bench-client")
        for index in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_caller_process,
                args=(theirs, url, api_key, audio, keep),
                name=f"hark-bench-client-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._connections.append(ours)
            self._processes.append(process)

    async def add(self, count: int) -> int:
        """Set up ``count`` calls on the processes that have fewest; returns the failures."""
        shares = [0] * len(self._processes)
        for _ in range(count):
            index = min(range(len(shares)), key=lambda i: self._calls[i] + shares[i])
            shares[index] += 1
        asking = [index for index, share in enumerate(shares) if share]
        asks = []
        for index in asking:
            asks.append(self._ask(index, "add", (shares[index], self._next)))
            self._next += shares[index]
        failed = await asyncio.gather(*asks)
        for index, failures in zip(asking, failed, strict=True):
            self._calls[index] += shares[index] - failures
        return sum(failed)

    async def watch(self, hold_s: float) -> list[GroupWindow]:
        """Every process's figures over the next ``hold_s`` seconds."""
        everyone = range(len(self._processes))
        await asyncio.gather(*(self._ask(i, "open") for i in everyone))
        await asyncio.sleep(hold_s)
        return list(await asyncio.gather(*(self._ask(i, "close") for i in everyone)))

    async def close(self) -> None:
        """Hang up every call and end the processes."""
        asks = [self._ask(i, "stop") for i, p in enumerate(self._processes) if p.is_alive()]
        await asyncio.gather(*asks, return_exceptions=True)
        for process in self._processes:
            await asyncio.to_thread(process.join, _CONNECT_LIMIT_S)
            if process.is_alive():
                process.kill()
        for connection in self._connections:
            connection.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _ask(self, index: int, command: str, argument: Any = None) -> Any:
        connection = self._connections[index]

        def exchange() -> Any:
            connection.send((command, argument))
            return connection.recv()

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, exchange)
        except (EOFError, OSError) as exc:
            raise BenchError(f"bench client process {index} ended: {exc!r}") from None


# ---------------------------------------------------------------------- capacity


@dataclass
class CapacityStep:
    """The audio timing of ``calls`` simultaneous calls over one hold window."""

    calls: int
    frames: int
    p50_lateness_ms: float
    p99_lateness_ms: float
    max_lateness_ms: float
    interarrival_p99_ms: float
    setup_failures: int
    # The share of frames that carried audio in the decoded sample of calls.
    audible_share: float = math.nan
    # The server's CPU use over the window, in cores (with --server-pid), else None.
    server_cpu: float | None = None
    # Each client process's own punctuality over the window.
    clients: list[ClientFigures] = field(default_factory=list)
    # With --profile: the server's CPU in ms per call-second by part (see webrtc_profile):
    # the shares sampled after the windows, of the CPU the windows measured; and the
    # server's CPU use while it was sampled, in cores.
    profile: dict[str, float] | None = None
    profile_server_cpu: float | None = None

    @property
    def server_ms_per_call_second(self) -> float | None:
        """Server CPU per second of one call, in milliseconds (with --server-pid)."""
        return capacity.ms_per_call_second(self.server_cpu, self.calls)


def merge_windows(
    windows: Sequence[GroupWindow], failures: int, server_cpu: float | None
) -> CapacityStep:
    """One capacity step from the windows of every client process."""
    lateness = [ms for w in windows for ms in w.lateness_ms]
    gaps = [ms for w in windows for ms in w.gaps_ms]
    shares = [w.audible_share for w in windows if not math.isnan(w.audible_share)]
    return CapacityStep(
        calls=sum(w.client.calls for w in windows),
        frames=sum(w.frames for w in windows),
        p50_lateness_ms=percentile_or_nan(lateness, 50),
        p99_lateness_ms=percentile_or_nan(lateness, 99),
        max_lateness_ms=max(lateness, default=math.nan),
        interarrival_p99_ms=percentile_or_nan(gaps, 99),
        setup_failures=failures,
        audible_share=sum(shares) / len(shares) if shares else math.nan,
        server_cpu=server_cpu,
        clients=[w.client for w in windows],
    )


async def measure_capacity(
    config: WebRtcBenchConfig, *, audio: CallerAudio | None = None, progress: bool = True
) -> tuple[list[CapacityStep], int]:
    """Ramp up cheap calls until audio runs late; returns the steps and the calls carried.

    The calls are spread over ``client_processes`` processes. With ``server_pid`` (a server
    on this machine) each step also reports its CPU use, and with ``profile_s`` where it
    goes: py-spy samples the server for that long after the step's windows.
    """
    if audio is None:
        audio = await caller_audio()
    # A window's packets, twice over, and the setup before it.
    keep = math.ceil(config.hold_s / FRAME_S) * 2 + 500
    url = ServerUrl.parse(config.url).http()
    callers = CallerProcesses(config.client_processes, url, config.api_key, audio, keep=keep)
    server_pid = config.server_pid

    async def examine(result: CapacityStep) -> None:
        if not config.profile_s or server_pid is None or not result.calls:
            return
        profile = await webrtc_profile.record(server_pid, config.profile_s)
        parts = webrtc_profile.attribute(profile, result.calls)
        # py-spy stops the server so often that its playout skips frames: the shares
        # hold, the CPU they share is the step's own, measured without py-spy.
        if result.server_cpu is not None and profile.cores > 0:
            parts = webrtc_profile.scaled(parts, result.server_cpu / profile.cores)
        result.profile = parts
        result.profile_server_cpu = profile.cores
        if progress:
            print(webrtc_profile.format_table(result.profile), flush=True)

    try:
        return await capacity.ramp(
            step=config.step,
            max_calls=config.max_calls,
            settle_s=_SETTLE_S,
            add=callers.add,
            watch=lambda failures: _watch(callers, config, failures),
            within=lambda result: result.p99_lateness_ms <= config.threshold_ms,
            show=_print_step if progress else None,
            examine=examine,
        )
    finally:
        await callers.close()


async def _watch(
    callers: CallerProcesses, config: WebRtcBenchConfig, failures: int
) -> CapacityStep:
    """Watch the audio of every call for ``--hold`` seconds."""
    server = capacity.CpuMeter(config.server_pid)
    windows = await callers.watch(config.hold_s)
    return merge_windows(windows, failures, server.cores())


def _print_step(result: CapacityStep, again: bool) -> None:
    per_call = result.server_ms_per_call_second
    client_lag = max((c.loop_lag_p99_ms for c in result.clients), default=math.nan)
    client_send = max((c.send_lateness_p99_ms for c in result.clients), default=math.nan)
    print(
        f"{result.calls:4d} calls{' (again)' if again else ''}: lateness p50 "
        f"{result.p50_lateness_ms:6.1f} ms, p99 {result.p99_lateness_ms:6.1f} ms, max "
        f"{result.max_lateness_ms:6.1f} ms; frame gap p99 {result.interarrival_p99_ms:5.1f} ms"
        f"; audible {result.audible_share:4.0%}"
        + (
            f"; server CPU {result.server_cpu:.2f} cores, {per_call:.1f} ms per call-second"
            if result.server_cpu is not None and per_call is not None
            else ""
        )
        + f"; client loop lag p99 {client_lag:.1f} ms, send lateness p99 {client_send:.1f} ms"
        + (f"; {result.setup_failures} failed to set up" if result.setup_failures else ""),
        flush=True,
    )


# ---------------------------------------------------------------------- report


@dataclass
class WebRtcReport(capacity.CapacityReport[SetupResult, CapacityStep]):
    """Everything one run measured."""

    url: str
    threshold_ms: float = DEFAULT_THRESHOLD_MS

    def setup_summary(self) -> dict[str, dict[str, float]]:
        """p50/p90/p99 of each setup step over the calls that got that far."""
        summary = {}
        for name in ("answer_ms", "channel_open_ms", "session_created_ms", "first_audio_ms"):
            values = [getattr(r, name) for r in self.setup if getattr(r, name) is not None]
            summary[name] = timing_figures(values)
        return summary

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "url": self.url,
            "setup": {
                "calls": len(self.setup),
                "failures": sum(1 for r in self.setup if r.error is not None),
                "percentiles": self.setup_summary(),
                "calls_detail": [asdict(r) for r in self.setup],
            },
            "capacity": {
                "threshold_ms": self.threshold_ms,
                "calls_carried": self.capacity_calls,
                "steps": [
                    {**asdict(s), "server_ms_per_call_second": s.server_ms_per_call_second}
                    for s in self.capacity
                ],
            },
        }


def _client_lateness(step: CapacityStep) -> str:
    """The bench's own lateness at ``step`` beside the server's, and whether it matters."""
    sent = max(c.send_lateness_p99_ms for c in step.clients)
    lag = max(c.loop_lag_p99_ms for c in step.clients)
    line = (
        f"at {step.calls} calls the bench's own lateness (worst of {len(step.clients)} client "
        f"processes): packets sent late p99 {sent:.1f} ms, loop lag p99 {lag:.1f} ms, against "
        f"the server's frames p99 {step.p99_lateness_ms:.1f} ms"
    )
    if not sent * _CLIENT_MARGIN <= step.p99_lateness_ms and not sent <= _CLIENT_NEGLIGIBLE_MS:
        line += " (the bench was late too: this lateness is not the server's alone)"
    return line


def format_summary(report: WebRtcReport) -> str:
    """A human summary of the report."""
    lines = [f"hark bench webrtc against {report.url}"]
    if report.setup:
        failures = [r for r in report.setup if r.error is not None]
        lines.append(f"setup: {len(report.setup)} calls, {len(failures)} failed")
        labels = {
            "answer_ms": "POST → SDP answer",
            "channel_open_ms": "POST → data channel open",
            "session_created_ms": "POST → session.created",
            "first_audio_ms": "POST → first reply audio",
        }
        for name, stats in report.setup_summary().items():
            lines.append(
                f"  {labels[name]:<26} p50 {stats['p50']:7.1f} ms   p90 {stats['p90']:7.1f} ms"
                f"   p99 {stats['p99']:7.1f} ms"
            )
        for failure in failures[:3]:
            lines.append(f"  failure: {failure.error}")
    if report.capacity:
        lines.append(
            f"capacity: {report.capacity_calls} simultaneous calls with p99 audio lateness "
            f"≤ {report.threshold_ms:.0f} ms"
        )
        knee = report.knee()
        if knee is not None and knee.server_ms_per_call_second is not None:
            lines.append(
                f"  server CPU at {knee.calls} calls: {knee.server_cpu:.2f} cores, "
                f"{knee.server_ms_per_call_second:.1f} ms per call-second"
            )
        for step in report.capacity[-2:]:
            if step.clients:
                lines.append(f"  {_client_lateness(step)}")
        profiled = [(s, s.profile) for s in report.capacity if s.profile is not None]
        if profiled:
            step, parts = profiled[-1]
            lines.append(
                f"where the server's CPU went at {step.calls} calls (py-spy's shares of the "
                f"{step.server_cpu or 0:.2f} cores measured before it; "
                f"{step.profile_server_cpu or 0:.2f} cores while it sampled):"
            )
            lines.append(webrtc_profile.format_table(parts))
    return "\n".join(lines)


async def run_webrtc_bench(config: WebRtcBenchConfig) -> WebRtcReport:
    """Run the setup measurement, then the capacity ramp if asked."""
    report = WebRtcReport(url=ServerUrl.parse(config.url).http(), threshold_ms=config.threshold_ms)
    async with aiohttp.ClientSession() as http:
        for _ in range(config.calls):
            report.setup.append(await measure_setup(http, report.url, config.api_key))
    if config.capacity:
        report.capacity, report.capacity_calls = await measure_capacity(config)
    return report


OPTIONS: tuple[BenchOption | str, ...] = (
    "api_key",
    shared("url", help="the server's HTTP root, e.g. http://127.0.0.1:8000"),
    *capacity.capacity_options(
        step=5, max_calls=500, threshold_ms=DEFAULT_THRESHOLD_MS, bound="p99 frame lateness"
    ),
    BenchOption(
        "client_processes",
        "spread the capacity calls over N processes (default 1)",
        positive,
        1,
        metavar="N",
    ),
    BenchOption(
        "profile",
        "with --server-pid: after each capacity step, sample the server with py-spy "
        "for SECONDS and show where its CPU went",
        float,
        metavar="SECONDS",
    ),
    "json",
)


@dataclass(frozen=True)
class WebRtcBenchConfig(capacity.CapacityConfig):
    """What ``hark bench webrtc`` measures: its options."""

    url: str
    api_key: str
    client_processes: int
    profile_s: float | None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> WebRtcBenchConfig:
        """The config of the parsed options."""
        if options["profile"] is not None and options["server_pid"] is None:
            raise BenchError("--profile needs --server-pid")
        return config_from(
            cls,
            options,
            api_key=api_key(options["api_key"]),
        )


def run(config: WebRtcBenchConfig) -> Result:
    """Time the setups, then ramp if asked; the run passes when every call set up."""
    # aiortc leaves tasks failing noisily when many client peers close at once.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    report = asyncio.run(run_webrtc_bench(config))
    passed = all(r.error is None for r in report.setup)
    return Result(report.to_json(), format_summary(report), passed)


BENCH = Bench("webrtc", OPTIONS, WebRtcBenchConfig.from_options, run)
configure_parser, command = BENCH.configure_parser, BENCH.command

"""``hark bench turns --backchannels``: does a listener's "uh-huh" over a playing reply leave it
playing, and does a real interruption still stop it, and how fast?

A ``hark serve`` of the bench's own (Silero VAD, Whisper tiny.en, the default voice, hibari,
for the replies, the fake LLM's one sentence: a reply of about two seconds) takes one call or
connection per transport. Each trial asks for a reply (``response.create``; ``semantic_vad``,
``interrupt_response`` on, ``create_response`` off, so that nothing but the reply plays) and
says a fixture into the microphone ``SAY_AFTER_S`` into the reply's audio:

- a *backchannel* ("Uh-huh.", "Mm-hmm.", "Yeah.", "Right.", "Okay.", laughter) is a *false
  barge-in* when the server tells of speech (``input_audio_buffer.speech_started``), cancels
  the reply or cuts its audio;
- an *interruption* ("Wait.", "Wait, stop.", "No, stop.", a question) is *missed* when no
  ``speech_started`` comes; its *stop latency* is the time from the first voiced sample sent
  to that event, which is when the audio stops: over WebRTC the server clears its playout in
  the same step (within a frame), and a WebSocket client stops its own playback on the event.

Every fixture is said by the voices of ``hark bench turns``' spec (Piper's joe and two
espeak-ng voices), synthesised once and cached. WebSocket streams the microphone as 20 ms
appends in real time and plays nothing (the reply's audio is counted, not heard); WebRTC is
an aiortc call (``hark.bench.echo.EchoCallClient``, its room's echo 120 dB down); SIP is a
phone call over G.711 (``hark.bench.sip.SipCaller``) that the bench's own backend accepts
from the ``realtime.call.incoming`` webhook, asking for replies and hearing the server's
events on the call's sideband, as a telephony backend does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
from aiohttp import web

from hark.audio.resample import resample
from hark.bench.echo import (
    HEARD_EVENTS,
    EchoCallClient,
    ReplyLine,
    Room,
    Trial,
    heard_as,
    reply_trial,
)
from hark.bench.local_server import local_server
from hark.bench.report import BenchError, percentile
from hark.bench.sip import CLOCK, SipCaller
from hark.bench.spoken_questions import RATE
from hark.bench.turn_fixtures import Synthesiser, load_spec
from hark.bench.webrtc import AUDIBLE_RMS

BACKCHANNELS = ("Uh-huh.", "Mm-hmm.", "Yeah.", "Right.", "Okay.", "Ha ha ha.")
INTERRUPTIONS = ("Wait.", "Wait, stop.", "No, stop.", "Hold on, what about Lyon?")
TRANSPORTS = ("websocket", "webrtc", "sip")
# The fixture starts this long after the reply's first audio (as ``hark bench echo``).
SAY_AFTER_S = 0.5
# A reply is over this long after its audio ended, for what the speech said over it set off.
TAIL_S = 2.0
# A trial not over by then (a machine too busy to answer) is recorded as timed out.
REPLY_LIMIT_S = 60.0
# The reply counts as silenced at the client from the first of this many quiet frames in a
# row (200 ms: longer than the pauses inside the reply's sentence).
QUIET_FRAMES = 10
_ONSET_LEVEL = 1000
API_KEY = "sk-hark-bench"


def session(backchannels: bool) -> dict[str, Any]:
    """The session every trial runs in."""
    return {
        "type": "realtime",
        # What the server heard in each utterance it let pass goes in the report.
        "include": ["hark.backchannels"],
        "audio": {
            "input": {
                "transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {
                    "type": "semantic_vad",
                    "create_response": False,
                    "interrupt_response": True,
                    "hark_backchannels": backchannels,
                },
            }
        },
    }


@dataclass(frozen=True)
class Said:
    """A fixture: ``text`` said by ``voice`` (24 kHz, trimmed to its voice)."""

    text: str
    voice: str
    backchannel: bool
    pcm: npt.NDArray[np.int16] = field(repr=False, compare=False)


@dataclass
class Outcome:
    """What one trial's fixture set off."""

    transport: str
    text: str
    voice: str
    backchannel: bool
    # speech_started came (after the onset), and when, from the first voiced sample sent.
    heard_ms: float | None
    # The reply's final status and whether its audio was cut (WebRTC: output_audio_buffer
    # .cleared).
    status: str
    cut: bool
    # WebRTC: when the reply's audio went quiet at the client after the onset (the hold),
    # from the first voiced sample sent, and for how long (None: it did not come back).
    silenced_ms: float | None = None
    quiet_ms: float | None = None
    # What the server heard in the utterance (``hark.bench.echo.heard_as``).
    heard_as: str | None = None

    @property
    def barged_in(self) -> bool:
        """Whether the fixture stopped the reply (or would have, over WebSocket)."""
        return self.heard_ms is not None or self.cut or self.status == "cancelled"


async def fixtures(voices: Sequence[str] | None) -> list[Said]:
    """Every backchannel and interruption said by every voice of the turns spec."""
    spec = load_spec()
    chosen = [v for v in spec.voices if voices is None or v.name in voices]
    if not chosen:
        raise BenchError("no voice of the spec is chosen")
    synth = Synthesiser()
    said = []
    for voice in chosen:
        for texts, backchannel in ((BACKCHANNELS, True), (INTERRUPTIONS, False)):
            for text in texts:
                pcm = await synth.segment(text, voice, 1.0)
                said.append(Said(text, voice.name, backchannel, pcm))
    return said


# ---------------------------------------------------------------------------- WebSocket


class _Microphone:
    """A WebSocket client's microphone: silence, and a fixture when one is said, sent as
    20 ms appends at the pace of real time."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._queue: list[npt.NDArray[np.int16]] = []
        self.onset_at: float | None = None
        self._silence = np.zeros(RATE // 50, np.int16)

    def say(self, pcm: npt.NDArray[np.int16]) -> None:
        self.onset_at = None
        step = RATE // 50
        self._queue = [pcm[i : i + step] for i in range(0, len(pcm), step)]

    async def run(self) -> None:
        start = time.monotonic()
        frames = 0
        while True:
            chunk = self._queue.pop(0) if self._queue else self._silence
            if len(chunk) < len(self._silence):
                chunk = np.concatenate([chunk, self._silence[len(chunk) :]])
            if self.onset_at is None and int(np.max(np.abs(chunk))) > _ONSET_LEVEL:
                self.onset_at = time.monotonic()
            audio = base64.b64encode(chunk.astype("<i2").tobytes()).decode()
            await self._ws.send_str(
                json.dumps({"type": "input_audio_buffer.append", "audio": audio})
            )
            frames += 1
            delay = start + frames * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)


async def _websocket_trials(
    http: aiohttp.ClientSession, ws_root: str, said: Sequence[Said], backchannels: bool
) -> list[Outcome]:
    url = f"{ws_root}/v1/realtime?model=gpt-realtime"
    outcomes = []
    async with http.ws_connect(url, headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        await ws.send_str(json.dumps({"type": "session.update", "session": session(backchannels)}))
        mic = _Microphone(ws)
        sender = asyncio.create_task(mic.run())
        try:
            for fixture in said:
                outcomes.append(await _websocket_trial(ws, mic, fixture))
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    return outcomes


async def _websocket_trial(
    ws: aiohttp.ClientWebSocketResponse, mic: _Microphone, fixture: Said
) -> Outcome:
    await ws.send_str(json.dumps({"type": "response.create"}))
    state = _WsTrial()
    try:
        await _websocket_events(ws, mic, fixture, state)
    except TimeoutError:
        state.status = "timeout"
        await ws.send_str(json.dumps({"type": "response.cancel"}))
    onset = mic.onset_at
    heard_at = state.heard_at
    heard_ms = (heard_at - onset) * 1000 if heard_at is not None and onset is not None else None
    return Outcome(
        "websocket",
        fixture.text,
        fixture.voice,
        fixture.backchannel,
        None if heard_ms is None else round(heard_ms, 1),
        state.status,
        False,
        heard_as=heard_as(state.events),
    )


@dataclass
class _WsTrial:
    status: str = "none"
    heard_at: float | None = None
    # The events that tell what the server heard (``hark.bench.echo.heard_as``).
    events: list[dict[str, Any]] = field(default_factory=list)


async def _websocket_events(
    ws: aiohttp.ClientWebSocketResponse, mic: _Microphone, fixture: Said, state: _WsTrial
) -> None:
    first_audio: float | None = None
    audio_bytes = 0
    done_at: float | None = None
    stopped = False
    said = False
    async with asyncio.timeout(REPLY_LIMIT_S):
        while True:
            now = time.monotonic()
            if first_audio is not None and not said and now >= first_audio + SAY_AFTER_S:
                mic.say(fixture.pcm)
                said = True
            reply_end = (first_audio or now) + audio_bytes / 2 / RATE
            if (
                done_at is not None
                and said
                and now > max(reply_end, done_at) + TAIL_S
                and (state.heard_at is None or stopped)
            ):
                return
            try:
                message = await asyncio.wait_for(ws.receive(), 0.05)
            except TimeoutError:
                continue
            if message.type != aiohttp.WSMsgType.TEXT:
                raise BenchError(f"the WebSocket closed: {message.type.name}")
            event = json.loads(message.data)
            kind = event["type"]
            now = time.monotonic()
            if kind == "response.output_audio.delta":
                first_audio = first_audio or now
                audio_bytes += len(base64.b64decode(event["delta"]))
            elif kind == "response.done":
                done_at = now
                state.status = event["response"]["status"]
            elif kind == "input_audio_buffer.speech_started":
                if said and mic.onset_at is not None and state.heard_at is None:
                    state.heard_at = now
            elif kind == "input_audio_buffer.speech_stopped":
                stopped = True
            elif kind in HEARD_EVENTS:
                state.events.append(event)
            elif kind == "error":
                print(f"  error event: {event['error']['message']}", file=sys.stderr)


# ---------------------------------------------------------------------------- WebRTC


async def _webrtc_trials(
    http: aiohttp.ClientSession, ws_root: str, said: Sequence[Said], backchannels: bool
) -> list[Outcome]:
    url = ws_root.replace("ws://", "http://", 1)
    room = Room(50, -120.0)
    client = EchoCallClient(room)
    try:
        await client.connect(http, url, api_key=API_KEY, session=session(backchannels))
        await client.next_event("session.created")
        await asyncio.wait_for(client.opened.wait(), 30)
        return await _trials(
            "webrtc",
            client,
            said,
            lambda: [(f.arrival, f.rms > AUDIBLE_RMS) for f in client.frames],
        )
    finally:
        await client.close()


async def _trials(
    transport: str,
    line: ReplyLine,
    said: Sequence[Said],
    heard: Callable[[], Sequence[tuple[float, bool]]],
) -> list[Outcome]:
    """Each fixture said over a reply on ``line`` (a call whose server plays the reply);
    ``heard``: the call's audio so far, each 20 ms frame's arrival and whether it was
    audible, from which the hold is read."""
    room = Room(50, -120.0)
    outcomes = []
    for fixture in said:
        mark = len(heard())
        try:
            trial = await reply_trial(line, fixture.pcm, room)
        except TimeoutError:
            line.send({"type": "response.cancel"})
            trial = Trial(50, -120.0, True, "timeout", False)
        quiet = _quiet_after(heard()[mark:], line.mic.onset_at)
        outcomes.append(
            Outcome(
                transport,
                fixture.text,
                fixture.voice,
                fixture.backchannel,
                trial.detected_ms,
                trial.status,
                trial.cut,
                *quiet,
                heard_as=trial.heard_as,
            )
        )
    return outcomes


def _quiet_after(
    frames: Sequence[tuple[float, bool]], onset: float | None
) -> tuple[float | None, float | None]:
    """When the reply's audio first went quiet for ``QUIET_FRAMES`` 20 ms frames after
    ``onset`` (ms from it), and how long it stayed quiet (None: until the end of the trial).
    ``frames``: each frame's arrival and whether it was audible."""
    if onset is None:
        return None, None
    start: float | None = None
    count = 0
    for arrival, audible in frames:
        if arrival < onset:
            continue
        if not audible:
            start = arrival if start is None else start
            count += 1
            continue
        if start is not None and count >= QUIET_FRAMES:
            return round((start - onset) * 1000, 1), round(count * 20.0, 1)
        start, count = None, 0
    if start is not None and count >= QUIET_FRAMES:
        return round((start - onset) * 1000, 1), None
    return None, None


# ---------------------------------------------------------------------------- SIP


class _Phone(SipCaller):
    """The phone of the SIP trials, and its microphone (``echo.ReplyMicrophone``): what it is
    told to say goes out as G.711 at 8 kHz, and the send time of its first packet is the
    onset (the fixtures are trimmed to their voice)."""

    def __init__(self, server: tuple[str, int]) -> None:
        super().__init__(server)
        self.onset_at: float | None = None
        self._onset_due = False

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        self.say(resample(pcm, rate, CLOCK))
        self._onset_due = True

    def finish(self, response_id: str) -> None:
        pass

    def tick(self, now: float) -> None:
        if self._onset_due and self.saying and self.in_call:
            self.onset_at = time.monotonic()
            self._onset_due = False
        super().tick(now)

    @property
    def in_call(self) -> bool:
        """The call is up: a tick sends a packet."""
        return self._rtp_remote is not None and not self.ended.is_set()


class _SipLine:
    """A phone call seen as ``echo.ReplyLine``: client events go to the call's sideband, and
    its server events come from there, each stamped with its arrival."""

    def __init__(self, phone: _Phone, sideband: aiohttp.ClientWebSocketResponse) -> None:
        self.phone = phone
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue(4096)
        self._sideband = sideband
        self._sending: set[asyncio.Task[None]] = set()

    @property
    def mic(self) -> _Phone:
        return self.phone

    def send(self, event: dict[str, Any]) -> None:
        task = asyncio.create_task(self._sideband.send_str(json.dumps(event)))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def listen(self) -> None:
        """Put the sideband's events on ``events`` until it closes."""
        async for message in self._sideband:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            event = json.loads(message.data)
            event["_received"] = time.monotonic()
            with contextlib.suppress(asyncio.QueueFull):
                self.events.put_nowait(event)


class _Backend:
    """The customer's backend of the SIP trials: told of each call by the webhook."""

    def __init__(self) -> None:
        self.port = _free_port(socket.SOCK_STREAM)
        self.secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        self.calls: asyncio.Queue[str] = asyncio.Queue(8)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/calls"

    async def __aenter__(self) -> _Backend:
        app = web.Application()
        app.router.add_post("/calls", self._incoming)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _incoming(self, request: web.Request) -> web.Response:
        event = json.loads(await request.read())
        if event.get("type") == "realtime.call.incoming":
            with contextlib.suppress(asyncio.QueueFull):
                self.calls.put_nowait(event["data"]["call_id"])
        return web.Response(text="ok")


def _free_port(kind: socket.SocketKind) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _sip_trials(
    http: aiohttp.ClientSession,
    ws_root: str,
    said: Sequence[Said],
    backchannels: bool,
    sip_port: int,
    backend: _Backend,
) -> list[Outcome]:
    """One phone call; the backend accepts it with the trials' session and asks for each
    reply on its sideband."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    phone = _Phone(("127.0.0.1", sip_port))
    await phone.open()
    outcomes: list[Outcome] = []
    ticking: asyncio.Task[None] | None = None
    listening: asyncio.Task[None] | None = None
    try:
        ringing = asyncio.create_task(phone.invite(REPLY_LIMIT_S))
        async with asyncio.timeout(REPLY_LIMIT_S):
            call_id = await backend.calls.get()
        accept = ws_root.replace("ws://", "http://", 1) + f"/v1/realtime/calls/{call_id}/accept"
        body = {**session(backchannels), "model": "gpt-realtime"}
        async with http.post(accept, json=body, headers=headers) as response:
            if response.status >= 300:
                raise BenchError(f"accept: {response.status} {await response.text()}")
        await ringing
        ticking = asyncio.create_task(_tick(phone))
        sideband = await http.ws_connect(
            f"{ws_root}/v1/realtime?call_id={call_id}", headers=headers
        )
        line = _SipLine(phone, sideband)
        listening = asyncio.create_task(line.listen())
        outcomes = await _trials(
            "sip", line, said, lambda: [(r.arrival, r.audible) for r in phone.received]
        )
        await sideband.close()
    finally:
        for task in (ticking, listening):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await phone.bye()
        phone.close()
    return outcomes


async def _tick(phone: _Phone) -> None:
    """20 ms of the phone's microphone every 20 ms, on an absolute grid."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        phone.tick(time.monotonic())
        next_at += 0.02
        await asyncio.sleep(max(0.0, next_at - loop.time()))


# ---------------------------------------------------------------------------- the run


def figures(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """False barge-ins over backchannels; misses and stop latency over interruptions."""
    backs = [o for o in outcomes if o.backchannel]
    stops = [o for o in outcomes if not o.backchannel]
    latencies = sorted(o.heard_ms for o in stops if o.heard_ms is not None)
    silenced = sorted(o.silenced_ms for o in stops if o.silenced_ms is not None)
    gaps = sorted(o.quiet_ms for o in backs if o.quiet_ms is not None and not o.barged_in)
    return {
        "backchannels": len(backs),
        "false_barge_ins": sum(o.barged_in for o in backs),
        "false_barge_in_rate": round(sum(o.barged_in for o in backs) / len(backs), 3)
        if backs
        else None,
        "timeouts": sum(o.status == "timeout" for o in outcomes),
        "interruptions": len(stops),
        "missed": sum(o.heard_ms is None for o in stops),
        "stop_p50_ms": _round(percentile(latencies, 50)) if latencies else None,
        "stop_p95_ms": _round(percentile(latencies, 95)) if latencies else None,
        "stop_max_ms": latencies[-1] if latencies else None,
        # WebRTC: when the listener stopped hearing the reply, and the gap a backchannel
        # left in it (the hold, until the verdict resumed it).
        "silenced_p50_ms": _round(percentile(silenced, 50)) if silenced else None,
        "silenced_p95_ms": _round(percentile(silenced, 95)) if silenced else None,
        "backchannel_gap_p50_ms": _round(percentile(gaps, 50)) if gaps else None,
        "backchannel_gap_p95_ms": _round(percentile(gaps, 95)) if gaps else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


async def measure(
    transports: Sequence[str],
    voices: Sequence[str] | None,
    backchannels: bool,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Run every fixture over every transport; the report (JSON-ready)."""
    said = await fixtures(voices)
    args = ["--asr", "whisper", "--tts", "hibari", "--echo-cancellation", "off"]
    outcomes: list[Outcome] = []
    async with _Backend() as backend:
        sip_port = _free_port(socket.SOCK_DGRAM)
        if "sip" in transports:
            # Calls from this machine only, each raised to the bench's backend.
            args += ["--sip", "--sip-host", "127.0.0.1", "--sip-port", str(sip_port)]
            args += ["--rtp-ports", "0", "--sip-webhook-url", backend.url]
            args += ["--sip-webhook-secret", backend.secret]
        # A busy machine takes minutes to load the models (the end-of-turn model above all).
        with local_server("fake", ready_s=900, args=args) as (ws_root, _pid):
            async with aiohttp.ClientSession() as http:
                for transport in transports:
                    if transport == "sip":
                        found = await _sip_trials(
                            http, ws_root, said, backchannels, sip_port, backend
                        )
                    elif transport == "webrtc":
                        found = await _webrtc_trials(http, ws_root, said, backchannels)
                    else:
                        found = await _websocket_trials(http, ws_root, said, backchannels)
                    progress(f"  {transport}: {json.dumps(figures(found))}")
                    outcomes += found
    return {
        "backchannels_on": backchannels,
        "figures": {t: figures([o for o in outcomes if o.transport == t]) for t in transports},
        "outcomes": [{**asdict(o), "barged_in": o.barged_in} for o in outcomes],
    }


def summary(report: dict[str, Any]) -> str:
    """The human summary."""
    state = "on" if report["backchannels_on"] else "off"
    lines = [f"backchannels {state}"]
    for transport, f in report["figures"].items():
        lines.append(
            f"  {transport}: false barge-ins {f['false_barge_ins']}/{f['backchannels']}"
            f" ({f['false_barge_in_rate']}); interruptions missed {f['missed']}/"
            f"{f['interruptions']}, stopped p50 {f['stop_p50_ms']} ms, p95 {f['stop_p95_ms']}"
            f" ms, max {f['stop_max_ms']} ms"
        )
        if f["silenced_p50_ms"] is not None:
            lines.append(
                f"    audio silenced at the client p50 {f['silenced_p50_ms']} ms, p95"
                f" {f['silenced_p95_ms']} ms; backchannel gap p50 {f['backchannel_gap_p50_ms']}"
                f" ms, p95 {f['backchannel_gap_p95_ms']} ms"
            )
    for o in report.get("outcomes", ()):
        if o["barged_in"] == o["backchannel"]:
            kind = "backchannel" if o["backchannel"] else "interruption"
            lines.append(
                f"  misjudged {kind} over {o['transport']}: {o['voice']} said {o['text']!r},"
                f" the server heard {o['heard_as']!r}"
            )
    return "\n".join(lines)


def run(
    transports: Sequence[str], voices: Sequence[str] | None, backchannels: bool
) -> dict[str, Any]:
    """``measure`` on a fresh event loop, its progress to stderr."""
    unknown = set(transports) - set(TRANSPORTS)
    if unknown:
        raise BenchError(f"unknown transport: {', '.join(sorted(unknown))}")
    return asyncio.run(
        measure(
            transports,
            voices,
            backchannels,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    )

"""``hark bench echo``: does a reply that comes back through the caller's loudspeaker interrupt
itself, and is a real barge-in over that echo still heard in time?

A WebRTC call (aiortc) to a ``hark serve --engines fake --tts hibari`` of the bench's own
(Silero VAD, the default voice, hibari, for the replies, the fake LLM's one sentence)
whose microphone hears the reply again: every frame of reply audio the client receives goes
through a room (``Room``: a direct path, then exponentially decaying noise, τ 30 ms, about
210 ms of reverberation), ``gain_db`` quieter, ``delay_ms`` later, into what the microphone
sends.
Each call asks for replies one after another (``response.create``, server VAD with
``interrupt_response`` and without ``create_response``):

- an *echo trial* lets the reply play out with nothing but its echo on the microphone; a
  ``speech_started`` before the reply's audio stopped (and a second after, for the echo's
  tail) or a reply that did not complete is a self-interruption;
- a *barge-in trial* says "Wait, stop please." into the microphone half a second into the
  echo; it counts as heard when ``speech_started`` comes after the first voiced sample was
  sent, and the time from that sample to the event is the detection latency.

The server runs with ``--echo-cancellation on`` (or ``off``, to see what it prevents). The
canceller's own cost per call-second is measured here, on the adapter, over a reply played
into a room: what a call pays while the bot talks (and for ``IDLE_S`` after), and nothing
while it does not. The server's whole CPU per call-second (from ``/proc``) is reported too,
for an A/B of ``on`` against ``off``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import aiohttp
import numpy as np
import numpy.typing as npt

from hark.audio.codecs.opus import OpusEncoder
from hark.audio.echo import EchoCanceller
from hark.bench.command import Bench, Result, arguments, config_from
from hark.bench.local_server import local_server
from hark.bench.spoken_questions import RATE as SPEECH_RATE
from hark.bench.spoken_questions import spoken_questions
from hark.bench.webrtc import CallClient
from hark.config.options import BenchOption
from hark.transports.webrtc.playout import FRAME_SAMPLES, PLAYOUT_RATE, PlayoutTrack

BARGE_IN = "Wait, stop please."
# Echo path conditions, one call each: (delay ms, gain dB).
CONDITIONS: tuple[tuple[int, float], ...] = ((50, -6.0), (150, -12.0), (300, -6.0), (300, -20.0))
SESSION: dict[str, Any] = {
    "type": "realtime",
    "audio": {
        "input": {
            "turn_detection": {
                "type": "server_vad",
                "create_response": False,
                "interrupt_response": True,
            }
        }
    },
}
# After a reply's audio stopped, its echo may still be heard for the path's delay and the
# room's tail: events this long after still count for the trial.
TAIL_S = 1.0
# A barge-in starts this long after the reply's first audio reached the client.
BARGE_IN_AFTER_S = 0.5
# A sample is voiced above this (the barge-in's onset).
_ONSET_LEVEL = 1000
REPLY_LIMIT_S = 30.0
_BARGE_INS = itertools.count(1)


def room_response(rate: int, seed: int = 7, tau_s: float = 0.03) -> npt.NDArray[np.float64]:
    """A room-like impulse response at ``rate``: a direct path, then 250 ms of exponentially
    decaying noise (time constant ``tau_s``), at unit energy."""
    rng = np.random.default_rng(seed)
    length = rate // 4
    ir = rng.standard_normal(length) * np.exp(-np.arange(length) / (tau_s * rate))
    ir[0] = 2.0
    return np.asarray(ir / np.sqrt(np.sum(ir**2)))


class Room:
    """The way from the caller's loudspeaker to its microphone.

    ``heard`` takes the reply as the client's loudspeaker plays it (48 kHz, each frame at
    its place on the stream's clock, its RTP timestamp); ``echo`` gives the microphone's
    frame at a place on the microphone's clock: the reply ``delay_ms`` after it was played,
    through the room and ``gain_db`` quieter. Both clocks are media clocks (a stalled
    client skips frames on them rather than falling behind), and the first frame heard ties
    them: it comes out ``delay_ms`` after the microphone's frame being cut then.
    """

    def __init__(self, delay_ms: int, gain_db: float, rate: int = PLAYOUT_RATE) -> None:
        self.delay = delay_ms * rate // 1000
        self.gain = 10 ** (gain_db / 20)
        self._ir = room_response(rate)
        self._fft = 1 << math.ceil(math.log2(len(self._ir) + 4 * FRAME_SAMPLES))
        self._ir_spectrum = np.fft.rfft(self._ir, self._fft)
        self._ring = np.zeros(4 * rate, np.float64)
        # Where the next frame heard ends up on the loudspeaker's clock, and how far the
        # room's output has been written (its tail reaches past the last frame).
        self._written = 0
        self._first_pts: int | None = None
        # The microphone's clock minus the loudspeaker's, once the first frame is heard.
        self._offset: int | None = None
        self.mic_position = 0

    def heard(self, pcm: npt.NDArray[np.int16], pts: int) -> None:
        """A frame the loudspeaker plays, ``pts`` its place on the stream's clock."""
        n = len(pcm)
        if not n:
            return
        if self._first_pts is None:
            self._first_pts = pts
            self._offset = self.mic_position + self.delay
        # RTP timestamps start anywhere and wrap at 2**32.
        at = (pts - self._first_pts) & 0xFFFFFFFF
        if at < self._written - len(self._ring) // 2:
            return
        wet = np.fft.irfft(np.fft.rfft(pcm.astype(np.float64), self._fft) * self._ir_spectrum)
        wet = wet[: n + len(self._ir) - 1] * self.gain
        where = np.arange(at, at + len(wet))
        # What is past the old end of the ring is new; what is before it adds to the tail.
        fresh = where >= self._written
        self._ring[where[fresh] % len(self._ring)] = 0.0
        np.add.at(self._ring, where % len(self._ring), wet)
        self._written = max(self._written, at + len(wet))

    def echo(self, position: int, n: int) -> npt.NDArray[np.float64]:
        """The ``n`` samples of echo from ``position`` on the microphone's clock."""
        self.mic_position = position + n
        if self._offset is None:
            return np.zeros(n)
        wanted = np.arange(position - self._offset, position - self._offset + n)
        held = (wanted >= 0) & (wanted < self._written)
        held &= self._written - wanted <= len(self._ring) // 2
        return np.where(held, self._ring[wanted % len(self._ring)], 0.0)


class EchoMicrophone(PlayoutTrack):
    """The client's microphone: what it is told to ``play`` (the barge-in) plus the echo."""

    def __init__(self, room: Room) -> None:
        super().__init__()
        self.room = room
        self._mixed_encoder = OpusEncoder(PLAYOUT_RATE, bitrate=32000, complexity=5)
        # When the first voiced sample of what was played left (monotonic seconds).
        self.onset_at: float | None = None

    def next_payload(self) -> bytes:
        """The next 20 ms: the voice, if any, and the echo, encoded."""
        own = self.playout.next_frame()
        voiced = own is not self.playout.silence and int(np.max(np.abs(own))) > _ONSET_LEVEL
        if voiced and self.onset_at is None:
            self.onset_at = time.monotonic()
        playout = self.playout
        position = (playout.frames_sent - 1 + playout.frames_skipped) * FRAME_SAMPLES
        mixed = own.astype(np.float64) + self.room.echo(position, FRAME_SAMPLES)
        return self._mixed_encoder.encode(np.clip(np.rint(mixed), -32768, 32767).astype(np.int16))


class EchoCallClient(CallClient):
    """A ``CallClient`` whose microphone hears its loudspeaker through a ``Room``."""

    def __init__(self, room: Room) -> None:
        super().__init__()
        self.room = room
        self.mic = EchoMicrophone(room)
        self.microphone = self.mic
        (sender,) = self.pc.getSenders()
        sender.replaceTrack(self.mic)

    def _heard(self, pcm: npt.NDArray[np.int16], pts: int) -> None:
        self.room.heard(pcm, pts)


@dataclass
class Trial:
    """One reply: whether it interrupted itself, and for a barge-in, when it was heard."""

    delay_ms: int
    gain_db: float
    barge_in: bool
    status: str
    self_interrupted: bool
    detected_ms: float | None = None
    # The reply's audio was cut short (``output_audio_buffer.cleared``) and its item truncated.
    cut: bool = False
    # What the server heard in the speech over the reply, where it said: a ``hark.backchannel``
    # event's transcript, or the turn's transcript (``…transcription.completed``).
    heard_as: str | None = None


@dataclass
class EchoReport:
    """What ``hark bench echo`` found."""

    echo_cancellation: str
    trials: list[Trial] = field(default_factory=list)
    server_cpu_ms_per_call_s: float | None = None
    aec_cpu_ms_per_call_s: dict[str, float] = field(default_factory=dict)
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def summary(self) -> dict[str, Any]:
        """The figures: self-interruptions, barge-ins heard and how fast."""
        echo = [t for t in self.trials if not t.barge_in]
        barge = [t for t in self.trials if t.barge_in]
        latencies = sorted(t.detected_ms for t in barge if t.detected_ms is not None)
        return {
            "echo_replies": len(echo),
            "self_interruptions": sum(t.self_interrupted for t in echo),
            "barge_ins": len(barge),
            "barge_ins_heard": len(latencies),
            "barge_ins_preempted_by_echo": sum(t.self_interrupted for t in barge),
            "detected_p50_ms": _percentile(latencies, 50),
            "detected_p95_ms": _percentile(latencies, 95),
            "detected_max_ms": latencies[-1] if latencies else None,
        }

    def to_json(self) -> dict[str, Any]:
        """The report as JSON."""
        return {
            "echo_cancellation": self.echo_cancellation,
            "summary": self.summary(),
            "server_cpu_ms_per_call_s": self.server_cpu_ms_per_call_s,
            "aec_cpu_ms_per_call_s": self.aec_cpu_ms_per_call_s,
            "load_average": self.load_average,
            "trials": [asdict(t) for t in self.trials],
        }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 1)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 1)


class ReplyMicrophone(Protocol):
    """What ``reply_trial`` says a barge-in into: the time of its first voiced sample."""

    onset_at: float | None

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        """Say ``pcm`` (at ``rate``) after what is being said."""

    def finish(self, response_id: str) -> None:
        """Nothing more comes for ``response_id``."""


class ReplyLine(Protocol):
    """A call ``reply_trial`` runs on: the server's events (each with ``"_received"``, its
    arrival on the monotonic clock), a way to send client events, and a microphone. A WebRTC
    call (``EchoCallClient``, events on its data channel) or a phone call and its sideband."""

    events: asyncio.Queue[dict[str, Any]]

    @property
    def mic(self) -> ReplyMicrophone:
        """The call's microphone."""

    def send(self, event: dict[str, Any]) -> None:
        """Send a client event."""


async def reply_trial(
    client: ReplyLine, barge_in: npt.NDArray[np.int16] | None, room: Room
) -> Trial:
    """Ask for a reply and let it play with its echo (and ``barge_in`` said over it)."""
    _drain(client)
    client.mic.onset_at = None
    client.send({"type": "response.create"})
    events: list[dict[str, Any]] = []
    said = False
    started_at: float | None = None
    ended_at: float | None = None
    async with asyncio.timeout(REPLY_LIMIT_S):
        while ended_at is None or time.monotonic() < ended_at + TAIL_S:
            try:
                event = await asyncio.wait_for(client.events.get(), 0.05)
            except TimeoutError:
                event = None
            now = time.monotonic()
            if event is not None:
                events.append(event)
                kind = event["type"]
                if kind == "output_audio_buffer.started" and started_at is None:
                    started_at = now
                elif kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared"):
                    ended_at = ended_at or now
            if (
                barge_in is not None
                and not said
                and started_at is not None
                and now >= started_at + room.delay / PLAYOUT_RATE + BARGE_IN_AFTER_S
            ):
                # A fresh id each time: the playout plays no more of an id that ended.
                said_as = f"barge-in-{next(_BARGE_INS)}"
                client.mic.play(said_as, "", barge_in, SPEECH_RATE)
                client.mic.finish(said_as)
                said = True
    if any(e["type"] == "input_audio_buffer.speech_started" for e in events):
        # The turn heard has ended before the next reply is asked for.
        await _wait_for(client, "input_audio_buffer.speech_stopped", events)
    statuses = [e["response"]["status"] for e in events if e["type"] == "response.done"]
    onset = client.mic.onset_at
    starts = [e["_received"] for e in events if e["type"] == "input_audio_buffer.speech_started"]
    early = [t for t in starts if onset is None or t < onset]
    late = [t for t in starts if onset is not None and t >= onset]
    detected = (late[0] - onset) * 1000 if late and onset is not None else None
    status = statuses[0] if statuses else "none"
    cut = any(e["type"] == "output_audio_buffer.cleared" for e in events)
    return Trial(
        delay_ms=room.delay * 1000 // PLAYOUT_RATE,
        gain_db=20 * math.log10(room.gain),
        barge_in=barge_in is not None,
        status=status,
        self_interrupted=bool(early) or (barge_in is None and (cut or status != "completed")),
        detected_ms=None if detected is None else round(detected, 1),
        cut=cut,
        heard_as=heard_as(events),
    )


# The events that say what the server heard in speech over a reply.
HEARD_EVENTS = ("hark.backchannel", "conversation.item.input_audio_transcription.completed")


def heard_as(events: list[dict[str, Any]]) -> str | None:
    """What the server heard in speech over a reply, from its events: the transcript of each
    ``hark.backchannel`` (sent to a session that includes ``hark.backchannels``) and of the
    turn the speech became, in order, joined by " | " (one utterance can be judged in
    pieces: "Wait," let pass, then "stop."); ``None`` when none came."""
    heard = [str(e.get("transcript", "")) for e in events if e["type"] in HEARD_EVENTS]
    return " | ".join(heard) if heard else None


def _drain(client: ReplyLine) -> None:
    while not client.events.empty():
        client.events.get_nowait()


async def _wait_for(client: ReplyLine, kind: str, events: list[dict[str, Any]]) -> None:
    if any(e["type"] == kind for e in events):
        return
    async with asyncio.timeout(REPLY_LIMIT_S):
        while True:
            event = await client.events.get()
            events.append(event)
            if event["type"] == kind:
                return


async def echo_call(
    http: aiohttp.ClientSession,
    url: str,
    delay_ms: int,
    gain_db: float,
    *,
    replies: int,
    barge_ins: int,
    api_key: str = "sk-hark-bench",
) -> list[Trial]:
    """One call under one echo path: ``replies`` echo trials, then ``barge_ins``."""
    (spoken,) = await spoken_questions([BARGE_IN])
    voice = spoken.pcm[: spoken.last_voiced + 1]
    room = Room(delay_ms, gain_db)
    client = EchoCallClient(room)
    trials = []
    try:
        await client.connect(http, url, api_key=api_key, session=SESSION)
        await client.next_event("session.created")
        await asyncio.wait_for(client.opened.wait(), 30)
        for index in range(replies + barge_ins):
            trials.append(await reply_trial(client, voice if index >= replies else None, room))
    finally:
        await client.close()
    return trials


def aec_cost(rate: int = 24000, seconds: float = 20.0) -> dict[str, float]:
    """The canceller's CPU in ms per call-second at ``rate``: while a reply plays into a room
    (and echoes), and while nothing plays (heard audio passes untouched)."""
    n = int(seconds * rate)
    rng = np.random.default_rng(3)
    envelope = (np.sin(np.arange(n) / rate * 2 * np.pi * 2.5) > -0.3).astype(np.float64)
    far = np.clip(rng.standard_normal(n) * 4000 * envelope, -32768, 32767).astype(np.int16)
    wet = np.convolve(far.astype(np.float64), room_response(rate))[:n] * 0.5
    delay = rate // 10
    near = np.zeros(n, np.int16)
    near[delay:] = np.clip(wet[: n - delay], -32768, 32767).astype(np.int16)
    step = rate // 50
    figures = {}
    for name, played in (("talking", far), ("idle", np.zeros(n, np.int16))):
        canceller = EchoCanceller(rate)
        silent = not played.any()
        begin = time.process_time()
        for i in range(0, n - step + 1, step):
            canceller.played(played[i : i + step], silent=silent)
            canceller.heard(near[i : i + step])
        figures[name] = round((time.process_time() - begin) * 1000 / seconds, 2)
    return figures


def _process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_echo_bench(
    *, echo_cancellation: str, replies: int, barge_ins: int, server_args: list[str]
) -> EchoReport:
    """Start a server, make one call per condition, and report."""
    report = EchoReport(echo_cancellation)
    report.aec_cpu_ms_per_call_s = aec_cost()
    args = ["--tts", "hibari", "--echo-cancellation", echo_cancellation, *server_args]
    with local_server("fake", args=args) as (ws_root, pid):
        url = ws_root.replace("ws://", "http://", 1)
        async with aiohttp.ClientSession() as http:
            cpu_before = _process_cpu_s(pid)
            began = time.monotonic()
            for delay_ms, gain_db in CONDITIONS:
                report.trials += await echo_call(
                    http, url, delay_ms, gain_db, replies=replies, barge_ins=barge_ins
                )
                print(
                    f"  {delay_ms} ms, {gain_db:g} dB: "
                    + json.dumps(
                        EchoReport(
                            echo_cancellation, report.trials[-replies - barge_ins :]
                        ).summary()
                    ),
                    file=sys.stderr,
                )
            elapsed = time.monotonic() - began
            report.server_cpu_ms_per_call_s = round(
                (_process_cpu_s(pid) - cpu_before) * 1000 / elapsed, 1
            )
    report.load_average = os.getloadavg()
    return report


def format_summary(report: EchoReport) -> str:
    """The human summary."""
    s = report.summary()
    lines = [
        f"echo cancellation {report.echo_cancellation}; conditions (delay ms, gain dB): "
        + ", ".join(f"({d}, {g:g})" for d, g in CONDITIONS),
        f"self-interruptions: {s['self_interruptions']} of {s['echo_replies']} echoed replies",
        f"barge-ins heard: {s['barge_ins_heard']} of {s['barge_ins']} "
        f"(cut short by the echo first: {s['barge_ins_preempted_by_echo']}); detection "
        f"p50 {s['detected_p50_ms']} ms, p95 {s['detected_p95_ms']} ms, "
        f"max {s['detected_max_ms']} ms",
        f"AEC CPU per call-second: {report.aec_cpu_ms_per_call_s.get('talking')} ms while "
        f"the reply plays, {report.aec_cpu_ms_per_call_s.get('idle')} ms while idle (24 kHz)",
        f"server CPU per call-second: {report.server_cpu_ms_per_call_s} ms; load average "
        + " ".join(f"{x:.2f}" for x in report.load_average),
    ]
    return "\n".join(lines)


DESCRIPTION = (
    "Calls a server of the bench's own (fake LLM and ASR, Piper's voice, Silero VAD) over "
    "WebRTC with a microphone that hears the reply again through a simulated room, "
    "and counts self-interruptions and how fast a real barge-in over the echo is heard."
)


OPTIONS: tuple[BenchOption | str, ...] = (
    BenchOption("echo_cancellation", "the server's setting", str, "on", choices=("on", "off")),
    BenchOption("replies", "echo trials per condition (default 5: 20 in all)", int, 5),
    BenchOption("barge_ins", "barge-in trials per condition (default 5)", int, 5),
    "json",
)


@dataclass(frozen=True)
class EchoBenchConfig:
    """What ``hark bench echo`` runs: its options."""

    echo_cancellation: str
    replies: int
    barge_ins: int


def run(config: EchoBenchConfig) -> Result:
    """Start the bench's server and run the trials; the report and its summary."""
    report = asyncio.run(run_echo_bench(**arguments(config), server_args=[]))
    return Result(report.to_json(), format_summary(report))


BENCH = Bench(
    "echo", OPTIONS, functools.partial(config_from, EchoBenchConfig), run, description=DESCRIPTION
)
configure_parser, command = BENCH.configure_parser, BENCH.command

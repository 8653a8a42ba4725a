"""``hark bench webrtc``: how fast a WebRTC call is set up, and how many calls a core carries.

Each call is a real aiortc peer that calls the server as a browser does: a microphone
track, an ``oai-events`` data channel, an SDP offer posted to ``/v1/realtime/calls``.

**Setup** (``--calls N`` calls, one after another): on the client's clock, from the POST
to the SDP answer, to the data channel being open, to ``session.created``, and to the first
non-silent frame of reply audio after a ``response.create`` sent as soon as the channel
opened. The last includes the client's own jitter buffer (aiortc holds about four frames,
80 ms, before decoding). Run it against ``--engines fake`` to time the transport rather
than the models.

**Capacity** (``--capacity``): calls are added ``--step`` at a time. Every call keeps its
microphone streaming and asks for a reply every few seconds, so the server runs the VAD on
every call and plays audio on most. After each step the received audio is watched for
``--hold`` seconds: a frame's *lateness* is how much later it arrived than the on-time
schedule its RTP timestamp sets (the earliest frame of the window defines on time). The
ramp stops at the first step whose p99 lateness exceeds ``--threshold-ms`` in two windows
in a row; the figure is the last step within it. With ``--server-pid`` each step also
reports the server's CPU use. Pin the server to one core (``taskset -c 0 hark serve --engines
fake``) and the bench to others, or the bench competes with what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from hark.bench.report import (
    BenchError,
    ServerUrl,
    add_api_key_option,
    add_json_option,
    api_key,
    cpu_seconds,
    percentile,
    publish,
)
from hark.cluster.forwarding import WORKER_HEADER
from hark.transports.webrtc.input_audio import frame_to_mono
from hark.transports.webrtc.playout import PLAYOUT_RATE, PlayoutTrack

logger = logging.getLogger(__name__)

CALLS_PATH = "/v1/realtime/calls"
# A frame is audio rather than silence above this RMS (int16); Opus leaves silence near 0.
AUDIBLE_RMS = 200.0
DEFAULT_THRESHOLD_MS = 20.0
# Capacity calls ask for a reply this often (a fake reply plays for about 2.4 s).
_ASK_EVERY_S = 4.0


@dataclass
class ReceivedFrame:
    """One frame of the server's audio as the client got it."""

    arrival: float
    pts: int
    rms: float
    pcm: npt.NDArray[np.int16] | None = None


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
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = self.pc.localDescription.sdp
        params = {"model": model} if model else None
        headers = {"Authorization": f"Bearer {api_key}"}
        body: aiohttp.FormData | str
        if session is None:
            body = offer
            headers["Content-Type"] = "application/sdp"
        else:
            body = aiohttp.FormData()
            body.add_field("sdp", offer)
            body.add_field("session", json.dumps(session), content_type="application/json")
        started = self.posted_at = time.monotonic()
        async with http.post(url + path, data=body, headers=headers, params=params) as response:
            text = await response.text()
            if response.status != 201:
                raise BenchError(f"POST {path}: {response.status} {text[:300]}")
            location = response.headers.get("Location", "")
            self.worker = response.headers.get(WORKER_HEADER)
        elapsed = time.monotonic() - started
        self.call_id = location.rsplit("/", 1)[-1]
        self.answer = text
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=text, type="answer"))
        return elapsed

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
            rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0
            if rms > AUDIBLE_RMS and self.first_audio_at is None:
                self.first_audio_at = now
                self.first_audio.set()
            self.frames.append(
                ReceivedFrame(now, int(frame.pts or 0), rms, pcm if self.keep_audio else None)
            )


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
    # The server's CPU use over the window, in cores (with --server-pid), else None.
    server_cpu: float | None = None


async def _keep_talking(client: CallClient) -> None:
    """Ask for a reply every few seconds, like a conversation that never ends."""
    await client.opened.wait()
    while True:
        client.send({"type": "response.create"})
        await asyncio.sleep(_ASK_EVERY_S)


def _lateness_ms(frames: Sequence[ReceivedFrame]) -> list[float]:
    """Each frame's delay behind the on-time schedule its RTP timestamps define."""
    if not frames:
        return []
    offsets = [f.arrival - f.pts / PLAYOUT_RATE for f in frames]
    best = min(offsets)
    return [(o - best) * 1000 for o in offsets]


def _percentile(values: Sequence[float], q: float) -> float:
    # NaN rather than None: the window's figures stay floats, printed and written as NaN.
    return percentile(values, q) if values else math.nan


async def measure_capacity(
    http: aiohttp.ClientSession,
    url: str,
    api_key: str,
    *,
    step: int,
    max_calls: int,
    hold_s: float,
    threshold_ms: float,
    server_pid: int | None = None,
    progress: bool = True,
) -> tuple[list[CapacityStep], int]:
    """Ramp up calls until audio runs late; returns the steps and the calls carried.

    With ``server_pid`` (a server on this machine) each step also reports its CPU use.
    """
    clients: list[CallClient] = []
    talkers: list[asyncio.Task[None]] = []
    steps: list[CapacityStep] = []
    carried = 0
    try:
        while len(clients) < max_calls:
            failures = 0
            batch = [CallClient() for _ in range(min(step, max_calls - len(clients)))]
            outcomes = await asyncio.gather(
                *(c.connect(http, url, api_key=api_key) for c in batch), return_exceptions=True
            )
            for client, outcome in zip(batch, outcomes, strict=True):
                if not isinstance(outcome, BaseException):
                    try:
                        # Connected means the server's audio is flowing.
                        async with asyncio.timeout(10):
                            await client.opened.wait()
                            await client.receiving.wait()
                    except TimeoutError:
                        outcome = TimeoutError()
                if isinstance(outcome, BaseException):
                    failures += 1
                    await client.close()
                    continue
                clients.append(client)
                talkers.append(asyncio.create_task(_keep_talking(client)))
            await asyncio.sleep(0.5)
            result = await _watch(clients, hold_s, server_pid, failures)
            if progress:
                _print_step(result)
            if not failures and not result.p99_lateness_ms <= threshold_ms:
                # One late window may be a neighbour's burst on a shared machine: a step
                # fails only when a second window is late too.
                result = await _watch(clients, hold_s, server_pid, failures)
                if progress:
                    _print_step(result, again=True)
            steps.append(result)
            if failures or not result.p99_lateness_ms <= threshold_ms:
                break
            carried = result.calls
    finally:
        for task in talkers:
            task.cancel()
        await asyncio.gather(*talkers, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return steps, carried


async def _watch(
    clients: list[CallClient], hold_s: float, server_pid: int | None, failures: int
) -> CapacityStep:
    """Watch the audio of every call for ``hold_s`` seconds."""
    for client in clients:
        client.frames.clear()
    cpu_before = _cpu_seconds(server_pid)
    window_start = time.monotonic()
    await asyncio.sleep(hold_s)
    cpu_after = _cpu_seconds(server_pid)
    elapsed = time.monotonic() - window_start
    lateness: list[float] = []
    gaps: list[float] = []
    frames = 0
    for client in clients:
        window = [f for f in client.frames if f.arrival >= window_start]
        client.frames.clear()
        frames += len(window)
        lateness += _lateness_ms(window)
        gaps += [(b.arrival - a.arrival) * 1000 for a, b in itertools.pairwise(window)]
    return CapacityStep(
        calls=len(clients),
        frames=frames,
        p50_lateness_ms=_percentile(lateness, 50),
        p99_lateness_ms=_percentile(lateness, 99),
        max_lateness_ms=max(lateness, default=math.nan),
        interarrival_p99_ms=_percentile(gaps, 99),
        setup_failures=failures,
        server_cpu=None
        if cpu_before is None or cpu_after is None
        else (cpu_after - cpu_before) / elapsed,
    )


def _print_step(result: CapacityStep, *, again: bool = False) -> None:
    print(
        f"{result.calls:4d} calls{' (again)' if again else ''}: lateness p50 "
        f"{result.p50_lateness_ms:6.1f} ms, p99 {result.p99_lateness_ms:6.1f} ms, max "
        f"{result.max_lateness_ms:6.1f} ms; frame gap p99 {result.interarrival_p99_ms:5.1f} ms"
        + (f"; server CPU {result.server_cpu:.2f} cores" if result.server_cpu is not None else "")
        + (f"; {result.setup_failures} failed to set up" if result.setup_failures else ""),
        flush=True,
    )


def _cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) a local process has used so far, or None."""
    if pid is None:
        return None
    try:
        return cpu_seconds(pid)
    except OSError:
        return None


# ---------------------------------------------------------------------- report


@dataclass
class WebRtcReport:
    """Everything one run measured."""

    url: str
    setup: list[SetupResult] = field(default_factory=list)
    capacity: list[CapacityStep] = field(default_factory=list)
    capacity_calls: int | None = None
    threshold_ms: float = DEFAULT_THRESHOLD_MS

    def setup_summary(self) -> dict[str, dict[str, float]]:
        """p50/p90/p99 of each setup step over the calls that got that far."""
        summary = {}
        for name in ("answer_ms", "channel_open_ms", "session_created_ms", "first_audio_ms"):
            values = [getattr(r, name) for r in self.setup if getattr(r, name) is not None]
            summary[name] = {
                "p50": _percentile(values, 50),
                "p90": _percentile(values, 90),
                "p99": _percentile(values, 99),
                "count": float(len(values)),
            }
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
                "steps": [asdict(s) for s in self.capacity],
            },
        }


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
    return "\n".join(lines)


async def run_webrtc_bench(
    url: str,
    *,
    api_key: str,
    calls: int,
    capacity: bool,
    step: int = 5,
    max_calls: int = 500,
    hold_s: float = 5.0,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    server_pid: int | None = None,
) -> WebRtcReport:
    """Run the setup measurement, then the capacity ramp if asked."""
    report = WebRtcReport(url=ServerUrl.parse(url).http(), threshold_ms=threshold_ms)
    async with aiohttp.ClientSession() as http:
        for _ in range(calls):
            report.setup.append(await measure_setup(http, report.url, api_key))
        if capacity:
            report.capacity, report.capacity_calls = await measure_capacity(
                http,
                report.url,
                api_key,
                step=step,
                max_calls=max_calls,
                hold_s=hold_s,
                threshold_ms=threshold_ms,
                server_pid=server_pid,
            )
    return report


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add ``hark bench webrtc``'s options to ``parser``."""
    parser.add_argument(
        "--url", required=True, help="the server's HTTP root, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument(
        "--calls", type=int, default=20, help="calls to time, one after another (default 20)"
    )
    add_api_key_option(parser)
    parser.add_argument("--capacity", action="store_true", help="also ramp up simultaneous calls")
    parser.add_argument("--step", type=int, default=5, help="calls added per step (default 5)")
    parser.add_argument(
        "--max-calls", type=int, default=500, help="stop the ramp here (default 500)"
    )
    parser.add_argument(
        "--hold", type=float, default=5.0, help="seconds watched per step (default 5)"
    )
    parser.add_argument(
        "--threshold-ms",
        type=float,
        default=DEFAULT_THRESHOLD_MS,
        help="p99 frame lateness that ends the ramp (default 20)",
    )
    parser.add_argument(
        "--server-pid",
        type=int,
        default=None,
        metavar="PID",
        help="a local server's process id: report its CPU use per capacity step",
    )
    add_json_option(parser)


def command(options: dict[str, Any]) -> int:
    """Run ``hark bench webrtc`` with parsed ``options``; returns the exit status."""
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    # aiortc leaves tasks failing noisily when many client peers close at once.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    try:
        report = asyncio.run(
            run_webrtc_bench(
                options["url"],
                api_key=api_key(options["api_key"]),
                calls=options["calls"],
                capacity=options["capacity"],
                step=options["step"],
                max_calls=options["max_calls"],
                hold_s=options["hold"],
                threshold_ms=options["threshold_ms"],
                server_pid=options["server_pid"],
            )
        )
    except BenchError as error:
        print(f"hark bench webrtc: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    publish(format_summary(report), report.to_json(), options["json"])
    failed = any(r.error is not None for r in report.setup)
    return 1 if failed else 0

"""``hark bench load``: many callers at once, each talking in real time like a person.

Every simulated caller opens a Realtime session over WebSocket with server VAD, then streams
its microphone in real time (``--chunk-ms`` chunks, quiet noise between words): it thinks,
asks a spoken question, listens to the reply and pauses, over and over. Callers start
evenly over ``--ramp`` and all hang up ``--duration`` after the ramp; a caller whose call
reaches ``--call-duration`` (±50 %) hangs up and dials again, as phone callers do, so a
long run (``--duration 30m``) is also a soak test.

Measured on the client's clock:

- **VAD decision lag**: from sending the chunk that holds the audio at a
  ``speech_stopped``'s ``audio_end_ms`` to receiving that ``speech_stopped``: how long the
  server took to decide, once it had the audio it decided on (the VAD hears 32 ms chunks cut
  straight from the input, so nothing is held back before it).
- **E2A**: ``speech_stopped`` received → first reply audio received. **V2V**: the chunk
  with the question's last voiced sample sent → first reply audio received.
- **Failures**: calls that could not connect, were closed by the server, got an ``error``
  event or a failed response; **missed turns**: questions without a ``speech_stopped``.
- **Send lag**: how late the generator itself sent chunks; when it is large the generator,
  not the server, was the bottleneck.

The server's own figures come from its ``/metrics`` every ``--sample`` seconds: sessions,
event-loop lag, VAD batches, late and dropped audio, errors, and each process's memory and
open file descriptors, which should stay flat. The report is JSON (``--json``), a summary
and a chart over time (``--chart``, needs matplotlib). The command only talks to ``--url``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import random
import re
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import numpy as np
import numpy.typing as npt

from hark import __version__
from hark.bench.spoken_questions import RATE, SpokenQuestion, spoken_questions
from hark.eventloop import run_event_loop

TRANSPORTS = ("ws",)
# Quiet room noise between words (about -60 dBFS), so the VAD hears a live microphone.
NOISE_LEVEL = 30.0
_NOISE_VARIANTS = 16
# Callers are spread over this many send phases within a chunk, as unsynchronised people are.
_PHASES = 20
# Send times kept per call: enough for any decision to refer back to.
_RING = 4096
_AUDIO_DELTA = "response.output_audio.delta"


class LoadBenchError(Exception):
    """The benchmark cannot run (bad options, no speech fixtures, chart impossible)."""


@dataclass(frozen=True)
class LoadConfig:
    """What ``hark bench load`` does; times in seconds unless named otherwise."""

    url: str
    sessions: int
    ramp_s: float = 10.0
    duration_s: float = 60.0
    transport: str = "ws"
    chunk_ms: int = 20
    call_s: float = 180.0
    silence_ms: int = 500
    think_s: tuple[float, float] = (0.5, 2.0)
    pause_s: tuple[float, float] = (3.0, 6.0)
    api_key: str = "local"
    model: str = "gpt-realtime"
    sample_s: float = 5.0
    seed: int = 0
    connect_timeout_s: float = 15.0
    cache_dir: Path | None = None

    def parameters(self) -> dict[str, Any]:
        """The run's parameters as JSON (without the API key)."""
        return {
            "url": self.url,
            "sessions": self.sessions,
            "ramp_s": self.ramp_s,
            "duration_s": self.duration_s,
            "transport": self.transport,
            "chunk_ms": self.chunk_ms,
            "call_s": self.call_s,
            "silence_ms": self.silence_ms,
            "think_s": list(self.think_s),
            "pause_s": list(self.pause_s),
            "model": self.model,
            "sample_s": self.sample_s,
            "seed": self.seed,
        }


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``3m``, ``1h`` or ``1h30m``."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a duration: {text!r} (try 90s, 3m or 1h)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(number) * scale[unit] for number, unit in parts)


def server_urls(url: str, model: str) -> tuple[str, str]:
    """The Realtime WebSocket URL and the ``/metrics`` URL of a server at ``url``.

    ``url`` is the server's root in any of ``ws://``, ``wss://``, ``http://``, ``https://``,
    with or without ``/v1``.
    """
    parts = urlsplit(url)
    secure = {"ws": False, "http": False, "wss": True, "https": True}.get(parts.scheme)
    if secure is None or not parts.netloc:
        raise LoadBenchError(f"--url must look like ws://HOST:PORT, got {url!r}")
    root = parts.path.rstrip("/")
    root = root.removesuffix("/v1")
    ws = urlunsplit(("wss" if secure else "ws", parts.netloc, f"{root}/v1/realtime", "", ""))
    metrics = urlunsplit(("https" if secure else "http", parts.netloc, f"{root}/metrics", "", ""))
    return f"{ws}?model={model}", metrics


# ---------------------------------------------------------------------------- audio frames


@dataclass
class _Question:
    text: str
    frames: list[str]
    # Index (within ``frames``) of the chunk holding the last voiced sample.
    last_voiced_chunk: int


@dataclass
class _Script:
    """The pre-encoded ``input_audio_buffer.append`` events every caller draws from."""

    chunk_ms: int
    questions: list[_Question]
    silence: list[str]


def _append_event(pcm: npt.NDArray[np.int16]) -> str:
    audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
    return f'{{"type":"input_audio_buffer.append","audio":"{audio}"}}'


def build_script(questions: Sequence[SpokenQuestion], chunk_ms: int, seed: int = 0) -> _Script:
    """Questions and quiet noise cut into ``chunk_ms`` chunks, each already a JSON event.

    Encoding once keeps the generator's own cost per chunk to a send.
    """
    size = RATE * chunk_ms // 1000
    rng = np.random.default_rng(seed)
    silence = [
        _append_event((NOISE_LEVEL * rng.standard_normal(size)).astype(np.int16))
        for _ in range(_NOISE_VARIANTS)
    ]
    cut = []
    for question in questions:
        count = -(-len(question.pcm) // size)
        padded = np.zeros(count * size, dtype=np.int16)
        padded[: len(question.pcm)] = question.pcm
        padded += (NOISE_LEVEL * rng.standard_normal(len(padded))).astype(np.int16)
        frames = [_append_event(padded[i * size : (i + 1) * size]) for i in range(count)]
        cut.append(_Question(question.text, frames, max(0, question.last_voiced) // size))
    return _Script(chunk_ms, cut, silence)


# ---------------------------------------------------------------------------- results


@dataclass
class Results:
    """Everything the callers saw, gathered as they run (times in ms)."""

    calls_started: int = 0
    calls_completed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    responses: Counter[str] = field(default_factory=Counter)
    questions: int = 0
    turns_expected: int = 0
    turns_detected: int = 0
    missed_turns: int = 0
    # (seconds since the start, ms): the timeline needs to know when.
    vad_lag: list[tuple[float, float]] = field(default_factory=list)
    e2a: list[tuple[float, float]] = field(default_factory=list)
    v2v: list[float] = field(default_factory=list)
    server_e2a: list[float] = field(default_factory=list)
    server_v2v: list[float] = field(default_factory=list)
    active: int = 0
    send_lag_max: float = 0.0
    # Send lateness in whole ms (the last bin holds everything from 1 s up).
    send_lag_hist: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(1001, dtype=np.int64)
    )

    def record_send_lag(self, ms: float) -> None:
        """One chunk left ``ms`` after its schedule."""
        self.send_lag_hist[min(1000, int(ms))] += 1
        self.send_lag_max = max(self.send_lag_max, ms)


class _Call:
    """One simulated phone call: a Realtime session with a person talking into it."""

    def __init__(
        self,
        bench: _Bench,
        ws: aiohttp.ClientWebSocketResponse,
        rng: random.Random,
        hangup_at: float,
        phase: int,
    ) -> None:
        self.bench = bench
        self.ws = ws
        self.rng = rng
        self.hangup_at = hangup_at
        self.phase = phase
        self.failed: str | None = None
        self.closed = asyncio.Event()
        self.sent = np.zeros(_RING)
        self.count = 0
        self.expected = 0
        self.detected = 0
        self._frames: deque[str] = deque()
        self._asks_next = False
        self._voiced_chunk: int | None = None
        self._expect_at: int | None = None
        self._stopped_at: float | None = None
        # A question counts as expected once this much silence followed its last word.
        self._settle = self._chunks(bench.config.silence_ms / 1000 + 1.0)
        self._think()

    # -- the person

    def _chunks(self, seconds: float) -> int:
        return max(1, round(seconds * 1000 / self.bench.script.chunk_ms))

    def _silence(self, seconds: float) -> list[str]:
        variants = self.bench.script.silence
        return [variants[self.rng.randrange(len(variants))] for _ in range(self._chunks(seconds))]

    def _think(self) -> None:
        self._frames.extend(self._silence(self.rng.uniform(*self.bench.config.think_s)))
        self._asks_next = True

    def _ask(self) -> None:
        question = self.rng.choice(self.bench.script.questions)
        self._voiced_chunk = self.count + question.last_voiced_chunk
        self._expect_at = self._voiced_chunk + self._settle
        self._frames.extend(question.frames)
        self._frames.extend(self._silence(self.rng.uniform(*self.bench.config.pause_s)))
        self._asks_next = False
        self.bench.results.questions += 1

    def next_frame(self) -> str:
        """The next chunk to send: a word of the question, or the quiet around it."""
        if not self._frames:
            if self._asks_next:
                self._ask()
            else:
                self._think()
        return self._frames.popleft()

    def sent_chunk(self, at: float) -> None:
        """The chunk from ``next_frame`` left at ``at`` (monotonic seconds)."""
        self.sent[self.count % _RING] = at
        self.count += 1
        if self._expect_at is not None and self.count >= self._expect_at:
            self._expect_at = None
            self.expected += 1

    def _sent_at(self, chunk: int) -> float | None:
        if chunk < 0 or chunk >= self.count or chunk < self.count - _RING:
            return None
        return float(self.sent[chunk % _RING])

    # -- the server

    def received(self, text: str, at: float) -> None:
        """One server event, received at ``at``."""
        if _AUDIO_DELTA in text[:120]:
            if self._stopped_at is not None:
                self._first_audio(at)
            return
        try:
            event = json.loads(text)
        except ValueError:
            self.fail("bad_json")
            return
        kind = event.get("type")
        results = self.bench.results
        if kind == "input_audio_buffer.speech_stopped":
            self.detected += 1
            self._stopped_at = at
            end_ms = event.get("audio_end_ms")
            if isinstance(end_ms, int | float):
                sent = self._sent_at(math.ceil(end_ms / self.bench.script.chunk_ms) - 1)
                if sent is not None:
                    results.vad_lag.append((at - self.bench.started, (at - sent) * 1000))
        elif kind == "response.done":
            status = str(event.get("response", {}).get("status", "unknown"))
            results.responses[status] += 1
            if status == "failed":
                self.fail("response_failed")
        elif kind == "hark.turn_timings":
            for key, values in (("e2a_ms", results.server_e2a), ("v2v_ms", results.server_v2v)):
                value = event.get(key)
                if isinstance(value, int | float):
                    values.append(float(value))
        elif kind == "error":
            code = str(event.get("error", {}).get("code") or "none")
            results.errors[code] += 1
            self.fail(f"error:{code}")

    def _first_audio(self, at: float) -> None:
        assert self._stopped_at is not None
        results = self.bench.results
        results.e2a.append((at - self.bench.started, (at - self._stopped_at) * 1000))
        if self._voiced_chunk is not None:
            sent = self._sent_at(self._voiced_chunk)
            if sent is not None:
                results.v2v.append((at - sent) * 1000)
        self._stopped_at = None

    def fail(self, reason: str) -> None:
        """Mark the call failed; the first reason is the one reported."""
        if self.failed is None:
            self.failed = reason

    def finish(self) -> None:
        """Add this call's outcome to the results."""
        results = self.bench.results
        results.turns_expected += self.expected
        results.turns_detected += self.detected
        results.missed_turns += max(0, self.expected - self.detected)
        if self.failed is None:
            results.calls_completed += 1
        else:
            results.failures[self.failed] += 1


@dataclass
class _Sample:
    """One reading of the server's ``/metrics``: the flat samples, or why there are none."""

    t: float
    values: dict[str, float] | None
    error: str | None = None


class _Bench:
    def __init__(self, config: LoadConfig, script: _Script, progress: bool) -> None:
        self.config = config
        self.script = script
        self.progress = progress
        self.results = Results()
        self.ws_url, self.metrics_url = server_urls(config.url, config.model)
        self.started = time.monotonic()
        self.end = self.started + config.ramp_s + config.duration_s
        self.phases: list[set[_Call]] = [set() for _ in range(_PHASES)]
        self.samples: list[_Sample] = []
        self.timeline: list[dict[str, Any]] = []
        self._marks = (0, 0)

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            self.started = time.monotonic()
            self.end = self.started + self.config.ramp_s + self.config.duration_s
            await self._sample(http)
            background = [
                asyncio.create_task(self._ticker(phase), name=f"phase-{phase}")
                for phase in range(_PHASES)
            ]
            background.append(asyncio.create_task(self._sampler(http), name="sampler"))
            callers = [
                asyncio.create_task(self._caller(http, index), name=f"caller-{index}")
                for index in range(self.config.sessions)
            ]
            try:
                await asyncio.gather(*callers)
            finally:
                for task in (*callers, *background):
                    task.cancel()
                await asyncio.gather(*callers, *background, return_exceptions=True)
            await self._sample(http)

    async def _ticker(self, phase: int) -> None:
        """Send the next chunk of every call in this phase, once per chunk, on time."""
        loop = asyncio.get_running_loop()
        period = self.script.chunk_ms / 1000
        due = loop.time() + period * phase / _PHASES
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            lateness_ms = max(0.0, loop.time() - due) * 1000
            for call in list(self.phases[phase]):
                try:
                    await call.ws.send_str(call.next_frame())
                except (ConnectionError, RuntimeError):
                    call.fail("send_failed")
                    call.closed.set()
                    self.phases[phase].discard(call)
                    continue
                call.sent_chunk(time.monotonic())
                self.results.record_send_lag(lateness_ms)
            due += period
            if loop.time() - due > period:
                # More than a chunk behind: skip ahead, as a live microphone loses (rather
                # than bursts) the time; the lateness above already says so.
                due = loop.time()

    async def _caller(self, http: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(self.config.seed * 1_000_003 + index)
        await asyncio.sleep(self.config.ramp_s * index / self.config.sessions)
        # A call shorter than a question and its reply measures nothing: don't start one.
        while self.end - time.monotonic() > 5.0:
            length = self.config.call_s * rng.uniform(0.5, 1.5)
            hangup = min(self.end, time.monotonic() + length)
            await self._call(http, rng, hangup, phase=rng.randrange(_PHASES))

    async def _call(
        self, http: aiohttp.ClientSession, rng: random.Random, hangup: float, phase: int
    ) -> None:
        results = self.results
        results.calls_started += 1
        headers = {"Authorization": f"Bearer {self.config.api_key}"}
        try:
            ws = await http.ws_connect(self.ws_url, headers=headers, max_msg_size=0)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            results.failures[f"connect:{type(exc).__name__}"] += 1
            # Not a tight loop against a server that refuses.
            await asyncio.sleep(1.0)
            return
        call = _Call(self, ws, rng, hangup, phase)
        results.active += 1
        try:
            await self._converse(call)
        finally:
            results.active -= 1
            self.phases[phase].discard(call)
            await ws.close()
            call.finish()

    async def _converse(self, call: _Call) -> None:
        try:
            first = await call.ws.receive(timeout=self.config.connect_timeout_s)
        except TimeoutError:
            call.fail("no_session_created")
            return
        if first.type is not aiohttp.WSMsgType.TEXT or '"session.created"' not in first.data:
            call.fail("no_session_created")
            return
        await call.ws.send_str(json.dumps(self._session_update()))
        reader = asyncio.create_task(self._read(call))
        self.phases[call.phase].add(call)
        try:
            remaining = max(0.0, call.hangup_at - time.monotonic())
            await asyncio.wait_for(call.closed.wait(), remaining)
            call.fail("closed_by_server")
        except TimeoutError:
            pass  # hung up on schedule
        finally:
            self.phases[call.phase].discard(call)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, call: _Call) -> None:
        try:
            async for message in call.ws:
                if message.type is aiohttp.WSMsgType.TEXT:
                    call.received(message.data, time.monotonic())
                elif message.type is aiohttp.WSMsgType.ERROR:
                    call.fail("websocket_error")
                    break
        finally:
            call.closed.set()

    def _session_update(self) -> dict[str, Any]:
        return {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["audio"],
                "include": ["hark.turn_timings"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": RATE},
                        "turn_detection": {
                            "type": "server_vad",
                            "silence_duration_ms": self.config.silence_ms,
                            "create_response": True,
                            "interrupt_response": True,
                        },
                    }
                },
            },
        }

    # -- the server's own figures, and the timeline

    async def _sampler(self, http: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.config.sample_s)
            await self._sample(http)

    async def _sample(self, http: aiohttp.ClientSession) -> None:
        t = time.monotonic() - self.started
        headers = {"Authorization": f"Bearer {self.config.api_key}"}
        try:
            async with http.get(
                self.metrics_url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
            ) as response:
                if response.status != 200:
                    sample = _Sample(t, None, f"HTTP {response.status}")
                else:
                    sample = _Sample(t, parse_metrics(await response.text()))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            sample = _Sample(t, None, type(exc).__name__)
        previous = next((s for s in reversed(self.samples) if s.values is not None), None)
        self.samples.append(sample)
        self._add_to_timeline(sample, previous)

    def _add_to_timeline(self, sample: _Sample, previous: _Sample | None) -> None:
        results = self.results
        lag_mark, e2a_mark = self._marks
        lags = [lag for _, lag in results.vad_lag[lag_mark:]]
        e2as = [e2a for _, e2a in results.e2a[e2a_mark:]]
        self._marks = (len(results.vad_lag), len(results.e2a))
        point: dict[str, Any] = {
            "t_s": round(sample.t, 1),
            "calls": results.active,
            "decisions": len(lags),
            "vad_lag_p50_ms": _rounded(_percentile(lags, 50)),
            "vad_lag_p99_ms": _rounded(_percentile(lags, 99)),
            "e2a_p50_ms": _rounded(_percentile(e2as, 50)),
            "e2a_p99_ms": _rounded(_percentile(e2as, 99)),
        }
        if sample.values is not None:
            point.update(server_figures(sample.values, previous.values if previous else None))
        else:
            point["server_error"] = sample.error
        self.timeline.append(point)
        if self.progress:
            print(_progress_line(point), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- /metrics


def parse_metrics(text: str) -> dict[str, float]:
    """A Prometheus text exposition as ``{'name{label="v",…}': value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    flat: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            flat[_key(sample.name, sample.labels)] = float(sample.value)
    return flat


def _key(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _matching(values: Mapping[str, float], name: str, **labels: str) -> Iterable[float]:
    """Values of every series of ``name`` whose labels include ``labels``."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    for key, value in values.items():
        base, _, rest = key.partition("{")
        if base == name and all(w in rest for w in wanted):
            yield value


def _total(values: Mapping[str, float], name: str, **labels: str) -> float:
    return sum(_matching(values, name, **labels))


def histogram_quantile(
    q: float,
    now: Mapping[str, float],
    before: Mapping[str, float] | None,
    name: str,
    **labels: str,
) -> float | None:
    """The ``q`` quantile (0–1) of a histogram's observations between two scrapes.

    Interpolates linearly within the bucket, as Prometheus's ``histogram_quantile`` does;
    None without observations. Series of several processes are added up.
    """
    buckets: dict[float, float] = {}
    for key, value in now.items():
        base, _, rest = key.partition("{")
        if base != f"{name}_bucket" or not all(f'{k}="{v}"' in rest for k, v in labels.items()):
            continue
        found = re.search(r'le="([^"]+)"', rest)
        if found is None:
            continue
        earlier = before.get(key, 0.0) if before else 0.0
        bound = float(found.group(1))
        buckets[bound] = buckets.get(bound, 0.0) + value - earlier
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def server_figures(now: Mapping[str, float], before: Mapping[str, float] | None) -> dict[str, Any]:
    """The server's figures in one scrape (and, with ``before``, over the time between)."""
    rss = list(_matching(now, "hark_process_resident_memory_bytes"))
    fds = list(_matching(now, "hark_process_open_fds"))
    lag_max = list(_matching(now, "hark_event_loop_lag_max_seconds"))
    figures: dict[str, Any] = {
        "server_sessions": int(_total(now, "hark_sessions_active")),
        "rss_mib": round(sum(rss) / 2**20, 1) if rss else None,
        "open_fds": int(sum(fds)) if fds else None,
        "processes": len(rss),
        "loop_lag_max_ms": round(max(lag_max) * 1000, 1) if lag_max else None,
        "vad_chunks": int(_total(now, "hark_vad_chunks_total")),
        "vad_chunks_late": int(_total(now, "hark_vad_chunks_late_total")),
        "audio_dropped": int(_total(now, "hark_audio_chunks_dropped_total")),
        "audio_late": int(_total(now, "hark_audio_chunks_late_total")),
        "errors": int(_total(now, "hark_errors_total")),
    }
    if before is not None:
        batches = _total(now, "hark_batcher_batch_size_count") - _total(
            before, "hark_batcher_batch_size_count"
        )
        rows = _total(now, "hark_batcher_batch_size_sum") - _total(
            before, "hark_batcher_batch_size_sum"
        )
        figures["batch_mean"] = round(rows / batches, 1) if batches > 0 else None
        wait = histogram_quantile(0.99, now, before, "hark_batcher_wait_seconds")
        figures["batch_wait_p99_ms"] = _rounded(None if wait is None else wait * 1000)
        loop = histogram_quantile(0.99, now, before, "hark_event_loop_lag_seconds")
        figures["loop_lag_p99_ms"] = _rounded(None if loop is None else loop * 1000)
    return figures


# ---------------------------------------------------------------------------- report


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _distribution(values: Sequence[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        "p50": _rounded(_percentile(values, 50)),
        "p95": _rounded(_percentile(values, 95)),
        "p99": _rounded(_percentile(values, 99)),
        "max": _rounded(max(values) if values else None),
    }


def _quantile_ms(
    q: int, now: Mapping[str, float], before: Mapping[str, float], name: str, decision: str
) -> float | None:
    seconds = histogram_quantile(q / 100, now, before, name, decision=decision)
    return None if seconds is None else round(seconds * 1000, 1)


def _histogram_percentile(hist: npt.NDArray[np.int64], q: float) -> float | None:
    total = int(hist.sum())
    if total == 0:
        return None
    return float(np.searchsorted(np.cumsum(hist), q / 100 * total))


def _progress_line(point: Mapping[str, Any]) -> str:
    parts = [f"t={point['t_s']:>6.0f}s", f"calls={point['calls']}"]
    if point.get("vad_lag_p99_ms") is not None:
        parts.append(f"vad lag p50/p99={point['vad_lag_p50_ms']}/{point['vad_lag_p99_ms']} ms")
    for key, label in (
        ("server_sessions", "server sessions"),
        ("loop_lag_max_ms", "loop lag max ms"),
        ("batch_mean", "batch"),
        ("rss_mib", "RSS MiB"),
        ("open_fds", "fds"),
    ):
        if point.get(key) is not None:
            parts.append(f"{label}={point[key]}")
    if point.get("server_error"):
        parts.append(f"/metrics: {point['server_error']}")
    return "  ".join(parts)


def build_report(bench: _Bench) -> dict[str, Any]:
    """The run as JSON: parameters, client figures, server figures, the timeline."""
    results = bench.results
    good = [s for s in bench.samples if s.values is not None]
    server: dict[str, Any] = {"scrapes": len(good), "url": bench.metrics_url}
    if good:
        first, last = good[0].values, good[-1].values
        assert first is not None and last is not None
        server["end"] = server_figures(last, first)
        for decision in ("speech_stopped", "speech_started"):
            server[f"vad_decision_lag_{decision}_ms"] = {
                f"p{q}": _quantile_ms(q, last, first, "hark_vad_decision_lag_seconds", decision)
                for q in (50, 95, 99)
            }
        steady = [p for p in bench.timeline if p["t_s"] >= bench.config.ramp_s]
        for key in ("rss_mib", "open_fds"):
            series = [p[key] for p in steady if p.get(key) is not None]
            if series:
                # Memory settles while the first calls fill up; a leak shows as growth over
                # the second half.
                server[f"{key}_steady"] = {
                    "first": series[0],
                    "mid": series[len(series) // 2],
                    "last": series[-1],
                    "min": min(series),
                    "max": max(series),
                }
    elif bench.samples:
        server["error"] = bench.samples[-1].error
    failed_calls = sum(results.failures.values())
    return {
        "benchmark": "load",
        "hark_version": __version__,
        "parameters": bench.config.parameters(),
        "client": {
            "calls_started": results.calls_started,
            "calls_completed": results.calls_completed,
            "calls_failed": failed_calls,
            "failures": dict(results.failures),
            "errors": dict(results.errors),
            "questions": results.questions,
            "turns_expected": results.turns_expected,
            "turns_detected": results.turns_detected,
            "missed_turns": results.missed_turns,
            "responses": dict(results.responses),
            "vad_decision_lag_ms": _distribution([lag for _, lag in results.vad_lag]),
            "e2a_ms": _distribution([e2a for _, e2a in results.e2a]),
            "v2v_ms": _distribution(results.v2v),
            "server_e2a_ms": _distribution(results.server_e2a),
            "server_v2v_ms": _distribution(results.server_v2v),
            "send_lag_ms": {
                "p50": _histogram_percentile(results.send_lag_hist, 50),
                "p99": _histogram_percentile(results.send_lag_hist, 99),
                "max": round(results.send_lag_max, 1),
            },
        },
        "server": server,
        "timeline": bench.timeline,
    }


def passed(report: Mapping[str, Any]) -> bool:
    """No failed call and no missed turn."""
    client = report["client"]
    return bool(client["calls_failed"] == 0 and client["missed_turns"] == 0)


def format_summary(report: Mapping[str, Any]) -> str:
    """The report for people: a few lines."""
    p = report["parameters"]
    c = report["client"]
    s = report["server"]

    def dist(d: Mapping[str, Any]) -> str:
        if not d["count"]:
            return "none"
        return f"p50 {d['p50']}  p95 {d['p95']}  p99 {d['p99']}  max {d['max']} ms (n={d['count']})"

    lines = [
        f"hark bench load: {p['sessions']} callers, ramp {p['ramp_s']:g} s, "
        f"then {p['duration_s']:g} s, {p['chunk_ms']} ms chunks, {p['url']}",
        f"calls: {c['calls_started']} started, {c['calls_completed']} completed, "
        f"{c['calls_failed']} failed {c['failures'] or ''}",
        f"turns: {c['questions']} questions asked, {c['turns_expected']} due, "
        f"{c['turns_detected']} detected, {c['missed_turns']} missed; responses {c['responses']}",
        f"VAD decision lag: {dist(c['vad_decision_lag_ms'])}",
        f"E2A (client):     {dist(c['e2a_ms'])}",
        f"V2V (client):     {dist(c['v2v_ms'])}",
        f"generator send lag: p50 {c['send_lag_ms']['p50']}  p99 {c['send_lag_ms']['p99']}  "
        f"max {c['send_lag_ms']['max']} ms",
    ]
    end = s.get("end")
    if end:
        lines.append(
            f"server: VAD chunks {end['vad_chunks']} ({end['vad_chunks_late']} late), "
            f"audio dropped {end['audio_dropped']}, errors {end['errors']}, "
            f"mean batch {end.get('batch_mean')}, loop lag p99 {end.get('loop_lag_p99_ms')} ms"
        )
        stopped = s.get("vad_decision_lag_speech_stopped_ms", {})
        if stopped.get("p99") is not None:
            lines.append(
                f"server VAD decision lag (speech_stopped): p50 {stopped['p50']}  "
                f"p99 {stopped['p99']} ms"
            )
        for key, unit in (("rss_mib", "MiB"), ("open_fds", "")):
            steady = s.get(f"{key}_steady")
            if steady:
                lines.append(
                    f"{key} after the ramp: {steady['first']} → {steady['last']} {unit} "
                    f"(min {steady['min']}, max {steady['max']}); second half "
                    f"{steady['mid']} → {steady['last']}"
                )
    elif "error" in s:
        lines.append(f"server /metrics unavailable: {s['error']}")
    lines.append("PASS" if passed(report) else "FAIL")
    return "\n".join(lines)


def write_chart(report: Mapping[str, Any], path: Path) -> None:
    """The timeline as a PNG: calls, VAD decision lag, E2A, memory and file descriptors."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise LoadBenchError("--chart needs matplotlib: pip install 'hark[bench]'") from exc

    timeline = report["timeline"]

    def series(key: str) -> tuple[list[float], list[float]]:
        points = [(p["t_s"], p[key]) for p in timeline if p.get(key) is not None]
        return [t for t, _ in points], [v for _, v in points]

    figure, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    figure.suptitle(
        f"hark bench load: {report['parameters']['sessions']} callers "
        f"({report['parameters']['chunk_ms']} ms chunks)"
    )
    panels: list[tuple[Any, str, list[tuple[str, str]]]] = [
        (axes[0], "sessions", [("calls", "client calls"), ("server_sessions", "server active")]),
        (
            axes[1],
            "ms",
            [
                ("vad_lag_p50_ms", "VAD decision lag p50"),
                ("vad_lag_p99_ms", "VAD decision lag p99"),
                ("loop_lag_max_ms", "event-loop lag max"),
            ],
        ),
        (axes[2], "ms", [("e2a_p50_ms", "E2A p50"), ("e2a_p99_ms", "E2A p99")]),
        (axes[3], "MiB", [("rss_mib", "RSS")]),
    ]
    for ax, unit, keys in panels:
        for key, label in keys:
            xs, ys = series(key)
            if xs:
                ax.plot(xs, ys, label=label)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    xs, ys = series("open_fds")
    if xs:
        fds = axes[3].twinx()
        fds.plot(xs, ys, color="tab:red", label="open fds")
        fds.set_ylabel("file descriptors")
        fds.legend(loc="upper right", fontsize="small")
    axes[3].set_xlabel("seconds since start")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


# ---------------------------------------------------------------------------- command


async def run_load_bench(config: LoadConfig, *, progress: bool = False) -> dict[str, Any]:
    """Run the callers against ``config.url`` and return the report."""
    if config.sessions < 1:
        raise LoadBenchError("--sessions must be at least 1")
    if config.transport not in TRANSPORTS:
        raise LoadBenchError(f"--transport must be one of {', '.join(TRANSPORTS)}")
    if not 10 <= config.chunk_ms <= 1000 or RATE * config.chunk_ms % 1000:
        raise LoadBenchError("--chunk-ms must be a whole number of ms from 10 to 1000")
    questions = await spoken_questions(cache_dir=config.cache_dir)
    script = build_script(questions, config.chunk_ms, config.seed)
    bench = _Bench(config, script, progress)
    await bench.run()
    return build_report(bench)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add ``hark bench load``'s options to ``parser``."""
    parser.add_argument("--url", required=True, help="the server's root, e.g. ws://127.0.0.1:8000")
    parser.add_argument("--sessions", type=int, required=True, help="simulated callers at once")
    parser.add_argument(
        "--ramp", type=parse_duration, default=10.0, metavar="S",
        help="start the callers evenly over this long (default 10s)",
    )  # fmt: skip
    parser.add_argument(
        "--duration", type=parse_duration, default=60.0, metavar="S",
        help="run this long after the ramp, e.g. 90s, 30m (default 60s)",
    )  # fmt: skip
    parser.add_argument("--transport", choices=TRANSPORTS, default="ws", help="(default ws)")
    parser.add_argument(
        "--chunk-ms", type=int, default=20, help="audio per append event (default 20)"
    )
    parser.add_argument(
        "--call-duration", type=parse_duration, default=180.0, metavar="S",
        help="a call lasts this long ±50%%, then the caller dials again (default 3m)",
    )  # fmt: skip
    parser.add_argument(
        "--silence-ms", type=int, default=500, help="server_vad silence_duration_ms (default 500)"
    )
    parser.add_argument(
        "--sample", type=parse_duration, default=5.0, metavar="S",
        help="read the server's /metrics this often (default 5s)",
    )  # fmt: skip
    parser.add_argument(
        "--api-key", default=None, help="API key (default $OPENAI_API_KEY, else 'local')"
    )
    parser.add_argument("--model", default="gpt-realtime", help="model name to ask for")
    parser.add_argument("--seed", type=int, default=0, help="seed of the callers' behaviour")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write JSON")
    parser.add_argument(
        "--chart", type=Path, default=None, metavar="FILE.png", help="write a PNG chart"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def command(options: dict[str, Any]) -> int:
    """Run ``hark bench load``; the exit status is 0 when no call failed and no turn was
    missed."""
    config = LoadConfig(
        url=options["url"],
        sessions=options["sessions"],
        ramp_s=options["ramp"],
        duration_s=options["duration"],
        transport=options["transport"],
        chunk_ms=options["chunk_ms"],
        call_s=options["call_duration"],
        silence_ms=options["silence_ms"],
        api_key=options["api_key"] or os.environ.get("OPENAI_API_KEY") or "local",
        model=options["model"],
        sample_s=options["sample"],
        seed=options["seed"],
    )
    try:
        server_urls(config.url, config.model)
        report = run_event_loop(run_load_bench(config, progress=not options["quiet"]))
        print(format_summary(report))
        if options["json"] is not None:
            options["json"].parent.mkdir(parents=True, exist_ok=True)
            options["json"].write_text(json.dumps(report, indent=2) + "\n")
        if options["chart"] is not None:
            write_chart(report, options["chart"])
    except LoadBenchError as error:
        print(f"hark bench load: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0 if passed(report) else 1

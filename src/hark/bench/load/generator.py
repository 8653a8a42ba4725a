"""The load generator: callers dialling in over the ramp, their microphones sent on time,
and the server's ``/metrics`` sampled into a timeline."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from hark.bench.load.call import Call
from hark.bench.load.config import LoadConfig
from hark.bench.load.results import Results
from hark.bench.load.script import Script, build_script
from hark.bench.load.server_metrics import Sample, parse_metrics, server_figures
from hark.bench.load.summary import build_report
from hark.bench.report import ServerUrl, cpu_seconds_if_running, load_average, percentiles
from hark.bench.spoken_questions import RATE, spoken_questions

# Callers are spread over this many send phases within a chunk, as unsynchronised people are.
_PHASES = 20
# The server's CPU is read this long before the callers hang up, so that hanging up is not in it.
_CPU_MARGIN_S = 0.5


class LoadGenerator:
    """Plays ``script`` from ``config.sessions`` callers at once against ``config.url``."""

    def __init__(self, config: LoadConfig, script: Script, progress: bool) -> None:
        self.config = config
        self.script = script
        self.progress = progress
        self.results = Results()
        server = ServerUrl.parse(config.url)
        self.ws_url = f"{server.ws('/v1/realtime')}?model={config.model}"
        self.metrics_url = server.http("/metrics")
        self.started = time.monotonic()
        self.end = self.started + config.ramp_s + config.duration_s
        self.phases: list[set[Call]] = [set() for _ in range(_PHASES)]
        self.samples: list[Sample] = []
        self.timeline: list[dict[str, Any]] = []
        self._marks = (0, 0)
        self.server_cpu: dict[str, Any] | None = None
        self.load: dict[str, float | None] = {"before": load_average()}

    async def run(self) -> None:
        """Ramp the callers up, keep them talking for the duration, then hang up."""
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
            if self.config.server_pid is not None:
                background.append(asyncio.create_task(self._measure_cpu(), name="cpu"))
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
        self.load["after"] = load_average()

    def report(self) -> dict[str, Any]:
        """The run as JSON (see ``build_report``)."""
        return build_report(
            self.config,
            self.results,
            samples=self.samples,
            timeline=self.timeline,
            metrics_url=self.metrics_url,
            server_cpu=self.server_cpu,
            load=self.load,
        )

    async def _measure_cpu(self) -> None:
        """The server's CPU per session-second while all callers talk (after the ramp)."""
        pid = self.config.server_pid
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.started + self.config.ramp_s - time.monotonic())
        first, since = cpu_seconds_if_running(pid), loop.time()
        await asyncio.sleep(self.end - _CPU_MARGIN_S - time.monotonic())
        last, wall = cpu_seconds_if_running(pid), loop.time() - since
        if first is None or last is None or wall <= 0:
            return
        used = last - first
        self.server_cpu = {
            "seconds": round(used, 2),
            "wall_s": round(wall, 1),
            "cores": round(used / wall, 3),
            "ms_per_session_second": round(1000 * used / (wall * self.config.sessions), 3),
        }

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
        call = Call(self.config, self.script, results, self.started, ws, rng, hangup, phase)
        results.active += 1
        try:
            await self._converse(call)
        finally:
            results.active -= 1
            self.phases[phase].discard(call)
            await ws.close()
            call.finish()

    async def _converse(self, call: Call) -> None:
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

    async def _read(self, call: Call) -> None:
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
        audio_in: dict[str, Any] = {
            "format": {"type": "audio/pcm", "rate": RATE},
            "turn_detection": {
                "type": "server_vad",
                "silence_duration_ms": self.config.silence_ms,
                "create_response": True,
                "interrupt_response": True,
            },
        }
        if self.config.transcribe:
            audio_in["transcription"] = {"model": "whisper-1"}
        return {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["audio"],
                "include": ["hark.turn_timings"],
                "audio": {"input": audio_in},
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
                    sample = Sample(t, None, f"HTTP {response.status}")
                else:
                    sample = Sample(t, parse_metrics(await response.text()))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            sample = Sample(t, None, type(exc).__name__)
        previous = next((s for s in reversed(self.samples) if s.values is not None), None)
        self.samples.append(sample)
        self._add_to_timeline(sample, previous)

    def _add_to_timeline(self, sample: Sample, previous: Sample | None) -> None:
        results = self.results
        lag_mark, e2a_mark = self._marks
        lags = percentiles([lag for _, lag in results.vad_lag[lag_mark:]], (50, 99), digits=1)
        e2as = percentiles([e2a for _, e2a in results.e2a[e2a_mark:]], (50, 99), digits=1)
        point: dict[str, Any] = {
            "t_s": round(sample.t, 1),
            "calls": results.active,
            "decisions": len(results.vad_lag) - lag_mark,
            "vad_lag_p50_ms": lags["p50"],
            "vad_lag_p99_ms": lags["p99"],
            "e2a_p50_ms": e2as["p50"],
            "e2a_p99_ms": e2as["p99"],
        }
        self._marks = (len(results.vad_lag), len(results.e2a))
        if sample.values is not None:
            point.update(server_figures(sample.values, previous.values if previous else None))
        else:
            point["server_error"] = sample.error
        self.timeline.append(point)
        if self.progress:
            print(_progress_line(point), file=sys.stderr, flush=True)


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


async def run_load_bench(config: LoadConfig, *, progress: bool = False) -> dict[str, Any]:
    """Run the callers against ``config.url`` and return the report."""
    config.check()
    questions = await spoken_questions(cache_dir=config.cache_dir)
    script = build_script(questions, config.chunk_ms, config.seed)
    generator = LoadGenerator(config, script, progress)
    await generator.run()
    return generator.report()

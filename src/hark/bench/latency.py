"""``hark bench latency``: how long a person waits for the answer to a spoken question.

Each client behaves like a person on a live microphone. Through the official ``openai`` SDK it
streams audio in real time in 20 ms chunks, silence unless it is asking a question. It asks
a question, waits for the whole answer and for that answer to finish playing, thinks for a
moment, and asks the next one. It never speaks over a reply, so it never barges in.

Two figures define latency:

- **E2A** (end of turn → audio): from the server's end-of-turn decision
  (``input_audio_buffer.speech_stopped``) to the first ``response.output_audio.delta`` it
  sent. It comes from the server's ``hark.turn_timings`` event (opted into with
  ``"include": ["hark.turn_timings"]``), which also gives the stage breakdown. A server that
  does not offer that event gets the client's proxy: the time between receiving
  ``speech_stopped`` and receiving the first audio delta (close to the same on loopback).
- **V2V** (voice to voice): on the client's clock, from sending the chunk that holds the last
  voiced sample of the question to receiving the first audio of the reply. It includes the
  end-of-turn wait.

With ``--concurrency C`` and ``--turns N``, C clients run at once and each asks N questions,
so the run has C × N turns. A turn whose reply was cancelled, failed, had no audio or never
came counts as a failure and stays out of the percentiles; a reply cut short by the output
token cap (``incomplete``) was still heard, so it counts.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from hark.bench.command import Bench, Result, config_from
from hark.bench.microphone import CHUNK_S, Microphone, Utterance
from hark.bench.report import (
    DEFAULT_API_KEY,
    BenchError,
    ServerUrl,
    api_key,
    host_figures,
    load_average,
    percentile,
    report_head,
)
from hark.bench.spoken_questions import (
    QUESTIONS,
    RATE,
    SpokenQuestion,
    audio_session,
    spoken_questions,
)
from hark.config.options import BenchOption, session_bench_options
from hark.observability.turn_timing import STAGES

if TYPE_CHECKING:
    from openai.resources.realtime.realtime import AsyncRealtimeConnection

_LOG = logging.getLogger(__name__)

TIMINGS_EVENT = "hark.turn_timings"
VAD_MODES = ("server", "semantic")
# Reply statuses that count: an incomplete reply (cut by max_output_tokens) was heard too.
ANSWERED = ("completed", "incomplete")
# How long to wait after response.done for the turn timings before going on without them.
_TIMINGS_GRACE_S = 2.0
# Clients start this far apart at most (randomly), so that they do not speak in lockstep.
_START_SPREAD_S = 1.0


@dataclass(frozen=True)
class LatencyBenchConfig:
    """What to measure and how.

    ``url`` is the server's WebSocket root (``ws://HOST:PORT``); ``turns`` is the number of
    questions each of the ``concurrency`` clients asks; ``vad`` picks ``server_vad`` with
    ``silence_ms`` of end-of-turn silence or ``semantic_vad`` (eagerness ``auto``);
    ``think_s`` is the range of the pause (seconds) between a reply's end and the next
    question, drawn from a generator seeded with ``seed``; ``turn_timeout_s`` bounds the wait
    for a reply after the question was said.
    """

    url: str
    turns: int = 10
    concurrency: int = 1
    vad: Literal["server", "semantic"] = "server"
    silence_ms: int = 500
    api_key: str = DEFAULT_API_KEY
    model: str = "gpt-realtime"
    seed: int = 0
    think_s: tuple[float, float] = (0.3, 0.8)
    turn_timeout_s: float = 60.0
    cache_dir: Path | None = None

    def turn_detection(self) -> dict[str, Any]:
        """The session's ``audio.input.turn_detection``."""
        if self.vad == "semantic":
            return {"type": "semantic_vad", "eagerness": "auto"}
        return {"type": "server_vad", "silence_duration_ms": self.silence_ms}

    def parameters(self) -> dict[str, Any]:
        """The run's parameters as JSON (without the API key)."""
        return {
            "url": self.url,
            "turns_per_client": self.turns,
            "concurrency": self.concurrency,
            "vad": self.vad,
            "silence_ms": self.silence_ms if self.vad == "server" else None,
            "turn_detection": self.turn_detection(),
            "model": self.model,
            "seed": self.seed,
            "think_s": list(self.think_s),
            "chunk_ms": CHUNK_S * 1000,
        }


@dataclass
class TurnResult:
    """One question and its answer, as the client saw it (times in ms)."""

    client: int
    turn: int
    question: str
    # The reply's status (completed, incomplete, cancelled, failed), no_audio (answered without
    # audio) or timeout (no reply).
    status: str
    response_id: str | None = None
    v2v_ms: float | None = None
    e2a_ms: float | None = None
    e2a_client_ms: float | None = None
    # The server's own estimate of V2V (its last voiced sample to first audio sent).
    server_v2v_ms: float | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)
    reply_audio_ms: float = 0.0
    # Responses the question caused: more than one when the server split it in two turns.
    responses: int = 0

    @property
    def ok(self) -> bool:
        """Whether the turn counts in the percentiles."""
        return self.status in ANSWERED and self.v2v_ms is not None


@dataclass(frozen=True)
class Summary:
    """The distribution of one figure (ms)."""

    n: int
    p50: float
    p95: float
    p99: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary | None:
        """The summary of ``values``; None when there are none."""
        if not values:
            return None
        return cls(
            n=len(values),
            p50=round(percentile(values, 50), 1),
            p95=round(percentile(values, 95), 1),
            p99=round(percentile(values, 99), 1),
            mean=round(sum(values) / len(values), 1),
            min=round(min(values), 1),
            max=round(max(values), 1),
        )


@dataclass
class LatencyReport:
    """A finished run: its parameters and every turn."""

    config: LatencyBenchConfig
    # Whether the server sent hark.turn_timings (else E2A is the client's proxy).
    server_timings: bool
    turns: list[TurnResult]
    started_at: float
    duration_s: float
    # The machine the bench ran on: CPUs and its 1-minute load average before and after, as
    # a busy machine (the server usually shares it) slows every figure.
    host: dict[str, Any] = field(default_factory=dict)

    def answered(self) -> list[TurnResult]:
        """The turns that count in the percentiles: the reply was heard."""
        return [turn for turn in self.turns if turn.ok]

    def figures(self) -> dict[str, list[float]]:
        """Each figure's values over the completed turns (E2A falls back to the client's)."""
        done = self.answered()
        figures: dict[str, list[float]] = {
            "e2a_ms": [e2a for t in done if (e2a := self._e2a(t)) is not None],
            "e2a_client_ms": [t.e2a_client_ms for t in done if t.e2a_client_ms is not None],
            "v2v_ms": [t.v2v_ms for t in done if t.v2v_ms is not None],
        }
        for stage in STAGES:
            figures[stage] = [t.stages_ms[stage] for t in done if stage in t.stages_ms]
        return figures

    def _e2a(self, turn: TurnResult) -> float | None:
        return turn.e2a_ms if self.server_timings else turn.e2a_client_ms

    def summary(self) -> dict[str, Any]:
        """Counts, and the distribution of E2A, V2V and each stage."""
        figures = self.figures()
        statuses: dict[str, int] = {}
        failures: dict[str, int] = {}
        for turn in self.turns:
            statuses[turn.status] = statuses.get(turn.status, 0) + 1
            if not turn.ok:
                failures[turn.status] = failures.get(turn.status, 0) + 1

        def stats(values: list[float]) -> dict[str, float] | None:
            summary = Summary.of(values)
            return None if summary is None else asdict(summary)

        return {
            "turns": len(self.turns),
            "answered": len(self.answered()),
            "failed": len(self.turns) - len(self.answered()),
            "statuses": statuses,
            "failures": failures,
            "e2a_source": "server" if self.server_timings else "client",
            "e2a_ms": stats(figures["e2a_ms"]),
            "e2a_client_ms": stats(figures["e2a_client_ms"]),
            "v2v_ms": stats(figures["v2v_ms"]),
            "stages_ms": {stage: stats(figures[stage]) for stage in STAGES},
        }

    def to_json(self) -> dict[str, Any]:
        """Parameters, summary and every turn's raw numbers."""
        return {
            **report_head("latency", self.started_at, self.duration_s, self.host),
            "parameters": {**self.config.parameters(), "server_timings": self.server_timings},
            "summary": self.summary(),
            "turns": [asdict(turn) for turn in self.turns],
        }


def format_summary(report: LatencyReport) -> str:
    """A table of p50/p95/p99/mean/n for E2A, V2V and each stage, for people."""
    config = report.config
    summary = report.summary()
    if config.vad == "server":
        vad = f"server_vad, silence {config.silence_ms} ms"
    else:
        vad = "semantic_vad, eagerness auto"
    clients = f"{config.concurrency} client{'s' if config.concurrency != 1 else ''}"
    lines = [
        f"hark bench latency: {summary['turns']} turns ({summary['answered']} answered, "
        f"{summary['failed']} failed), {clients}, {vad}, {report.duration_s:.0f} s",
    ]
    if host_line := _describe_host(report.host):
        lines.append(host_line)
    if summary["failures"]:
        lines.append(
            "failures: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["failures"].items()))
        )
    lines.append(f"{'ms':<26}{'p50':>8}{'p95':>8}{'p99':>8}{'mean':>8}{'n':>6}")
    e2a_label = "E2A (server)" if report.server_timings else "E2A (client proxy)"
    rows: list[tuple[str, dict[str, float] | None]] = [
        (e2a_label, summary["e2a_ms"]),
        ("V2V (client)", summary["v2v_ms"]),
    ]
    if report.server_timings:
        rows.insert(1, ("E2A (client proxy)", summary["e2a_client_ms"]))
        rows.append(("stages after end of turn:", None))
        rows.extend((f"  {stage}", summary["stages_ms"][stage]) for stage in STAGES)
    for label, stats in rows:
        if stats is None:
            lines.append(label if label.endswith(":") else f"{label:<26}{'-':>8}")
            continue
        lines.append(
            f"{label:<26}{stats['p50']:>8.0f}{stats['p95']:>8.0f}{stats['p99']:>8.0f}"
            f"{stats['mean']:>8.0f}{stats['n']:>6}"
        )
    if not report.server_timings:
        lines.append("(the server sent no hark.turn_timings: no stage breakdown)")
    return "\n".join(lines)


def _describe_host(host: dict[str, Any]) -> str | None:
    before, after = host.get("load_1m_before"), host.get("load_1m_after")
    if before is None or after is None:
        return None
    return f"host: {host.get('cpus')} CPUs, load average {before:.1f} before, {after:.1f} after"


def write_chart(report: LatencyReport, path: Path) -> None:
    """A PNG: the distributions (CDFs) of E2A and V2V, and the median stages of a turn."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise BenchError(
            "--chart needs matplotlib: install hark with the 'bench' extra (uv sync --extra bench)"
        ) from error
    figures = report.figures()
    figure = Figure(figsize=(10, 7), layout="constrained")
    cdf, stages = figure.subplots(2, 1, height_ratios=(3, 1))
    e2a_label = "E2A (server)" if report.server_timings else "E2A (client proxy)"
    for key, label in (("e2a_ms", e2a_label), ("v2v_ms", "V2V (client)")):
        values = sorted(figures[key])
        if not values:
            continue
        fractions = [i / len(values) for i in range(len(values) + 1)]
        median = percentile(values, 50)
        cdf.step(
            [values[0], *values], fractions, where="post", label=f"{label}: p50 {median:.0f} ms"
        )
    cdf.set_xlabel("ms")
    cdf.set_ylabel("fraction of turns")
    cdf.set_ylim(0, 1.02)
    cdf.grid(alpha=0.3)
    cdf.legend(loc="lower right")
    config = report.config
    vad = f"server_vad {config.silence_ms} ms" if config.vad == "server" else "semantic_vad"
    cdf.set_title(
        f"hark bench latency: {len(report.answered())}/{len(report.turns)} turns, "
        f"{config.concurrency} client(s), {vad}"
    )
    _draw_stages(stages, report, figures)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def _draw_stages(axes: Any, report: LatencyReport, figures: dict[str, list[float]]) -> None:
    """One bar: the median end-of-turn wait, then each stage's median increment."""
    # The end-of-turn wait is what V2V has and E2A has not.
    waits = [
        t.v2v_ms - t.e2a_client_ms
        for t in report.answered()
        if t.v2v_ms is not None and t.e2a_client_ms is not None
    ]
    segments: list[tuple[str, float]] = []
    if waits:
        segments.append(("end-of-turn wait", percentile(waits, 50)))
    reached = 0.0
    for stage in STAGES:
        if figures[stage]:
            median = percentile(figures[stage], 50)
            segments.append((stage, max(0.0, median - reached)))
            reached = max(reached, median)
    if not report.server_timings and figures["e2a_ms"]:
        segments.append(("end of turn → audio", percentile(figures["e2a_ms"], 50)))
    left = 0.0
    colours = ("#bbbbbb", "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
    for (label, width), colour in zip(segments, colours, strict=False):
        axes.barh(0, width, left=left, color=colour, label=f"{label} {width:.0f}")
        left += width
    axes.set_yticks([])
    axes.set_xlabel("ms after the last voiced sample (medians)")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, fontsize="small")


async def run_latency_bench(
    config: LatencyBenchConfig, progress: Callable[[TurnResult], None] | None = None
) -> LatencyReport:
    """Run ``config.concurrency`` clients of ``config.turns`` questions each; ``progress``
    is called after every turn."""
    if config.turns < 1 or config.concurrency < 1:
        raise BenchError("--turns and --concurrency must be at least 1")
    # Client k asks questions k, k+1, …: only those are needed.
    needed = min(len(QUESTIONS), config.turns + config.concurrency - 1)
    questions = await spoken_questions(QUESTIONS[:needed], cache_dir=config.cache_dir)
    load_before = load_average()
    started_at, started = time.time(), time.perf_counter()
    results = await asyncio.gather(
        *(_Client(index, config, questions, progress).run() for index in range(config.concurrency))
    )
    turns = [turn for client_turns, _ in results for turn in client_turns]
    return LatencyReport(
        config=config,
        server_timings=all(timings for _, timings in results),
        turns=turns,
        started_at=started_at,
        duration_s=time.perf_counter() - started,
        host=host_figures(load_before),
    )


@dataclass
class _Reply:
    """One response as the client received it (perf_counter seconds)."""

    created_at: float
    # When the client received the speech_stopped that led to this response.
    turn_end_at: float | None
    first_audio_at: float | None = None
    audio_samples: int = 0
    done_at: float | None = None
    status: str | None = None
    timings: dict[str, Any] | None = None


_CLOSED = "bench.connection_closed"


class _Client:
    """One person asking questions on one Realtime session."""

    def __init__(
        self,
        index: int,
        config: LatencyBenchConfig,
        questions: Sequence[SpokenQuestion],
        progress: Callable[[TurnResult], None] | None,
    ) -> None:
        self._index = index
        self._config = config
        self._questions = questions
        self._progress = progress
        self._random = random.Random(config.seed * 1_000_003 + index)
        self._events: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self._server_timings = True

    async def run(self) -> tuple[list[TurnResult], bool]:
        """Ask every question; returns the turns and whether the server sent turn timings."""
        from openai import AsyncOpenAI

        server = ServerUrl.parse(self._config.url)
        client = AsyncOpenAI(
            api_key=self._config.api_key,
            base_url=server.http("/v1"),
            websocket_base_url=server.ws("/v1"),
        )
        from websockets.exceptions import InvalidHandshake

        if self._index:
            await asyncio.sleep(self._random.uniform(0, _START_SPREAD_S))
        try:
            async with client.realtime.connect(model=self._config.model) as conn:
                reader = asyncio.create_task(self._read(conn))
                microphone = Microphone(conn.input_audio_buffer.append)
                try:
                    await self._configure(conn)
                    speaking = asyncio.create_task(microphone.run())
                    try:
                        turns = await self._converse(microphone, speaking)
                    finally:
                        speaking.cancel()
                        await asyncio.gather(speaking, return_exceptions=True)
                finally:
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
        except (OSError, InvalidHandshake) as error:
            raise BenchError(f"cannot connect to {self._config.url}: {error}") from error
        finally:
            await client.close()
        return turns, self._server_timings

    async def _read(self, conn: AsyncRealtimeConnection) -> None:
        """Stamp every server event with its arrival time; the turn logic reads them later."""
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                raw = await conn.recv_bytes()
                # Raw JSON rather than the SDK's typed events: hark.turn_timings is not one.
                self._events.put_nowait((time.perf_counter(), json.loads(raw)))
        except ConnectionClosed:
            self._events.put_nowait((time.perf_counter(), {"type": _CLOSED}))

    async def _next_event(self, until: float) -> tuple[float, dict[str, Any]] | None:
        """The next event, or None once the perf_counter time ``until`` has passed."""
        try:
            return await asyncio.wait_for(
                self._events.get(), timeout=max(0.0, until - time.perf_counter())
            )
        except TimeoutError:
            return None

    async def _configure(self, conn: AsyncRealtimeConnection) -> None:
        """Audio in and out at 24 kHz, the turn detection asked for, and the turn timings."""
        session = audio_session(turn_detection=self._config.turn_detection())
        session["include"] = [TIMINGS_EVENT]
        deadline = time.perf_counter() + 30
        await conn.session.update(session=cast(Any, session))
        while (item := await self._next_event(deadline)) is not None:
            _, event = item
            if event["type"] == "session.updated":
                return
            if event["type"] == _CLOSED:
                raise BenchError("the server closed the connection during set-up")
            if event["type"] == "error":
                error = event.get("error") or {}
                text = f"{error.get('param') or ''} {error.get('message') or ''}"
                if "include" in text and "include" in session:
                    # A server without hark's turn timings: measure E2A on the client.
                    _LOG.info("the server does not offer %s: E2A from the client", TIMINGS_EVENT)
                    self._server_timings = False
                    del session["include"]
                    await conn.session.update(session=cast(Any, session))
                    continue
                raise BenchError(f"session.update refused: {error.get('message', error)}")
        raise BenchError("no session.updated within 30 s")

    async def _converse(
        self, microphone: Microphone, speaking: asyncio.Task[None]
    ) -> list[TurnResult]:
        turns = []
        for turn in range(self._config.turns):
            await self._idle(time.perf_counter() + self._random.uniform(*self._config.think_s))
            question = self._questions[(self._index + turn) % len(self._questions)]
            result = await self._ask(microphone, speaking, turn, question)
            turns.append(result)
            if self._progress is not None:
                self._progress(result)
        return turns

    async def _idle(self, until: float) -> None:
        """Listen, ignoring what comes (late events of the previous turn), until ``until``."""
        while (item := await self._next_event(until)) is not None:
            if item[1]["type"] == _CLOSED:
                raise BenchError("the server closed the connection")

    async def _ask(
        self,
        microphone: Microphone,
        speaking: asyncio.Task[None],
        turn: int,
        question: SpokenQuestion,
    ) -> TurnResult:
        """Say ``question``, wait for the whole answer and for it to finish playing."""
        utterance = microphone.say(question.pcm)
        deadline = time.perf_counter() + question.duration_s + self._config.turn_timeout_s
        replies: dict[str, _Reply] = {}
        latest: _Reply | None = None
        latest_id: str | None = None
        in_speech = False
        turn_end_at: float | None = None
        while True:
            if speaking.done():
                # The microphone died (the connection failed): surface its error.
                speaking.result()
            until = deadline
            if not utterance.finished.done():
                # Still talking: look again after the next chunk.
                until = min(deadline, time.perf_counter() + CHUNK_S)
            elif (
                latest is not None
                and latest.done_at is not None
                and not in_speech
                and (turn_end_at is None or latest.created_at >= turn_end_at)
            ):
                # The reply to the last stretch of speech is done: the turn is over, once
                # its timings are in (or late).
                if latest.timings is not None or not self._server_timings:
                    break
                if time.perf_counter() > latest.done_at + _TIMINGS_GRACE_S:
                    break
                until = min(deadline, latest.done_at + _TIMINGS_GRACE_S)
            item = await self._next_event(until)
            if item is None:
                if time.perf_counter() >= deadline:
                    return self._result(turn, question, "timeout", None, None, utterance, replies)
                continue
            at, event = item
            kind = event["type"]
            if kind == "input_audio_buffer.speech_started":
                in_speech = True
            elif kind == "input_audio_buffer.speech_stopped":
                in_speech = False
                turn_end_at = at
            elif kind == "response.created":
                latest_id = event["response"]["id"]
                latest = replies[latest_id] = _Reply(created_at=at, turn_end_at=turn_end_at)
            elif kind == "response.output_audio.delta":
                reply = replies.get(event.get("response_id", ""))
                if reply is not None:
                    if reply.first_audio_at is None:
                        reply.first_audio_at = at
                    reply.audio_samples += len(base64.b64decode(event["delta"])) // 2
            elif kind == "response.done":
                reply = replies.get(event["response"]["id"])
                if reply is not None:
                    reply.done_at = at
                    reply.status = event["response"]["status"]
            elif kind == TIMINGS_EVENT:
                reply = replies.get(event.get("response_id", ""))
                if reply is not None:
                    reply.timings = event
            elif kind == "error":
                _LOG.warning("client %d: server error: %s", self._index, event.get("error"))
            elif kind == _CLOSED:
                raise BenchError("the server closed the connection")
        assert latest is not None and latest.status is not None
        status = latest.status
        if status in ANSWERED and latest.first_audio_at is None:
            status = "no_audio"
        result = self._result(turn, question, status, latest_id, latest, utterance, replies)
        if latest.first_audio_at is not None:
            # A person listens to the whole reply before asking the next question.
            await self._idle(latest.first_audio_at + latest.audio_samples / RATE)
        return result

    def _result(
        self,
        turn: int,
        question: SpokenQuestion,
        status: str,
        response_id: str | None,
        reply: _Reply | None,
        utterance: Utterance,
        replies: dict[str, _Reply],
    ) -> TurnResult:
        result = TurnResult(
            client=self._index,
            turn=turn,
            question=question.text,
            status=status,
            response_id=response_id,
            responses=len(replies),
        )
        if reply is None or reply.first_audio_at is None:
            return result
        result.reply_audio_ms = round(reply.audio_samples / RATE * 1000, 1)
        last_voiced_sent = utterance.sent_at(question.last_voiced)
        if last_voiced_sent is not None:
            result.v2v_ms = _ms(reply.first_audio_at - last_voiced_sent)
        if reply.turn_end_at is not None:
            result.e2a_client_ms = _ms(reply.first_audio_at - reply.turn_end_at)
        if reply.timings is not None:
            result.e2a_ms = _optional_ms(reply.timings.get("e2a_ms"))
            result.server_v2v_ms = _optional_ms(reply.timings.get("v2v_ms"))
            stages = reply.timings.get("stages_ms") or {}
            result.stages_ms = {
                stage: float(value)
                for stage, value in stages.items()
                if isinstance(value, int | float)
            }
        return result


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _optional_ms(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


OPTIONS: tuple[BenchOption | str, ...] = (
    BenchOption("turns", "questions each client asks (default 10)", int, 10),
    BenchOption(
        "concurrency", "clients at once, each asking --turns questions (default 1)", int, 1
    ),
    BenchOption(
        "vad",
        "server_vad (with --silence-ms) or semantic_vad (default server)",
        str,
        "server",
        choices=VAD_MODES,
    ),
    *session_bench_options("the think times"),
)


def latency_config(options: dict[str, Any]) -> LatencyBenchConfig:
    """The config of ``hark bench latency``'s parsed options."""
    config = config_from(LatencyBenchConfig, options, api_key=api_key(options["api_key"]))
    ServerUrl.parse(config.url)
    return config


def run(config: LatencyBenchConfig) -> Result:
    """Ask the questions; the run passes when at least one reply was heard."""
    report = asyncio.run(run_latency_bench(config, progress=_print_turn))
    chart = functools.partial(write_chart, report)
    return Result(report.to_json(), format_summary(report), bool(report.answered()), chart)


BENCH = Bench("latency", OPTIONS, latency_config, run)
configure_parser, command = BENCH.configure_parser, BENCH.command


def _print_turn(turn: TurnResult) -> None:
    figures = []
    if turn.v2v_ms is not None:
        figures.append(f"V2V {turn.v2v_ms:.0f} ms")
    e2a = turn.e2a_ms if turn.e2a_ms is not None else turn.e2a_client_ms
    if e2a is not None:
        figures.append(f"E2A {e2a:.0f} ms")
    print(
        f"client {turn.client} turn {turn.turn}: {turn.status}"
        + (f", {', '.join(figures)}" if figures else "")
        + f"  ({turn.question})",
        file=sys.stderr,
    )

"""``hark bench turns``: how often turn detection cuts people off, and how long it leaves
dead air, for each ``semantic_vad`` eagerness and for ``server_vad`` at several silences.

The fixtures are user turns from ``turns_fixtures.toml``: complete turns, and turns with
mid-utterance pauses (numbers read in groups, spelled addresses, lists, "um", trailing
conjunctions), said by several voices at several speaking rates over several noise levels,
each labelled from the spec with where the turn really ends (the last voiced sample of its
last segment). The audio is synthesised once and cached (Piper, espeak-ng); noise is added
from a generator seeded by the fixture's name.

Each fixture runs through the session core (:class:`hark.session.core.Session`) on the
sample clock, faster than real time, with the models the server embeds: Silero VAD (batched,
as the server runs it) for every setting, and for ``semantic_vad`` Whisper for the pause's
words and the end-of-turn model (:mod:`hark.engines.turn.llama_cpp`) for its verdict. A
result comes back to the session once the sample clock has moved on by the time the model
took (``measured``, the default: what the machine does for one caller) or by a fixed delay
(deterministic). Recognition at the turn's end (after ``speech_stopped``) decides nothing
and is not run; nor is any for ``server_vad``, whose decisions do not read words.

Scored per fixture, from the ``input_audio_buffer.speech_stopped`` events:

- a **false cut-off**: a ``speech_stopped`` before the labelled end of the turn;
- the **dead air**: from the labelled end to the first ``speech_stopped`` after it.

Per setting: the false cut-off rate (turns cut at least once, of all turns), the dead air's
p50, p95 and mean, and the curve of all settings (dead air against false cut-offs, with its
Pareto frontier). The operating point at a false cut-off budget (5 % by default) is the
setting of least dead air within it, as LiveKit's eot-bench reports "latency at 5 % false
cut-offs" (their figure is the mean; both are given). The verdicts the end-of-turn model gave
on what Whisper heard are also scored as :mod:`hark.engines.turn.evaluation` scores text.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import heapq
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hark.bench.command import Bench, Result, arguments, list_option
from hark.bench.report import BenchError, percentile
from hark.bench.spoken_questions import (
    RATE,
)
from hark.bench.turn_fixtures import (
    SPEC_PATH,
    Fixture,
    FixtureSpec,
    Labels,
    Synthesiser,
    fixture_specs,
    load_spec,
)
from hark.config.options import BenchOption
from hark.session.results import Recognised, TurnScored, VadScored

EAGERNESS = ("low", "medium", "high", "auto")
SILENCES_MS = (200, 300, 400, 500, 600, 800, 1000, 1200, 1600, 2000)
BUDGET = 0.05
# The client's frames: 20 ms, as WebRTC and most SDKs send them.
FRAME_MS = 20
# A stop this soon after a labelled pause ends is still that pause's (the VAD answers per
# 32 ms chunk, and hears speech resume a chunk or two late).
PAUSE_GRACE_MS = 100
# Rows of one VAD push: the batcher holds a bounded queue per stream.
_VAD_PUSH_ROWS = 8

Detector = Literal["semantic_vad", "server_vad"]


# ---------------------------------------------------------------------------- labels and scores


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a detector did on one fixture.

    ``early_stops``: its ``speech_stopped`` times before the labelled end (each a false
    cut-off); ``cut_pauses``: the labelled pauses they fell in; ``dead_air_ms``: labelled end
    to the first stop after it, None when none came (``missed``).
    """

    early_stops: tuple[float, ...]
    cut_pauses: tuple[int, ...]
    dead_air_ms: float | None

    @property
    def cut(self) -> bool:
        """Whether the turn was cut off at least once."""
        return bool(self.early_stops)


def score(labels: Labels, stops: Sequence[float]) -> Outcome:
    """Score one fixture's ``speech_stopped`` times (ms) against its labels."""
    early = tuple(s for s in stops if s < labels.end_ms)
    late = [s for s in stops if s >= labels.end_ms]
    cut_pauses = tuple(
        index
        for index, (start, end) in enumerate(labels.pauses)
        if any(start <= s <= end + PAUSE_GRACE_MS for s in early)
    )
    dead_air = min(late) - labels.end_ms if late else None
    return Outcome(early, cut_pauses, dead_air)


@dataclass(frozen=True, slots=True)
class Point:
    """A setting's figures over all fixtures: one point of the operating curve.

    ``false_cutoff_rate``: turns cut off at least once, of all turns. ``paused_cutoff_rate``:
    the same among turns with mid-utterance pauses; ``pause_cut_rate``: labelled pauses cut
    at, of all labelled pauses. Dead air in ms over every turn; a turn whose end never came
    (``missed``) counts as ``missed_as_ms``, a lower bound.
    """

    setting: str
    turns: int
    false_cutoffs: int
    false_cutoff_rate: float
    paused_turns: int
    paused_cutoff_rate: float | None
    pause_cut_rate: float | None
    dead_air_p50_ms: float
    dead_air_p95_ms: float
    dead_air_mean_ms: float
    missed: int

    def to_json(self) -> dict[str, Any]:
        """The point as the report writes it."""
        return {
            "setting": self.setting,
            "turns": self.turns,
            "false_cutoffs": self.false_cutoffs,
            "false_cutoff_rate": round(self.false_cutoff_rate, 4),
            "paused_turns": self.paused_turns,
            "paused_cutoff_rate": _round(self.paused_cutoff_rate, 4),
            "pause_cut_rate": _round(self.pause_cut_rate, 4),
            "dead_air_ms": {
                "p50": round(self.dead_air_p50_ms, 1),
                "p95": round(self.dead_air_p95_ms, 1),
                "mean": round(self.dead_air_mean_ms, 1),
            },
            "missed": self.missed,
        }


def summarise(
    setting: str,
    outcomes: Sequence[Outcome],
    pauses: Sequence[int],
    missed_as_ms: float,
) -> Point:
    """The point of ``setting`` from its fixtures' outcomes; ``pauses[i]`` is how many
    labelled pauses fixture ``i`` has."""
    if not outcomes or len(outcomes) != len(pauses):
        raise ValueError("one pause count per outcome, and at least one outcome")
    cut = sum(o.cut for o in outcomes)
    paused = [o for o, n in zip(outcomes, pauses, strict=True) if n]
    labelled = sum(pauses)
    dead = [o.dead_air_ms if o.dead_air_ms is not None else missed_as_ms for o in outcomes]
    return Point(
        setting=setting,
        turns=len(outcomes),
        false_cutoffs=cut,
        false_cutoff_rate=cut / len(outcomes),
        paused_turns=len(paused),
        paused_cutoff_rate=sum(o.cut for o in paused) / len(paused) if paused else None,
        pause_cut_rate=sum(len(o.cut_pauses) for o in outcomes) / labelled if labelled else None,
        dead_air_p50_ms=percentile(dead, 50),
        dead_air_p95_ms=percentile(dead, 95),
        dead_air_mean_ms=statistics.fmean(dead),
        missed=sum(o.dead_air_ms is None for o in outcomes),
    )


def operating_point(points: Sequence[Point], budget: float = BUDGET) -> Point | None:
    """The point of least dead air (p50, then mean) whose false cut-off rate is within
    ``budget``; None when no point is."""
    within = [p for p in points if p.false_cutoff_rate <= budget + 1e-12]
    if not within:
        return None
    return min(within, key=lambda p: (p.dead_air_p50_ms, p.dead_air_mean_ms, p.false_cutoff_rate))


def frontier(points: Sequence[Point]) -> list[Point]:
    """The Pareto frontier of dead air (p50) against false cut-offs: the points no other
    point beats on both (or equals on one and beats on the other), fewest cut-offs first."""
    kept = []
    for p in points:
        dominated = any(
            q is not p
            and q.false_cutoff_rate <= p.false_cutoff_rate
            and q.dead_air_p50_ms <= p.dead_air_p50_ms
            and (q.false_cutoff_rate < p.false_cutoff_rate or q.dead_air_p50_ms < p.dead_air_p50_ms)
            for q in points
        )
        if not dominated:
            kept.append(p)
    return sorted(kept, key=lambda p: (p.false_cutoff_rate, p.dead_air_p50_ms))


# ---------------------------------------------------------------------------- settings and runs


@dataclass(frozen=True, slots=True)
class Setting:
    """A turn detection to run: ``semantic_vad`` at an eagerness, or ``server_vad`` with a
    silence duration."""

    detector: Detector
    eagerness: str | None = None
    silence_ms: int | None = None

    @property
    def name(self) -> str:
        """``semantic_vad auto``, ``server_vad 500ms``."""
        if self.detector == "semantic_vad":
            return f"semantic_vad {self.eagerness}"
        return f"server_vad {self.silence_ms}ms"

    def turn_detection(self) -> dict[str, Any]:
        """The session's ``turn_detection``: no responses, only the turns."""
        common = {"create_response": False, "interrupt_response": False}
        if self.detector == "semantic_vad":
            return {"type": "semantic_vad", "eagerness": self.eagerness, **common}
        return {"type": "server_vad", "silence_duration_ms": self.silence_ms, **common}


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judgement of a pause: what Whisper heard, the model's probability, and when (ms on
    the fixture's clock) it was asked and answered."""

    transcript: str
    context: str | None
    probability: float
    asked_ms: float
    answered_ms: float


@dataclass
class Run:
    """What the session did on one fixture with one setting."""

    starts: list[float] = field(default_factory=list)
    stops: list[float] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)


class Engines:
    """The embedded models, loaded once, with each answer kept for the same question.

    ``asr_delay_ms``/``eot_delay_ms``: how long after being asked an answer reaches the
    session on the sample clock; None takes the time the model took (measured once per
    distinct question).
    """

    def __init__(self, asr_delay_ms: float | None, eot_delay_ms: float | None) -> None:
        from hark.engines.vad.batcher import BatchedSileroVad

        self.vad = BatchedSileroVad()
        self.asr_delay_ms = asr_delay_ms
        self.eot_delay_ms = eot_delay_ms
        self._asr: Any = None
        self._turn: Any = None
        self._vad_answers: dict[str, list[float]] = {}
        self._heard: dict[str, tuple[Any, float]] = {}
        self._judged: dict[tuple[str, str | None], tuple[float, float]] = {}
        self.asr_ms: list[float] = []
        self.eot_ms: list[float] = []

    async def load(self, semantic: bool) -> None:
        """Load the VAD and, for ``semantic_vad``, Whisper and the end-of-turn model."""
        await self.vad.warmup()
        if semantic:
            from hark.engines.asr.whisper import WhisperAsr
            from hark.engines.turn.llama_cpp import LlamaCppEndOfTurn

            self._asr = WhisperAsr()
            self._turn = LlamaCppEndOfTurn()
            await self._asr.warmup()
            await self._turn.warmup()

    async def aclose(self) -> None:
        """Free the models."""
        await self.vad.aclose()
        if self._asr is not None:
            self._asr.close()
        if self._turn is not None:
            await self._turn.aclose()

    @property
    def asr_rate(self) -> int:
        """The rate recognition takes."""
        return 16000 if self._asr is None else int(self._asr.sample_rate)

    async def vad_answers(self, fixture: Fixture, chunk: int) -> list[float]:
        """Silero's probability for each ``chunk`` samples of the fixture, from a fresh
        stream: what the session's VAD feed would get, since every run feeds the same audio."""
        known = self._vad_answers.get(fixture.name)
        if known is not None:
            return known
        rows = fixture.pcm[: len(fixture.pcm) // chunk * chunk].reshape(-1, chunk)
        answers: list[float] = []
        loop = asyncio.get_running_loop()
        waiting: asyncio.Future[list[Any]] = loop.create_future()

        def answered(outcomes: list[Any]) -> None:
            if not waiting.done():
                waiting.set_result(outcomes)

        stream = self.vad.open_stream(answered)
        try:
            for first in range(0, len(rows), _VAD_PUSH_ROWS):
                waiting = loop.create_future()
                stream.push(rows[first : first + _VAD_PUSH_ROWS], 0)
                for outcome, _ in await waiting:
                    if not isinstance(outcome, float):
                        raise BenchError(f"the VAD missed a chunk of {fixture.name}: {outcome}")
                    answers.append(outcome)
        finally:
            stream.close()
        self._vad_answers[fixture.name] = answers
        return answers

    async def recognise(self, request: Any) -> tuple[Any, float]:
        """Whisper's words for a step, and the delay they reach the session after."""
        digest = hashlib.sha256(request.audio.tobytes())
        digest.update(f"\n{request.prompt}\n{request.language}".encode())
        key = digest.hexdigest()
        if key not in self._heard:
            started = time.perf_counter()
            transcript = await self._asr.recognise(request)
            took = (time.perf_counter() - started) * 1000
            self.asr_ms.append(took)
            self._heard[key] = (transcript, took)
        transcript, took = self._heard[key]
        return transcript, took if self.asr_delay_ms is None else self.asr_delay_ms

    async def judge(self, transcript: str, context: str | None) -> tuple[float, float]:
        """The end-of-turn model's probability, and the delay it reaches the session after."""
        key = (transcript, context)
        if key not in self._judged:
            started = time.perf_counter()
            probability = float(await self._turn.probability(transcript, context=context))
            took = (time.perf_counter() - started) * 1000
            self.eot_ms.append(took)
            self._judged[key] = (probability, took)
        probability, took = self._judged[key]
        return probability, took if self.eot_delay_ms is None else self.eot_delay_ms


async def run_fixture(fixture: Fixture, setting: Setting, engines: Engines) -> Run:
    """Play ``fixture`` into a session with ``setting``'s turn detection, 20 ms at a time on
    the sample clock, answering its actions with ``engines``; stops once the turn has
    ended after its labelled end."""
    from hark.engines.vad import CHUNK_MS, chunk_samples
    from hark.protocol import server_events as se
    from hark.session.actions import AnalyzeSpeech, CancelRecognition, Recognise, ScoreTurn
    from hark.session.core import Session
    from hark.session.ids import IdGenerator

    chunk = chunk_samples(RATE)
    answers = await engines.vad_answers(fixture, chunk)
    session = Session(
        model="gpt-realtime",
        ids=IdGenerator(seed=0),
        vad_chunk_ms=CHUNK_MS,
        asr_rate=engines.asr_rate,
    )
    session.start()
    run = Run()
    clock = 0.0
    answered = 0
    order = itertools.count()
    # Results on their way back: (due on the sample clock, order, request id, deliver).
    pending: list[tuple[float, int, str, Callable[[], None]]] = []
    semantic = setting.detector == "semantic_vad"

    async def handle() -> None:
        nonlocal answered
        outputs = session.drain()
        while outputs:
            for out in outputs:
                if type(out) is AnalyzeSpeech:
                    for _ in range(len(out.chunks)):
                        if answered >= len(answers):
                            raise BenchError(f"{fixture.name}: more VAD chunks than the audio")
                        session.handle(VadScored(answers[answered], out.epoch), now=clock / 1000)
                        answered += 1
                elif isinstance(out, se.SpeechStarted):
                    run.starts.append(float(out.audio_start_ms))
                elif isinstance(out, se.SpeechStopped):
                    run.stops.append(float(out.audio_end_ms))
                elif isinstance(out, se.Error):
                    raise BenchError(f"{fixture.name}: the session said {out.error}")
                elif semantic and isinstance(out, Recognise) and ":final" not in out.request_id:
                    await recognise(out)
                elif isinstance(out, CancelRecognition):
                    pending[:] = [p for p in pending if p[2] != out.request_id]
                    heapq.heapify(pending)
                elif semantic and isinstance(out, ScoreTurn):
                    await judge(out)
            outputs = session.drain()

    async def recognise(action: Any) -> None:
        transcript, delay = await engines.recognise(action.request)
        heapq.heappush(
            pending,
            (
                clock + delay,
                next(order),
                action.request_id,
                lambda: session.handle(Recognised(action.request_id, transcript), now=clock / 1000),
            ),
        )

    async def judge(action: Any) -> None:
        probability, delay = await engines.judge(action.transcript, action.context)
        asked = clock
        run.verdicts.append(
            Verdict(action.transcript, action.context, probability, asked, asked + delay)
        )
        heapq.heappush(
            pending,
            (
                clock + delay,
                next(order),
                action.key,
                lambda: session.handle(TurnScored(action.key, probability), now=clock / 1000),
            ),
        )

    update = {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {
                "input": {
                    "transcription": {"model": "whisper-1", "language": "en"},
                    "turn_detection": setting.turn_detection(),
                }
            },
        },
    }
    session.receive(json.dumps(update), now=0.0)
    context = fixture.spec.turn.context
    if context is not None:
        item = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": context}],
        }
        session.receive(json.dumps({"type": "conversation.item.create", "item": item}), now=0.0)
    await handle()
    frame = RATE * FRAME_MS // 1000
    end = fixture.labels.end_ms
    for offset in range(0, len(fixture.pcm), frame):
        clock = offset * 1000 / RATE
        while pending and pending[0][0] <= clock:
            heapq.heappop(pending)[3]()
            await handle()
        if any(stop >= end for stop in run.stops):
            break
        session.append_audio(fixture.pcm[offset : offset + frame], now=clock / 1000)
        clock = (offset + frame) * 1000 / RATE
        await handle()
    return run


# ---------------------------------------------------------------------------- the benchmark


def settings(eagerness: Sequence[str], silences_ms: Sequence[int]) -> list[Setting]:
    """The settings to run: each eagerness, then each silence."""
    return [Setting("semantic_vad", eagerness=e) for e in eagerness] + [
        Setting("server_vad", silence_ms=s) for s in silences_ms
    ]


async def measure(
    fixtures: Sequence[FixtureSpec],
    to_run: Sequence[Setting],
    *,
    lead_ms: int,
    tail_ms: int,
    budget: float = BUDGET,
    asr_delay_ms: float | None = None,
    eot_delay_ms: float | None = None,
    cache_dir: Path | None = None,
    synthesiser: Synthesiser | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Synthesise the fixtures (with ``synthesiser``, by default one caching in
    ``cache_dir``), run every setting over them and build the report."""
    if not fixtures or not to_run:
        raise BenchError("nothing to run: no fixtures or no settings")
    load_before = os.getloadavg()
    synthesiser = synthesiser or Synthesiser(cache_dir)
    made = [await synthesiser.fixture(f, lead_ms, tail_ms) for f in fixtures]
    engines = Engines(asr_delay_ms, eot_delay_ms)
    started = time.perf_counter()
    points: list[Point] = []
    rows: list[dict[str, Any]] = []
    verdicts: list[tuple[Fixture, Verdict]] = []
    try:
        await engines.load(any(s.detector == "semantic_vad" for s in to_run))
        for setting in to_run:
            outcomes = []
            for fixture in made:
                run = await run_fixture(fixture, setting, engines)
                outcome = score(fixture.labels, run.stops)
                outcomes.append(outcome)
                verdicts.extend((fixture, v) for v in run.verdicts)
                rows.append(_row(fixture, setting, run, outcome))
            pauses = [len(f.labels.pauses) for f in made]
            point = summarise(setting.name, outcomes, pauses, float(tail_ms))
            points.append(point)
            if progress is not None:
                progress(_point_line(point))
    finally:
        await engines.aclose()
    load_after = os.getloadavg()
    report: dict[str, Any] = {
        "benchmark": "turns",
        "spec": SPEC_PATH.name,
        "fixtures": len(made),
        "paused_fixtures": sum(bool(f.labels.pauses) for f in made),
        "voices": sorted({f.voice.name for f in fixtures}),
        "budget": budget,
        "delays": {
            "asr_ms": "measured" if asr_delay_ms is None else asr_delay_ms,
            "eot_ms": "measured" if eot_delay_ms is None else eot_delay_ms,
        },
        "model_ms": {
            "asr": _spread(engines.asr_ms),
            "eot": _spread(engines.eot_ms),
        },
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in load_after],
        },
        "cpus": os.cpu_count(),
        "run_s": round(time.perf_counter() - started, 1),
        "points": [p.to_json() for p in points],
        "frontier": [p.setting for p in frontier(points)],
        "operating_points": {},
        "fixture_runs": rows,
    }
    for detector in ("semantic_vad", "server_vad"):
        family = [p for p in points if p.setting.startswith(detector)]
        best = operating_point(family, budget) if family else None
        if family:
            report["operating_points"][detector] = None if best is None else best.to_json()
    everyone = operating_point(points, budget)
    report["operating_points"]["any"] = None if everyone is None else everyone.to_json()
    report["by"] = breakdown(rows)
    if verdicts:
        report["verdicts"] = await _verdict_figures(verdicts)
    return report


def breakdown(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """For each setting, the false cut-off rate and the dead air p50 of the fixtures of each
    voice, each kind of turn, each rate and each noise level."""
    groups: dict[str, dict[str, dict[str, list[Mapping[str, Any]]]]] = {}
    for row in rows:
        _, voice, rate, noise = row["fixture"].split("/")
        by = groups.setdefault(row["setting"], {})
        for name, value in (
            ("voice", voice),
            ("kind", row["kind"]),
            ("rate", rate),
            ("noise", noise),
        ):
            by.setdefault(name, {}).setdefault(value, []).append(row)
    return {
        setting: {
            name: {
                value: {
                    "fixtures": len(members),
                    "false_cutoff_rate": round(
                        sum(bool(m["false_cutoff"]) for m in members) / len(members), 3
                    ),
                    "dead_air_p50_ms": _round(
                        percentile([m["dead_air_ms"] for m in members], 50)
                        if all(m["dead_air_ms"] is not None for m in members)
                        else None,
                        1,
                    ),
                }
                for value, members in sorted(values.items())
            }
            for name, values in by.items()
        }
        for setting, by in groups.items()
    }


async def _verdict_figures(verdicts: Sequence[tuple[Fixture, Verdict]]) -> dict[str, Any]:
    """The model's verdicts on what Whisper heard, scored as the text evaluation scores
    them: a pause before the labelled end is an incomplete utterance, one after it complete."""
    from functools import partial

    from hark.engines.turn.evaluation import Example, evaluate
    from hark.session.turn_policy import END_FAST_PROBABILITY, silence_for

    recorded: dict[tuple[str, str | None], float] = {}
    examples: dict[tuple[str, str | None, bool], Example] = {}
    for fixture, verdict in verdicts:
        complete = verdict.asked_ms >= fixture.labels.end_ms
        recorded[(verdict.transcript, verdict.context)] = verdict.probability
        key = (verdict.transcript, verdict.context, complete)
        examples.setdefault(key, Example(verdict.transcript, complete, "bench", verdict.context))
    figures: dict[str, Any] = {"distinct": len(examples)}
    for eagerness in EAGERNESS:
        result = await evaluate(
            _Recorded(recorded),
            list(examples.values()),
            wait_ms=partial(silence_for, eagerness=eagerness),
            fast_probability=END_FAST_PROBABILITY,
        )
        figures[eagerness] = {
            "accuracy": round(result.accuracy, 3),
            "complete_ended_fast": round(result.fast_complete_rate, 3),
            "incomplete_cut_fast": round(result.false_cut_rate, 3),
            "incomplete_cut_by_a_1200ms_pause": round(result.pause_cut_rate, 3),
        }
    return figures


class _Recorded:
    """An end-of-turn engine that answers with the probabilities the bench recorded."""

    def __init__(self, recorded: Mapping[tuple[str, str | None], float]) -> None:
        self._recorded = recorded

    async def probability(self, transcript: str, *, context: str | None = None) -> float:
        return self._recorded[(transcript, context)]

    async def warmup(self) -> None:
        return None


def _row(fixture: Fixture, setting: Setting, run: Run, outcome: Outcome) -> dict[str, Any]:
    return {
        "fixture": fixture.name,
        "kind": fixture.spec.turn.kind,
        "setting": setting.name,
        "end_ms": round(fixture.labels.end_ms, 1),
        "pauses_ms": [[round(a, 1), round(b, 1)] for a, b in fixture.labels.pauses],
        "stops_ms": run.stops,
        "false_cutoff": outcome.cut,
        "dead_air_ms": _round(outcome.dead_air_ms, 1),
        "verdicts": [
            {
                "heard": v.transcript,
                "p": round(v.probability, 3),
                "asked_ms": round(v.asked_ms, 1),
                "answered_ms": round(v.answered_ms, 1),
            }
            for v in run.verdicts
        ],
    }


def _spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"calls": 0}
    return {
        "calls": len(values),
        "p50": round(percentile(values, 50), 1),
        "p95": round(percentile(values, 95), 1),
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _point_line(point: Mapping[str, Any] | Point) -> str:
    p = point.to_json() if isinstance(point, Point) else point
    dead = p["dead_air_ms"]
    missed = f"  missed {p['missed']}" if p["missed"] else ""
    return (
        f"{p['setting']:<22} {100 * p['false_cutoff_rate']:>6.1f} %"
        f" {dead['p50']:>8.0f} {dead['p95']:>8.0f} {dead['mean']:>8.0f}{missed}"
    )


def summary(report: Mapping[str, Any]) -> str:
    """The curve and the operating points, for people."""
    delays = report["delays"]
    lines = [
        f"Turn-taking on {report['fixtures']} fixtures ({report['paused_fixtures']} with "
        f"mid-utterance pauses), voices {', '.join(report['voices'])}; model answers delayed "
        f"by ASR {delays['asr_ms']} / end-of-turn {delays['eot_ms']} ms; load average "
        f"{report['load_average']['before'][0]} → {report['load_average']['after'][0]} on "
        f"{report['cpus']} CPUs",
        f"{'setting':<22} {'cut-offs':>8} {'dead air p50':>12} {'p95':>8} {'mean':>8}  (ms)",
    ]
    lines += [_point_line(p) for p in report["points"]]
    lines.append(f"Pareto frontier: {', '.join(report['frontier'])}")
    budget = 100 * report["budget"]
    for detector, point in report["operating_points"].items():
        if point is None:
            lines.append(f"at ≤ {budget:g} % false cut-offs, {detector}: no setting")
        else:
            dead = point["dead_air_ms"]
            lines.append(
                f"at ≤ {budget:g} % false cut-offs, {detector}: {point['setting']}, dead air "
                f"p50 {dead['p50']:.0f} ms, mean {dead['mean']:.0f} ms "
                f"({100 * point['false_cutoff_rate']:.1f} % cut off)"
            )
    for name, spread in report["model_ms"].items():
        if spread["calls"]:
            lines.append(
                f"{name} per call: p50 {spread['p50']:.0f} ms, p95 {spread['p95']:.0f} ms "
                f"({spread['calls']} distinct calls)"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the command


OPTIONS: tuple[BenchOption | str, ...] = (
    list_option(
        "eagerness",
        "semantic_vad eagerness values to run, comma-separated (default all; '' none)",
        EAGERNESS,
    ),
    list_option(
        "silences",
        "server_vad silence durations in ms, comma-separated ('' none)",
        SILENCES_MS,
    ),
    BenchOption("voices", "only these voices of the spec", metavar="LIST"),
    BenchOption("turns", "only these turns (ids)", metavar="LIST"),
    BenchOption(
        "budget", f"the false cut-off rate of the operating point (default {BUDGET})", float, BUDGET
    ),
    *(
        BenchOption(
            f"{name}_delay_ms",
            f"how late {what} answers reach the session on the sample clock: 'measured' "
            "(the time the model took, default) or fixed milliseconds (deterministic)",
            str,
            "measured",
            metavar="MS",
        )
        for name, what in (("asr", "Whisper's"), ("eot", "the end-of-turn model's"))
    ),
    BenchOption(
        "cache_dir", "where synthesised segments are kept (default ~/.cache/hark/bench)", Path
    ),
    BenchOption(
        "backchannels",
        "instead of end-of-turn detection, measure backchannels said over a playing "
        "reply (false barge-ins) and interruptions (stop latency) over these transports, "
        "comma-separated: websocket, webrtc, sip (hark.bench.backchannels)",
        metavar="TRANSPORTS",
    ),
    BenchOption(
        "backchannels_off",
        "with --backchannels: the sessions set hark_backchannels false (the baseline)",
        None,
    ),
    "json",
)


@dataclass(frozen=True)
class TurnsBenchConfig:
    """What ``hark bench turns`` measures: the fixtures, the settings and the delays."""

    fixtures: tuple[FixtureSpec, ...]
    to_run: tuple[Setting, ...]
    lead_ms: int
    tail_ms: int
    budget: float
    asr_delay_ms: float | None
    eot_delay_ms: float | None
    cache_dir: Path | None


@dataclass(frozen=True)
class BackchannelsBenchConfig:
    """What ``hark bench turns --backchannels`` measures (see ``hark.bench.backchannels``)."""

    transports: tuple[str, ...]
    voices: tuple[str, ...] | None
    backchannels: bool


def turns_config(options: dict[str, Any]) -> TurnsBenchConfig | BackchannelsBenchConfig:
    """The config of the parsed options: the turns' or, with ``--backchannels``, theirs."""
    voices = _names(options["voices"])
    if options.get("backchannels"):
        return BackchannelsBenchConfig(
            tuple(_names(options["backchannels"]) or ()),
            None if voices is None else tuple(voices),
            not options["backchannels_off"],
        )
    spec = load_spec()
    eagerness = _names(options["eagerness"]) or []
    unknown = set(eagerness) - set(EAGERNESS)
    if unknown:
        raise BenchError(f"unknown eagerness: {', '.join(sorted(unknown))}")
    silences = [int(s) for s in _names(options["silences"]) or []]
    if any(s <= 0 for s in silences):
        raise BenchError("silences are positive milliseconds")
    return TurnsBenchConfig(
        fixtures=tuple(fixture_specs(spec, voices, _names(options["turns"]))),
        to_run=tuple(settings(eagerness, silences)),
        lead_ms=spec.lead_ms,
        tail_ms=spec.tail_ms,
        budget=float(options["budget"]),
        asr_delay_ms=_delay(options["asr_delay_ms"]),
        eot_delay_ms=_delay(options["eot_delay_ms"]),
        cache_dir=options["cache_dir"],
    )


def run(config: TurnsBenchConfig | BackchannelsBenchConfig) -> Result:
    """Measure; the report and its summary."""
    if isinstance(config, BackchannelsBenchConfig):
        from hark.bench import backchannels

        report = backchannels.run(config.transports, config.voices, config.backchannels)
        return Result(report, backchannels.summary(report))
    progress = functools.partial(print, file=sys.stderr, flush=True)
    report = asyncio.run(measure(**arguments(config), progress=progress))
    return Result(report, summary(report))


BENCH = Bench("turns", OPTIONS, turns_config, run)
configure_parser, command = BENCH.configure_parser, BENCH.command


def _names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _delay(value: str) -> float | None:
    if value == "measured":
        return None
    delay = float(value)
    if delay < 0 or math.isnan(delay):
        raise BenchError(f"a delay is 'measured' or milliseconds at least 0, not {value!r}")
    return delay

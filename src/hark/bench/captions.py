"""``hark bench captions``: live captions of people speaking at length, and the reply after.

Each of ``--speakers`` clients opens a Realtime session through the official ``openai`` SDK
with ``audio.input.transcription`` set and ``server_vad``, and streams audio in real time in
20 ms chunks: silence, or a monologue. A monologue is a run of sentences that Piper says
(the piper extra's voice, cached like the latency bench's questions), 300 ms apart, so that
server VAD keeps it one turn; its length is the first sentences that last ``--seconds``.
All speakers say each length at once, then the next length.

Four figures:

- **Caption lag**: for each word of the reference text, from the moment the client sent
  the chunk holding the word's last sample to the moment it received the
  ``conversation.item.input_audio_transcription.delta`` that completed the word. A word's
  time in the sent audio comes from the embedded Whisper's word times on each sentence
  as Piper said it (Piper's own phoneme timing needs a patched voice), aligned to the
  reference words; the time a sentence starts in the monologue is known exactly. Only the
  words the captions got right count (a misheard word counts in the word error rate).
- **ASR CPU per second of speech**: the server process's CPU time (``--server-pid``, or the
  server the bench started) while the speakers say one length and until their transcripts
  are complete, less the idle rate over that time (measured first, every session streaming
  silence: the median of one-second windows once the sessions have settled), divided by
  the seconds of speech said. These turns ask for no reply (``create_response: false``),
  so the figure is recognition and VAD only.
- **Word error rate** of the completed transcripts (``…completed``) against the reference,
  over all the words of a length.
- **V2V** of each length: then every speaker says each monologue again with replies on,
  each time on a new session (so that the reply reads that monologue and nothing before);
  from sending the chunk that holds the last voiced sample to receiving the reply's first
  ``response.output_audio.delta`` (as ``hark bench latency`` measures it). The reply is
  cancelled once its first audio comes: the figure is its start.

Without ``--url`` the bench starts ``hark serve`` on a free loopback port itself (with
``--engines`` when given) and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hark.bench.command import Bench, Result, config_from
from hark.bench.local_server import local_server
from hark.bench.microphone import CHUNK_S, Microphone
from hark.bench.monologues import MONOLOGUE, SENTENCE_GAP_S, Monologue, monologues
from hark.bench.report import (
    DEFAULT_API_KEY,
    BenchError,
    ServerUrl,
    api_key,
    cpu_seconds,
    host_figures,
    load_average,
    percentile,
    percentiles,
    report_head,
    rounded,
)
from hark.bench.spoken_questions import RATE, audio_session
from hark.bench.word_alignment import Delta, align, caption_lags, words
from hark.config.options import BenchOption, shared

if TYPE_CHECKING:
    from openai.resources.realtime.realtime import AsyncRealtimeConnection

_LOG = logging.getLogger(__name__)

TRANSCRIPTION_MODEL = "whisper-1"
# Speakers start this far apart at most (randomly), so that they do not speak in lockstep.
_START_SPREAD_S = 0.5
_QUANTILES = (50, 95)
# Events a speaker holds unread at most (a 40 s turn brings a few hundred).
_MAX_EVENTS = 4096
# New sessions may still be setting up (the reply model reading the instructions) this long.
_SETTLE_S = 2.0


class TurnTimeoutError(BenchError):
    """A turn's transcript or reply never came."""


# ---------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class CaptionsBenchConfig:
    """What to measure and how.

    ``url``: the server's WebSocket root, or ``None`` to start ``hark serve`` (with
    ``engines`` when given); ``server_pid``: the server's process for its CPU time (known
    when the bench starts it); ``lengths_s``: the monologues' lengths; ``repeat``: how many
    times each speaker says each; ``v2v``: whether to measure the replies too; ``captions``:
    whether to measure the captions (without, only the replies: a 5 s and a 40 s turn's V2V
    compared, the lengths taken in turn).
    """

    url: str | None = None
    speakers: int = 1
    lengths_s: tuple[float, ...] = (5.0, 40.0)
    repeat: int = 1
    silence_ms: int = 500
    api_key: str = DEFAULT_API_KEY
    model: str = "gpt-realtime"
    transcription_model: str = TRANSCRIPTION_MODEL
    server_pid: int | None = None
    engines: str | None = None
    sentences: tuple[str, ...] = MONOLOGUE
    baseline_s: float = 5.0
    v2v: bool = True
    captions: bool = True
    seed: int = 0
    turn_timeout_s: float = 60.0
    cache_dir: Path | None = None

    def parameters(self) -> dict[str, Any]:
        """The run's parameters as JSON (without the API key)."""
        return {
            "url": self.url,
            "speakers": self.speakers,
            "lengths_s": list(self.lengths_s),
            "repeat": self.repeat,
            "turn_detection": {"type": "server_vad", "silence_duration_ms": self.silence_ms},
            "model": self.model,
            "transcription_model": self.transcription_model,
            "engines": self.engines,
            "baseline_s": self.baseline_s,
            "v2v": self.v2v,
            "captions": self.captions,
            "seed": self.seed,
            "chunk_ms": CHUNK_S * 1000,
            "sentence_gap_ms": SENTENCE_GAP_S * 1000,
            "word_times": "embedded Whisper word times on each sentence, aligned to its text",
        }


@dataclass
class CaptionTurn:
    """One monologue as one speaker said it, with what came back (times in ms from the
    first chunk of the monologue sent)."""

    speaker: int
    length_s: float
    duration_s: float
    reference: str
    # When the chunk holding each reference word's last sample was sent (None: untimed).
    word_spoken_ms: list[float | None]
    # Every delta: [arrival ms, text], in arrival order, the turn's items one after another.
    deltas: list[tuple[float, str]]
    transcript: str
    # When the chunk holding the last voiced sample was sent.
    speech_end_ms: float
    # Each reference word's caption lag, None where the captions missed it.
    lags_ms: list[float | None] = field(default_factory=list)
    wer: float = 0.0
    errors: int = 0
    items: int = 0

    def compute(self) -> None:
        """The lags and the word error rate, from the recorded events."""
        reference = words(self.reference)
        deltas = [Delta(at, text) for at, text in self.deltas]
        lags = caption_lags(reference, self.word_spoken_ms, deltas)
        self.lags_ms = [None if lag is None else round(lag, 1) for lag in lags]
        alignment = align(reference, words(self.transcript))
        self.wer = round(alignment.wer, 4)
        self.errors = alignment.errors


@dataclass
class ReplyTurn:
    """One monologue said with replies on: its V2V (ms), or why there is none."""

    speaker: int
    length_s: float
    status: str
    v2v_ms: float | None = None


@dataclass
class LengthCpu:
    """The server's CPU over one length's caption turns."""

    length_s: float
    cpu_s: float
    wall_s: float
    speech_s: float


@dataclass
class CaptionsReport:
    """A finished run."""

    config: CaptionsBenchConfig
    captions: list[CaptionTurn]
    replies: list[ReplyTurn]
    cpu: list[LengthCpu]
    # The server's CPU (cores) while every session streamed silence; None without its pid.
    baseline_cores: float | None
    started_at: float
    duration_s: float
    host: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Per length: caption lag p50/p95, WER, ASR CPU per speech-second, V2V p50/p95."""
        by_length: dict[str, Any] = {}
        for length in self.config.lengths_s:
            turns = [t for t in self.captions if t.length_s == length]
            lags = [lag for t in turns for lag in t.lags_ms if lag is not None]
            reference_words = sum(len(words(t.reference)) for t in turns)
            errors = sum(t.errors for t in turns)
            v2v = [r.v2v_ms for r in self.replies if r.length_s == length and r.v2v_ms is not None]
            by_length[f"{length:g}"] = {
                "turns": len(turns),
                "speech_s": round(sum(t.duration_s for t in turns), 2),
                "words": reference_words,
                "captioned_words": len(lags),
                "caption_lag_ms": percentiles(lags, _QUANTILES, 1),
                "deltas_before_speech_end": sum(
                    1 for t in turns for at, _ in t.deltas if at < t.speech_end_ms
                ),
                "wer": rounded(errors / reference_words, 4) if reference_words else None,
                "asr_cpu_s_per_speech_s": self._cpu_per_speech_s(length),
                "v2v_ms": percentiles(v2v, _QUANTILES, 1),
                "replies": len([r for r in self.replies if r.length_s == length]),
                "replies_heard": len(v2v),
            }
        all_lags = [lag for t in self.captions for lag in t.lags_ms if lag is not None]
        return {
            "speakers": self.config.speakers,
            "caption_lag_ms": percentiles(all_lags, _QUANTILES, 1),
            "baseline_cpu_cores": rounded(self.baseline_cores, 3),
            "by_length": by_length,
        }

    def _cpu_per_speech_s(self, length: float) -> float | None:
        if self.baseline_cores is None:
            return None
        windows = [c for c in self.cpu if c.length_s == length]
        speech = sum(c.speech_s for c in windows)
        if not speech:
            return None
        used = sum(c.cpu_s - self.baseline_cores * c.wall_s for c in windows)
        return round(used / speech, 4)

    def to_json(self) -> dict[str, Any]:
        """Parameters, summary, and every turn's raw events and figures."""
        return {
            **report_head("captions", self.started_at, self.duration_s, self.host),
            "parameters": self.config.parameters(),
            "summary": self.summary(),
            "cpu": [asdict(c) for c in self.cpu],
            "captions": [asdict(t) for t in self.captions],
            "replies": [asdict(r) for r in self.replies],
        }


def format_summary(report: CaptionsReport) -> str:
    """Per length: caption lag, WER, ASR CPU and V2V, for people."""
    summary = report.summary()
    speakers = f"{report.config.speakers} speaker{'s' if report.config.speakers != 1 else ''}"
    lines = [
        f"hark bench captions: {speakers}, server_vad {report.config.silence_ms} ms, "
        f"{report.duration_s:.0f} s",
    ]
    if (before := report.host.get("load_1m_before")) is not None:
        after = report.host.get("load_1m_after")
        lines.append(f"host: {report.host.get('cpus')} CPUs, load average {before} → {after}")
    lines.append(
        f"{'turn':<8}{'lag p50':>9}{'lag p95':>9}{'words':>12}{'WER':>8}"
        f"{'CPU s/s':>9}{'V2V p50':>9}{'V2V p95':>9}"
    )
    for length, row in summary["by_length"].items():
        lag, v2v = row["caption_lag_ms"], row["v2v_ms"]
        lines.append(
            f"{length + ' s':<8}{_cell(lag['p50'])}{_cell(lag['p95'])}"
            f"{row['captioned_words']:>6}/{row['words']:<5}"
            f"{_cell(row['wer'], '.1%', 8)}{_cell(row['asr_cpu_s_per_speech_s'], '.3f')}"
            f"{_cell(v2v['p50'])}{_cell(v2v['p95'])}"
        )
    lines.append(
        "lag and V2V in ms; words: captioned right / said; CPU s/s: the server's ASR CPU "
        "seconds per second of speech"
    )
    return "\n".join(lines)


def _cell(value: float | None, spec: str = ".0f", width: int = 9) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


async def run_captions_bench(
    config: CaptionsBenchConfig, progress: Callable[[str], None] | None = None
) -> CaptionsReport:
    """Run the bench against ``config.url`` (which must be set; ``command`` starts a server
    when it is not); ``progress`` gets a line after each length."""
    if config.url is None:
        raise BenchError("no server URL")
    if config.speakers < 1 or config.repeat < 1 or not config.lengths_s:
        raise BenchError("--speakers and --repeat must be at least 1, --seconds not empty")
    said = await monologues(config.lengths_s, config.sentences, config.cache_dir)
    load_before = load_average()
    started_at, started = time.time(), time.perf_counter()
    captions: list[CaptionTurn] = []
    replies: list[ReplyTurn] = []
    cpu: list[LengthCpu] = []
    async with contextlib.AsyncExitStack() as stack:
        speakers = [
            await stack.enter_async_context(_Speaker.open(index, config))
            for index in range(config.speakers)
        ]
        baseline = await _idle_cores(config.server_pid, config.baseline_s)
        for length in config.lengths_s if config.captions else ():
            for _ in range(config.repeat):
                before, wall = _server_cpu(config.server_pid), time.perf_counter()
                turns = await asyncio.gather(*(s.caption(said[length], length) for s in speakers))
                after = _server_cpu(config.server_pid)
                if before is not None and after is not None:
                    speech = sum(t.duration_s for t in turns)
                    window = time.perf_counter() - wall
                    cpu.append(
                        LengthCpu(length, round(after - before, 3), round(window, 3), speech)
                    )
                captions.extend(turns)
            if progress is not None:
                progress(f"captions of {length:g} s: {len(speakers) * config.repeat} turns")
    if config.v2v:
        # The lengths in turn, not each length's repeats together: a machine whose load drifts
        # during the run then weighs on every length alike.
        for round_ in range(config.repeat):
            for length in config.lengths_s:
                heard = await asyncio.gather(
                    *(_reply(i, config, said[length], length) for i in range(config.speakers))
                )
                replies.extend(heard)
                if progress is not None:
                    v2v = ", ".join(f"{r.v2v_ms:.0f}" if r.v2v_ms else r.status for r in heard)
                    progress(f"reply {round_ + 1} to {length:g} s: V2V {v2v} ms")
    return CaptionsReport(
        config=config,
        captions=captions,
        replies=replies,
        cpu=cpu,
        baseline_cores=baseline,
        started_at=started_at,
        duration_s=time.perf_counter() - started,
        host=host_figures(load_before),
    )


async def _reply(
    index: int, config: CaptionsBenchConfig, monologue: Monologue, length: float
) -> ReplyTurn:
    """Say ``monologue`` on a new session and time the reply.

    A new session each time, so that the reply's model reads this monologue and nothing
    said before: V2V then differs between lengths by this turn's length only.
    """
    async with _Speaker.open(index, config, replies=True) as speaker:
        return await speaker.reply(monologue, length)


def _server_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        return cpu_seconds(pid)
    except OSError as error:
        raise BenchError(f"cannot read the CPU time of process {pid}: {error}") from error


async def _idle_cores(pid: int | None, seconds: float) -> float | None:
    """The server's idle CPU use in cores (None without its pid): after ``_SETTLE_S``, the
    median of one-second windows over ``seconds``, so that a burst of work left from the
    sessions' set-up does not count as idle."""
    if pid is None:
        return None
    await asyncio.sleep(_SETTLE_S)
    rates = []
    for _ in range(max(1, round(seconds))):
        before, started = cpu_seconds(pid), time.perf_counter()
        await asyncio.sleep(1.0)
        rates.append((cpu_seconds(pid) - before) / (time.perf_counter() - started))
    return percentile(rates, 50)


# ---------------------------------------------------------------------------- one speaker


_CLOSED = "bench.connection_closed"
_DELTA = "conversation.item.input_audio_transcription.delta"
_COMPLETED = "conversation.item.input_audio_transcription.completed"
_FAILED = "conversation.item.input_audio_transcription.failed"


class _Speaker:
    """One person on one Realtime session, saying monologues."""

    def __init__(self, index: int, config: CaptionsBenchConfig, conn: AsyncRealtimeConnection):
        self._index = index
        self._config = config
        self._conn = conn
        self._random = random.Random(config.seed * 1_000_003 + index)
        # Full, the reader stops reading and the server's events wait in the socket.
        self._events: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue(_MAX_EVENTS)
        self._microphone = Microphone(conn.input_audio_buffer.append)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, index: int, config: CaptionsBenchConfig, *, replies: bool = False
    ) -> AsyncIterator[_Speaker]:
        """A connected speaker streaming silence, captions on, replies on when ``replies``."""
        from openai import AsyncOpenAI
        from websockets.exceptions import InvalidHandshake

        assert config.url is not None
        server = ServerUrl.parse(config.url)
        client = AsyncOpenAI(
            api_key=config.api_key,
            base_url=server.http("/v1"),
            websocket_base_url=server.ws("/v1"),
        )
        try:
            async with client.realtime.connect(model=config.model) as conn:
                speaker = cls(index, config, conn)
                reader = asyncio.create_task(speaker._read())
                speaking = asyncio.create_task(speaker._microphone.run())
                try:
                    await speaker.configure(replies=replies)
                    yield speaker
                finally:
                    for task in (speaking, reader):
                        task.cancel()
                    await asyncio.gather(speaking, reader, return_exceptions=True)
        except (OSError, InvalidHandshake) as error:
            raise BenchError(f"cannot connect to {config.url}: {error}") from error
        finally:
            await client.close()

    async def _read(self) -> None:
        """Stamp every server event with its arrival time; the turns read them later."""
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                raw = await self._conn.recv_bytes()
                await self._events.put((time.perf_counter(), json.loads(raw)))
        except ConnectionClosed:
            await self._events.put((time.perf_counter(), {"type": _CLOSED}))

    async def _next(self, until: float) -> tuple[float, dict[str, Any]] | None:
        try:
            item = await asyncio.wait_for(
                self._events.get(), timeout=max(0.0, until - time.perf_counter())
            )
        except TimeoutError:
            return None
        if item[1]["type"] == _CLOSED:
            raise BenchError("the server closed the connection")
        error = item[1].get("error") or {}
        # A reply may end before its cancel arrives: nothing went wrong then.
        if item[1]["type"] == "error" and error.get("code") != "response_cancel_not_active":
            _LOG.warning("speaker %d: server error: %s", self._index, item[1].get("error"))
        return item

    async def configure(self, *, replies: bool) -> None:
        """Captions on, server VAD, and a reply to each turn only when ``replies``."""
        session = audio_session(
            transcription={"model": self._config.transcription_model},
            turn_detection={
                "type": "server_vad",
                "silence_duration_ms": self._config.silence_ms,
                "create_response": replies,
            },
        )
        await self._conn.session.update(session=cast(Any, session))
        deadline = time.perf_counter() + 30
        while (item := await self._next(deadline)) is not None:
            event = item[1]
            if event["type"] == "session.updated":
                return
            if event["type"] == "error":
                raise BenchError(f"session.update refused: {event.get('error')}")
        raise BenchError("no session.updated within 30 s")

    async def _drain(self, seconds: float) -> None:
        """Listen for ``seconds``, dropping what comes (late events of the last turn)."""
        until = time.perf_counter() + seconds
        while await self._next(until) is not None:
            pass

    async def caption(self, monologue: Monologue, length: float) -> CaptionTurn:
        """Say ``monologue`` and collect its captions until every item's transcript is in."""
        await self._drain(self._random.uniform(0, _START_SPREAD_S))
        saying = self._microphone.say(monologue.pcm)
        deadline = time.perf_counter() + monologue.duration_s + self._config.turn_timeout_s
        deltas: list[tuple[float, str, str]] = []
        transcripts: dict[str, str | None] = {}
        in_speech = False
        while not (saying.finished.done() and not in_speech and _all_in(transcripts)):
            item = await self._next(min(deadline, time.perf_counter() + CHUNK_S))
            if item is None:
                if time.perf_counter() >= deadline:
                    raise TurnTimeoutError(
                        f"speaker {self._index}: no complete transcript of a {length:g} s turn "
                        f"within {self._config.turn_timeout_s:g} s"
                    )
                continue
            at, event = item
            kind = event["type"]
            if kind == "input_audio_buffer.speech_started":
                in_speech = True
                transcripts.setdefault(event["item_id"], None)
            elif kind == "input_audio_buffer.speech_stopped":
                in_speech = False
                transcripts.setdefault(event["item_id"], None)
            elif kind == _DELTA:
                transcripts.setdefault(event["item_id"], None)
                deltas.append((at, event["item_id"], event["delta"]))
            elif kind == _COMPLETED:
                transcripts[event["item_id"]] = event["transcript"]
            elif kind == _FAILED:
                transcripts[event["item_id"]] = ""
        first = saying.sent[0]
        order = list(transcripts)
        # An item's deltas are one run of text: the items follow each other, each in order.
        deltas.sort(key=lambda d: order.index(d[1]))
        turn = CaptionTurn(
            speaker=self._index,
            length_s=length,
            duration_s=round(monologue.duration_s, 3),
            reference=monologue.text,
            word_spoken_ms=[
                None if end is None else _ms(saying.at(round(end * RATE) - 1) - first)
                for end in monologue.word_ends
            ],
            deltas=[(_ms(at - first), text) for at, _, text in deltas],
            transcript=" ".join(t.strip() for t in transcripts.values() if t),
            speech_end_ms=_ms(saying.at(monologue.last_voiced) - first),
            items=len(transcripts),
        )
        turn.compute()
        return turn

    async def reply(self, monologue: Monologue, length: float) -> ReplyTurn:
        """Say ``monologue`` and time the reply's first audio; then cancel the reply."""
        await self._drain(self._random.uniform(0, _START_SPREAD_S))
        saying = self._microphone.say(monologue.pcm)
        deadline = time.perf_counter() + monologue.duration_s + self._config.turn_timeout_s
        response_id: str | None = None
        first_audio: float | None = None
        while True:
            item = await self._next(min(deadline, time.perf_counter() + CHUNK_S))
            if item is None:
                if time.perf_counter() >= deadline:
                    return ReplyTurn(self._index, length, "timeout")
                continue
            at, event = item
            kind = event["type"]
            if kind == "response.created" and saying.finished.done():
                response_id = event["response"]["id"]
            elif (
                kind == "response.output_audio.delta"
                and response_id is not None
                and event.get("response_id") == response_id
                and first_audio is None
            ):
                first_audio = at
                await self._conn.response.cancel()
            elif kind == "response.done" and event["response"]["id"] == response_id:
                break
        if first_audio is None:
            return ReplyTurn(self._index, length, "no_audio")
        v2v = _ms(first_audio - saying.at(monologue.last_voiced))
        return ReplyTurn(self._index, length, "heard", v2v)


def _all_in(transcripts: dict[str, str | None]) -> bool:
    """Whether the turn had speech and every item of it has its transcript."""
    return bool(transcripts) and all(t is not None for t in transcripts.values())


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


# ---------------------------------------------------------------------------- the command


def _lengths(value: str) -> tuple[float, ...]:
    try:
        lengths = tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not a list of seconds: {value!r}") from error
    if not lengths or any(length <= 0 for length in lengths):
        raise argparse.ArgumentTypeError(f"seconds must be positive: {value!r}")
    return lengths


OPTIONS: tuple[BenchOption | str, ...] = (
    shared(
        "url",
        required=False,
        help="the server's WebSocket root, e.g. ws://127.0.0.1:8000 (default: start hark serve)",
    ),
    shared("server_pid", help="the --url server's process, for its CPU time (a local server only)"),
    BenchOption("engines", "without --url: the engine preset of the server the bench starts"),
    BenchOption("speakers", "speakers at once, one session each (default 1)", int, 1),
    BenchOption(
        "seconds", "the monologues' lengths, comma-separated (default 5,40)", _lengths, (5.0, 40.0)
    ),
    BenchOption("repeat", "times each speaker says each length (default 1)", int, 1),
    "silence_ms",
    BenchOption(
        "text",
        "the monologues' sentences, one a line (default: the bench's own)",
        Path,
        metavar="FILE",
    ),
    BenchOption(
        "baseline_s",
        "seconds of silence streamed to measure the server's idle CPU (default 5)",
        float,
        5.0,
    ),
    BenchOption("no_v2v", "skip the turns with replies (no V2V figures)", None),
    BenchOption(
        "no_captions",
        "only the turns with replies: V2V per length, the lengths taken in turn",
        None,
    ),
    "api_key",
    "model",
    "json",
    shared("seed", help="seed of the speakers' start times (default 0)"),
)


def captions_config(options: dict[str, Any]) -> CaptionsBenchConfig:
    """The config of ``hark bench captions``'s parsed options."""
    sentences = MONOLOGUE
    if options["text"] is not None:
        lines = options["text"].read_text().splitlines()
        sentences = tuple(line.strip() for line in lines if line.strip())
    config = config_from(
        CaptionsBenchConfig,
        options,
        lengths_s=options["seconds"],
        api_key=api_key(options["api_key"]),
        sentences=sentences,
        v2v=not options["no_v2v"],
        captions=not options["no_captions"],
    )
    if config.url is not None:
        ServerUrl.parse(config.url)
    return config


def run(config: CaptionsBenchConfig) -> Result:
    """Start a server unless ``url`` names one, and measure."""
    with contextlib.ExitStack() as stack:
        if config.url is None:
            url, pid = stack.enter_context(local_server(config.engines))
            config = replace(config, url=url, server_pid=pid)
        report = asyncio.run(run_captions_bench(config, progress=_print))
    return Result(report.to_json(), format_summary(report))


BENCH = Bench("captions", OPTIONS, captions_config, run, errors=(BenchError, OSError))
configure_parser, command = BENCH.configure_parser, BENCH.command


def _print(line: str) -> None:
    print(line, file=sys.stderr)

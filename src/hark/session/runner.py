"""The async driver of one session: feeds the core, runs the engine work it asks for.

Transports hand it client frames and forward what ``outgoing`` yields, or write events the
moment they are made through ``send_with``; they know nothing else. Engine failures fail one
response (or one transcription), never the session. Every input reaches the core with the
wall time, and one timer wakes the core at its ``next_deadline()``; every decision about the
session is the core's, the runner only carries out its actions. It also times every
response's stages (``TurnTimings``) on a monotonic clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from hark.engines.llm import Finished, takes_images
from hark.engines.llm.truncation import ContextOverflow
from hark.engines.registry import Engines
from hark.engines.stage_timeouts import StageTimeoutError, limit
from hark.engines.vad import Missed, Outcomes
from hark.observability.metrics import Metrics
from hark.observability.session_metrics import SessionMetrics
from hark.observability.turn_timing import TurnTimings
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import SessionConfig
from hark.session.actions import (
    AdoptSpeculation,
    AnalyzeSpeech,
    CallMcpTool,
    CancelGeneration,
    CancelRecognition,
    ClearAudio,
    Close,
    CloseMcpServer,
    CountDroppedAudio,
    Denoise,
    DiscardSpeculation,
    FinishAudio,
    Generate,
    HoldAudio,
    ListMcpTools,
    PlayAudio,
    Prefill,
    Recognise,
    ResumeAudio,
    ScoreTurn,
    Speculate,
    Transcribe,
)
from hark.session.core import SESSION_LIMIT_S, MiB, Session
from hark.session.response_pipeline import run_generation

if TYPE_CHECKING:
    from hark.tools.mcp_client import McpClients

log = logging.getLogger(__name__)

# The opt-in (session ``include``) for a ``hark.turn_timings`` event after each response.
TIMINGS_INCLUDE = "hark.turn_timings"
# The most that waits in ``outgoing`` for a peer that does not read (design principle 9): a
# reply of several minutes of audio, made faster than real time for a client on a slow link,
# stays well under both; a client that stops reading passes one within seconds of replies.
MAX_BACKLOG_EVENTS = 10_000
MAX_BACKLOG_BYTES = 16 * MiB
# The reason (``SessionMetrics.ended``) and error code of a session closed for its backlog.
BACKLOG_EXCEEDED = "client_not_reading"
# Long appends are denoised (``Denoise``) on threads of their own, so that uploads never hold
# up what the default executor runs (the /metrics exposition, model loads). Each session has
# at most one job; a closed session's job that has not started is dropped.
_DENOISE_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hark-denoise")
# The most runs of chunks (one per flush) whose arrival waits for the VAD's answer: half a
# minute of audio sent in real time, far more than a working VAD leaves unanswered.
MAX_VAD_WAITING_RUNS = 1024
# The most audio (seconds) of a session waiting for or in the ASR: two full input buffers. A
# client committing audio faster than the ASR hears it would otherwise queue all it sends;
# past this, a request fails at once (its item's transcription failed) and the session goes on.
MAX_TRANSCRIBING_S = 600.0


def backlog_reason(events: int, size: int) -> str:
    """The bounds a peer that stopped reading passed, as told to it."""
    size_limit = f"{size // MiB} MiB" if size % MiB == 0 else f"{size} bytes"
    return f"client is not reading events; backlog over {events} events or {size_limit}"


class AudioPlayer(Protocol):
    """A transport that plays reply audio itself, paced in real time (WebRTC, SIP).

    It reports back through ``SessionRunner.playout_started`` / ``playout_stopped`` /
    ``playout_cleared``.
    """

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        """Queue audio of a response after whatever is queued already."""
        ...

    def finish(self, response_id: str) -> None:
        """No more audio comes for this response; report ``playout_stopped`` once what is
        queued has played."""
        ...

    def clear(self, response_id: str) -> None:
        """Stop this response's audio within one frame and drop what is left of it."""
        ...

    def hold(self, response_id: str) -> None:
        """Send none of this response from the next frame on, keeping its place."""
        ...

    def resume(self, response_id: str) -> None:
        """Go on with a held response from where it was held."""
        ...


class _Arrivals:
    """When the chunks the VAD has not answered yet arrived (monotonic), oldest first.

    Kept as runs of chunks that arrived together, at most ``max_runs`` of them: a VAD that
    stops answering would otherwise make this grow by every chunk a client sends. Past the
    bound, chunks join the newest run, so each answer still takes its own chunk's place and
    only the arrival of those chunks reads earlier than it was.
    """

    __slots__ = ("_max_runs", "_runs")

    def __init__(self, max_runs: int) -> None:
        self._max_runs = max_runs
        # [arrival, chunks]
        self._runs: deque[list[float]] = deque()

    def __len__(self) -> int:
        """Runs waiting."""
        return len(self._runs)

    def add(self, arrived: float, chunks: int) -> None:
        """``chunks`` more, pushed after all that wait."""
        runs = self._runs
        if runs and (runs[-1][0] == arrived or len(runs) >= self._max_runs):
            runs[-1][1] += chunks
        else:
            runs.append([arrived, chunks])

    def pop(self) -> float | None:
        """The oldest chunk's arrival, which stops waiting; None when none waits."""
        runs = self._runs
        if not runs:
            return None
        run = runs[0]
        run[1] -= 1
        if not run[1]:
            runs.popleft()
        return run[0]


@dataclasses.dataclass(slots=True)
class _Speculation:
    key: str
    generate: Generate
    sink: _HeldSink
    task: asyncio.Task[None]


class SessionRunner:
    """Runs one Realtime session on the given engines."""

    def __init__(
        self,
        engines: Engines,
        *,
        model: str,
        initial_config: SessionConfig | None = None,
        transport: str = "websocket",
        clock: Callable[[], float] = time.time,
        player: AudioPlayer | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
        on_usage: Callable[[int], None] | None = None,
        max_duration_s: float = SESSION_LIMIT_S,
        max_backlog_events: int = MAX_BACKLOG_EVENTS,
        max_backlog_bytes: int = MAX_BACKLOG_BYTES,
    ) -> None:
        """``max_duration_s``: the session limit, after which the client gets
        ``session_expired`` and the session ends (OpenAI's 60 minutes unless a test needs
        less). ``max_backlog_events`` / ``max_backlog_bytes``: the most events, and their
        characters, that may wait in ``outgoing``; past either the session ends
        (``send_with``'s ``stalled``)."""
        self.engines = engines
        # Told each finished response's total tokens (the fleet's per-key limits count them).
        self._on_usage = on_usage
        self.transport = transport
        self._clock = clock
        self._now = monotonic
        self._player = player
        self.session = Session(
            model=model,
            config=initial_config,
            created_at=clock(),
            max_duration_s=max_duration_s,
            plays_audio=player is not None,
            vad_chunk_ms=engines.vad.chunk_ms,
            asr_rate=engines.asr.sample_rate,
            takes_images=takes_images(engines.llm),
        )
        self.metrics = (
            metrics.session(transport, self.session.id)
            if metrics is not None
            else SessionMetrics.disabled()
        )
        self._max_backlog_events = max_backlog_events
        self._max_backlog_bytes = max_backlog_bytes
        # Room past the bound for the last error event and the end of the stream.
        self._out: asyncio.Queue[str | None] = asyncio.Queue(max_backlog_events + 2)
        self._out_bytes = 0
        self._send: Callable[[str], bool] | None = None
        self._stalled: Callable[[str], None] | None = None
        # Set once the backlog passed its bound: later events are dropped, the session ends.
        self._overflowed = False
        # When the last sample of each chunk the VAD has not answered yet arrived.
        self._vad_waiting = _Arrivals(MAX_VAD_WAITING_RUNS)
        # When the audio behind the VAD result being handled now arrived.
        self._vad_arrived = 0.0
        self._vad_stream = engines.vad.open_stream(self._on_vad_outcomes)
        # Seconds of audio in the ASR requests running (``MAX_TRANSCRIBING_S``).
        self._transcribing_s = 0.0
        self._generations: dict[str, asyncio.Task[None]] = {}
        # Recognition running (steps and whole items), by request id (CancelRecognition).
        self._recognitions: dict[str, asyncio.Task[None]] = {}
        self._speculation: _Speculation | None = None
        # The LLM's read-ahead: a newer prefill reads all an older one would, so it replaces it.
        self._prefilling: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # The session's MCP connections (made on first use) and its calls, by response id.
        self._mcp: McpClients | None = None
        self._mcp_calls: dict[str, set[asyncio.Task[None]]] = {}
        # The one timer: wakes the core at its next deadline (see ``_arm_timer``).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: float | None = None
        self._closed = False
        self._timings: dict[str, TurnTimings] = {}
        self._turn_end: tuple[float, float] | None = None

    @property
    def id(self) -> str:
        """The session id (``sess_…``)."""
        return self.session.id

    @property
    def generations_running(self) -> int:
        """Responses being generated for this session now (a worker's load)."""
        return len(self._generations)

    async def recognition_idle(self) -> None:
        """Return once no recognition (a step, or an item's audio whole) runs or waits
        (including the steps that finishing ones start)."""
        while self._recognitions:
            await asyncio.wait(list(self._recognitions.values()))

    async def start(self) -> None:
        """Queue ``session.created`` and start the session's background work."""
        self.metrics.started()
        self.session.start()
        self._flush()
        log.info("session %s started (%s)", self.id, self.transport)

    def catch_up(self) -> None:
        """Hand out the VAD results ready for this loop's sessions (this one's and the
        others'), as ``receive_text`` does first; a transport that charges a session for the
        time its input takes calls this before it starts the clock."""
        if not self._closed:
            self._vad_stream.deliver_ready()

    def receive_text(self, text: str) -> None:
        """One client text frame (a JSON event). Never raises.

        Fifty a second per session streaming 20 ms appends: ``_call`` inlined. VAD results
        that are ready go first, to whichever sessions they belong to: on a busy loop their
        own callback would wait behind all the input already received.
        """
        if self._closed:
            return
        self._vad_stream.deliver_ready()
        session = self.session
        try:
            session.receive(text, now=self._clock())
        except Exception:
            self._internal_error()
        self._flush()
        self.metrics.client_event(session.last_event_type)

    def receive_audio(self, pcm: npt.NDArray[np.int16]) -> None:
        """Input audio from a media track, as PCM at ``self.session.input_rate``."""
        if not self._closed:
            self._vad_stream.deliver_ready()
        self._call(self.session.append_audio, pcm)

    def receive_dtmf(self, event: str) -> None:
        """A keypad press from the phone (SIP RFC 4733 events or INFO)."""
        self._call(self.session.receive_dtmf, event)

    def playout_started(self, response_id: str) -> None:
        """The player began a response's audio."""
        self._mark(response_id, "first_audio_sent")
        self._call(self.session.on_playout_started, response_id)

    def playout_stopped(self, response_id: str) -> None:
        """The player finished a response's audio."""
        self._call(self.session.on_playout_stopped, response_id)

    def playout_cleared(self, response_id: str, played_ms: int) -> None:
        """The player dropped the rest of a response after ``played_ms`` of it were heard."""
        self._call(self.session.on_playout_cleared, response_id, played_ms)

    def receive_bytes(self, data: bytes) -> None:
        """One client binary frame: not part of the protocol, answered with an error."""
        self._call(self.session.receive_binary, data)

    def send_with(
        self,
        send: Callable[[str], bool] | None,
        stalled: Callable[[str], None] | None = None,
    ) -> None:
        """Offer each server event to ``send`` first, as soon as it is made.

        ``send`` writes the event and returns True, or returns False (its connection is
        backed up or closing) and the event goes to ``outgoing`` instead; so do all later
        ones while anything waits there, which keeps the order. A task woken per event
        would run only after everything the loop already has queued: tens of milliseconds
        behind a busy loop's pass over every socket. None: everything goes to ``outgoing``.

        ``stalled`` is told, with a reason for the client, when what waits in ``outgoing``
        passes its bound: the events waiting are dropped, ``outgoing`` yields only an
        ``error`` event naming the bound and then ends, and the session closes.
        """
        self._send = send
        self._stalled = stalled

    async def outgoing(self) -> AsyncIterator[str]:
        """Serialised server events, in order; ends when the session is over."""
        while (text := await self._out.get()) is not None:
            self._out_bytes -= len(text)
            yield text

    async def end(self, message: str, code: str, reason: str) -> None:
        """End the session from the server's side (drain, shutdown): the client gets an
        ``error`` event with ``message`` and ``code``, then the session closes."""
        if not self._closed:
            self._call(
                self.session.end, ProtocolError(message, code=code, type="server_error"), reason
            )
        await self.close(reason)

    async def close(self, reason: str = "client_closed") -> None:
        """Stop all engine work of this session. Idempotent; the first ``reason`` counts."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._vad_stream.close()
        self.metrics.ended(reason)
        current = asyncio.current_task()
        pending = [*self._tasks, *self._generations.values()]
        if self._speculation is not None:
            pending.append(self._speculation.task)
        tasks = [t for t in pending if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._mcp is not None:
            await self._mcp.close_all()
        # Cancelled tasks keep their tracebacks, whose frames refer back to this runner: held
        # here, they would keep the session and its audio until the cycle collector runs. So
        # would the transport's callbacks and player, which refer back to the runner.
        self._generations.clear()
        self._recognitions.clear()
        self._mcp_calls.clear()
        self._prefilling = None
        self._speculation = None
        self._timer = None
        self._send = self._stalled = None
        self._player = None
        self._out.put_nowait(None)
        log.info("session %s closed", self.id)

    # ------------------------------------------------------------------ plumbing

    def _call(self, method: Callable[..., None], *args: object) -> None:
        """Call an input of the core with the wall time and carry out what it produced; a
        core bug fails closed."""
        if self._closed:
            return
        try:
            method(*args, now=self._clock())
        except Exception:
            self._internal_error()
        self._flush()

    def _internal_error(self) -> None:
        """A core bug on the last input: logged, and the client told (the session goes on)."""
        log.exception("session %s: internal error", self.id)
        self.session.report_internal_error()

    def _flush(self) -> None:
        if self.session.next_deadline() != self._timer_deadline:
            self._arm_timer()
        outputs = self.session.drain()
        if not outputs:
            return
        arrived = self._now()
        for out in outputs:
            # Audio for the VAD first: it is most of what the core asks for.
            if type(out) is AnalyzeSpeech:
                try:
                    self._vad_stream.push(out.chunks, out.epoch)
                except Exception:
                    # The core slices the chunks itself: a bug, or the engine is shutting down.
                    log.exception("session %s: VAD refused a chunk", self.id)
                else:
                    self._vad_waiting.add(arrived, len(out.chunks))
            elif isinstance(out, se.ServerEvent):
                self._observe(out)
                self.metrics.server_event(out)
                self._emit(se.encode_event(out).decode())
            elif isinstance(out, Recognise):
                self._recognise(out)
            elif isinstance(out, CancelRecognition):
                running = self._recognitions.pop(out.request_id, None)
                if running is not None:
                    running.cancel()
            elif isinstance(out, Transcribe):
                self._recognitions[out.request_id] = self._spawn(
                    self._transcribe(out), f"asr {out.request_id}"
                )
            elif isinstance(out, ScoreTurn):
                self._spawn(self._score_turn(out), f"turn {out.key}")
            elif isinstance(out, Prefill):
                if self._prefilling is not None:
                    # What the older one read stays in the engine's cache.
                    self._prefilling.cancel()
                self._prefilling = self._spawn(self._prefill(out), "prefill")
            elif isinstance(out, Speculate):
                self._speculate(out)
            elif isinstance(out, DiscardSpeculation):
                if self._speculation is not None and self._speculation.key == out.key:
                    self._discard_speculation()
            elif isinstance(out, Generate):
                self._generate(out)
            elif isinstance(out, AdoptSpeculation):
                self._adopt(out)
            elif isinstance(out, CancelGeneration):
                running = self._generations.pop(out.response_id, None)
                if running is not None:
                    running.cancel()
                for call in self._mcp_calls.pop(out.response_id, ()):
                    call.cancel()
            elif isinstance(out, ListMcpTools):
                self._spawn(self._list_mcp_tools(out), f"mcp list {out.server.label}")
            elif isinstance(out, CallMcpTool):
                self._call_mcp_tool(out)
            elif isinstance(out, CloseMcpServer):
                if self._mcp is not None:
                    self._spawn(self._mcp.close(out.label), f"mcp close {out.label}")
            elif isinstance(out, PlayAudio):
                assert self._player is not None
                self._player.play(out.response_id, out.item_id, out.pcm, out.rate)
            elif isinstance(out, FinishAudio):
                assert self._player is not None
                self._player.finish(out.response_id)
            elif isinstance(out, ClearAudio):
                assert self._player is not None
                self._player.clear(out.response_id)
            elif isinstance(out, HoldAudio):
                assert self._player is not None
                self._player.hold(out.response_id)
            elif isinstance(out, ResumeAudio):
                assert self._player is not None
                self._player.resume(out.response_id)
            elif isinstance(out, Denoise):
                self._spawn(self._denoise(out), f"denoise {out.job_id}")
            elif isinstance(out, CountDroppedAudio):
                self.metrics.audio_dropped()
            elif isinstance(out, Close):
                log.info("session %s ends: %s", self.id, out.reason)
                self._spawn(self.close(out.reason), "close")

    def _emit(self, text: str) -> None:
        if self._overflowed:
            return
        send = self._send
        if send is not None and not self._out.qsize() and send(text):
            return
        if (
            self._out.qsize() >= self._max_backlog_events
            or self._out_bytes + len(text) > self._max_backlog_bytes
        ):
            self._overflow()
            return
        self._out_bytes += len(text)
        self._out.put_nowait(text)

    def _overflow(self) -> None:
        """The peer stopped reading: what waits for it is dropped and the session ends.

        The ``error`` event goes out alone, so that a peer that reads again learns why, and
        the session's engine work stops at once rather than making more events nobody reads.
        """
        events, size = self._out.qsize(), self._out_bytes
        self._overflowed = True
        while not self._out.empty():
            self._out.get_nowait()
        self._out_bytes = 0
        reason = backlog_reason(self._max_backlog_events, self._max_backlog_bytes)
        log.warning(
            "session %s: %d events (%d bytes) wait for a client that is not reading: closing",
            self.id,
            events,
            size,
        )
        error = ProtocolError(
            f"The {reason}; the session is closed.",
            code=BACKLOG_EXCEEDED,
            type="invalid_request_error",
        )
        try:
            self.session.end(error, BACKLOG_EXCEEDED, now=self._clock())
        except Exception:
            self._internal_error()
        for out in self.session.drain():
            # Only the error: the cancelled responses' events would never be read.
            if isinstance(out, se.Error):
                self.metrics.server_event(out)
                text = se.encode_event(out).decode()
                self._out_bytes += len(text)
                self._out.put_nowait(text)
        if self._stalled is not None:
            self._stalled(reason)
        self._spawn(self.close(BACKLOG_EXCEEDED), "close")

    def _spawn(self, coro: object, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ timings

    def _observe(self, event: se.ServerEvent) -> None:
        """Follow the turn through the events the core emits."""
        if isinstance(event, se.SpeechStopped):
            self._turn_end = (self._now(), self.session.last_pause_ms)
            self.metrics.vad_decision("speech_stopped", self._vad_arrived)
        elif isinstance(event, se.SpeechStarted):
            self.metrics.vad_decision("speech_started", self._vad_arrived)
        elif isinstance(event, se.ResponseCreated):
            timings = TurnTimings(event.response.id)
            if self._turn_end is not None:
                ended, waited_ms = self._turn_end
                timings.turn_end = ended
                timings.last_voiced = ended - waited_ms / 1000
                self._turn_end = None
            self._timings[event.response.id] = timings
        elif isinstance(event, se.OutputAudioDelta):
            self._mark(event.response_id, "first_audio_sent")
        elif isinstance(event, se.ResponseDone):
            self._response_done(event.response)

    def _mark(self, response_id: str, stage: str, at: float | None = None) -> None:
        timings = self._timings.get(response_id)
        if timings is not None:
            timings.mark(stage, self._now() if at is None else at)

    def _response_done(self, response: se.Response) -> None:
        if self._on_usage is not None and response.usage is not None:
            self._on_usage(response.usage.total_tokens)
        timings = self._timings.pop(response.id, None)
        if timings is None:
            return
        timings.status = response.status
        self.metrics.turn(timings)
        if timings.turn_end is not None:
            log.info(
                "session %s %s %s: e2a %s ms, stages %s",
                self.id,
                response.id,
                response.status,
                timings.e2a_ms,
                timings.since_turn_end_ms(),
            )
        if TIMINGS_INCLUDE in (self.session.config.include or ()):
            body: dict[str, Any] = {
                "type": TIMINGS_INCLUDE,
                "event_id": self.session.ids.new("event"),
                "response_id": response.id,
                "e2a_ms": timings.e2a_ms,
                "v2v_ms": timings.v2v_ms,
                "stages_ms": timings.since_turn_end_ms(),
            }
            self._emit(json.dumps(body))

    # ------------------------------------------------------------------ engine work

    def _on_vad_outcomes(self, outcomes: Outcomes) -> None:
        """The VAD's answers for the oldest chunks pushed and not yet answered: those of one
        push (three for a 100 ms append), and a miss for each chunk dropped before them.

        What they make the core do is carried out once for all of them: flushing the core
        after each answer cost as much again as the answer itself.
        """
        if self._closed:
            return
        now = self._now()
        clock = self._clock()
        session = self.session
        waiting = self._vad_waiting
        for probability, epoch in outcomes:
            arrived = waiting.pop()
            try:
                if isinstance(probability, Missed):
                    if probability.error is None:
                        self.metrics.vad_chunk_dropped()
                    session.on_vad_missed(epoch, probability.error, now=clock)
                else:
                    if arrived is None:
                        arrived = now
                    self.metrics.vad_chunk(arrived, now)
                    self._vad_arrived = arrived
                    session.on_vad(probability, epoch, now=clock)
            except Exception:
                self._internal_error()
        self._flush()

    def _arm_timer(self) -> None:
        """Set the one timer for the core's next deadline (wall time)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self._timer_deadline = self.session.next_deadline()
        if deadline is None or self._closed:
            return
        # The loop's timers run on its monotonic clock and the deadline is wall time: a wall
        # clock slewed or stepped back fires this early, and the core, seeing no deadline
        # passed, keeps it, so the timer is set again for what is left.
        delay = max(0.0, deadline - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._call(self.session.handle_timer)
        if self._timer is None and not self._closed:
            self._arm_timer()

    async def _denoise(self, action: Denoise) -> None:
        # soxr and librnnoise release the GIL: the loop serves other sessions meanwhile. Closing
        # the session cancels the wait; the thread finishes its job and the result is dropped.
        try:
            loop = asyncio.get_running_loop()
            pcm = await loop.run_in_executor(_DENOISE_POOL, action.denoise, action.pcm)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: noise reduction failed", self.id)
            self._call(self.session.on_denoise_failed, action.job_id, str(exc))
            return
        self._call(self.session.on_denoised, action.job_id, pcm)

    def _asr_admits(self, request_id: str, seconds: float) -> bool:
        """Whether ``seconds`` more of the session's audio may go to the ASR (counted until
        its request ends); if not, the request fails now."""
        if self._transcribing_s + seconds <= MAX_TRANSCRIBING_S:
            self._transcribing_s += seconds
            return True
        self._recognitions.pop(request_id, None)
        message = (
            f"Over {MAX_TRANSCRIBING_S:.0f} s of this session's audio already waits for "
            "transcription."
        )
        self._call(self.session.on_transcription_failed, request_id, message)
        return False

    async def _transcribe(self, action: Transcribe) -> None:
        seconds = len(action.audio) / self.engines.asr.sample_rate
        if not self._asr_admits(action.request_id, seconds):
            return
        try:
            await self._run_transcription(action, seconds)
        finally:
            self._transcribing_s -= seconds

    async def _run_transcription(self, action: Transcribe, seconds: float) -> None:
        text = ""
        heard: str | None = None
        try:
            async with limit(self.engines.timeouts.asr_request, "ASR request"):
                if action.language is None:
                    # Told first, so that the transcript is made in a language the session
                    # allows, and the client hears which.
                    heard = await self.engines.asr.detect_language(
                        action.audio, languages=action.languages
                    )
                async for delta in self.engines.asr.transcribe(
                    action.audio, language=action.language or heard, prompt=action.prompt
                ):
                    text += delta
                    self._call(self.session.on_transcription_delta, action.request_id, delta)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            message = self._engine_failed(f"transcription {action.request_id}", exc)
            self._recognitions.pop(action.request_id, None)
            self._call(self.session.on_transcription_failed, action.request_id, message)
            return
        self._recognitions.pop(action.request_id, None)
        self._call(
            self.session.on_transcription_done, action.request_id, text.strip(), seconds, heard
        )

    def _recognise(self, action: Recognise) -> None:
        task: asyncio.Task[None] = asyncio.create_task(
            self._run_recognition(action), name=f"asr {action.request_id}"
        )
        self._recognitions[action.request_id] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_recognition(self, action: Recognise) -> None:
        seconds = len(action.request.audio) / self.engines.asr.sample_rate
        if not self._asr_admits(action.request_id, seconds):
            return
        try:
            await self._recognise_step(action)
        finally:
            self._transcribing_s -= seconds

    async def _recognise_step(self, action: Recognise) -> None:
        try:
            async with limit(self.engines.timeouts.asr_request, "ASR request"):
                transcript = await self.engines.asr.recognise(action.request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            message = self._engine_failed(f"recognition {action.request_id}", exc)
            self._recognitions.pop(action.request_id, None)
            self._call(self.session.on_transcription_failed, action.request_id, message)
            return
        self._recognitions.pop(action.request_id, None)
        self._call(self.session.on_recognised, action.request_id, transcript)

    async def _prefill(self, action: Prefill) -> None:
        try:
            await self.engines.llm.prefill(action.request)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Only an optimisation: the next generation reads the prompt itself.
            log.warning("session %s: LLM prefill failed", self.id, exc_info=True)

    async def _score_turn(self, action: ScoreTurn) -> None:
        try:
            probability = await self.engines.turn.probability(
                action.transcript, context=action.context
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("session %s: end-of-turn scoring failed", self.id)
            self._call(self.session.on_turn_score_failed, action.key)
            return
        self._call(self.session.on_turn_score, action.key, probability)

    def _speculate(self, action: Speculate) -> None:
        self._discard_speculation()
        # A shared LLM serves the replies people wait for first.
        action.generate.request.urgency.speculative = True
        sink = _HeldSink(self._now)
        task = asyncio.create_task(
            self._run_generation(action.generate, sink), name=f"speculate {action.key}"
        )
        self._speculation = _Speculation(action.key, action.generate, sink, task)

    def _discard_speculation(self) -> None:
        speculation, self._speculation = self._speculation, None
        if speculation is not None:
            speculation.task.cancel()

    def _generate(self, action: Generate) -> None:
        self._mark(action.response_id, "transcript")
        sink = _CoreSink(self, action.response_id)
        self._generations[action.response_id] = asyncio.create_task(
            self._run_generation(action, sink), name=f"gen {action.response_id}"
        )

    def _adopt(self, action: AdoptSpeculation) -> None:
        speculation = self._speculation
        if speculation is None or speculation.key != action.key:
            # The core keeps one speculation and names it: only a bug gets here.
            log.error("session %s: no speculation %s to adopt", self.id, action.key)
            self._call(self.session.on_generation_failed, action.response_id, "internal error")
            return
        self._speculation = None
        speculation.generate.request.urgency.speculative = False
        timings = self._timings.get(action.response_id)
        if timings is not None:
            timings.mark("transcript", speculation.sink.started)
            for stage, at in speculation.sink.marks.items():
                timings.mark(stage, at)
        if not speculation.task.done():
            self._generations[action.response_id] = speculation.task
        # After the events already drained (response.created) have been queued.
        asyncio.get_running_loop().call_soon(
            speculation.sink.adopt, _CoreSink(self, action.response_id)
        )

    def _engine_failed(self, what: str, exc: Exception) -> str:
        """Log an engine's failure at ``what``; what the client is told of it. A stage's
        timeout names the stage; any other error only gets an id, which the log line
        carries: an engine's error may name internal URLs and hosts."""
        if isinstance(exc, StageTimeoutError):
            log.warning("session %s: %s failed: %s", self.id, what, exc)
            return str(exc)
        error_id = "err_" + secrets.token_hex(6)
        log.error("session %s: %s failed (%s)", self.id, what, error_id, exc_info=exc)
        return f"The server's engine failed ({error_id}); its log has the details."

    def _mcp_clients(self) -> McpClients:
        if self._mcp is None:
            # Imported on first use: most sessions never reach an MCP server.
            from hark.tools.mcp_client import McpClients

            self._mcp = McpClients()
        return self._mcp

    async def _list_mcp_tools(self, action: ListMcpTools) -> None:
        from hark.tools.mcp_client import McpCallFailed

        try:
            tools = await self._mcp_clients().connection(action.server).list_tools()
        except McpCallFailed as exc:
            # The message names no header or token: see hark.tools.mcp_client.
            log.warning(
                "session %s: MCP server %s not listed: %s", self.id, action.server.label, exc
            )
            self._call(self.session.on_mcp_list_failed, action.item_id, exc.error)
            return
        self._call(self.session.on_mcp_tools_listed, action.item_id, tools)

    def _call_mcp_tool(self, action: CallMcpTool) -> None:
        task = self._spawn(self._run_mcp_call(action), f"mcp call {action.item_id}")
        calls = self._mcp_calls.setdefault(action.response_id, set())
        calls.add(task)

        def forget(_: object) -> None:
            calls.discard(task)
            if not calls and self._mcp_calls.get(action.response_id) is calls:
                del self._mcp_calls[action.response_id]

        task.add_done_callback(forget)

    async def _run_mcp_call(self, action: CallMcpTool) -> None:
        from hark.tools.mcp_client import McpCallFailed

        connection = self._mcp_clients().connection(action.server)
        try:
            output = await connection.call_tool(action.name, action.arguments)
        except McpCallFailed as exc:
            self._call(
                self.session.on_mcp_call_failed, action.response_id, action.item_id, exc.error
            )
            return
        self._call(self.session.on_mcp_call_done, action.response_id, action.item_id, output)

    async def _run_generation(self, action: Generate, sink: _Sink) -> None:
        try:
            await run_generation(
                action, self.engines.llm, self.engines.tts, sink, self.engines.timeouts
            )
        except asyncio.CancelledError:
            raise
        except ContextOverflow as exc:
            # The client's doing (truncation disabled, instructions too long), not a fault.
            log.info("session %s: a response failed: %s", self.id, exc)
            sink.failed(str(exc), "context_length_exceeded", "invalid_request_error")
        except Exception as exc:
            sink.failed(self._engine_failed(f"response {action.response_id}", exc))
        finally:
            # A response's next round (after MCP calls) may run under the same id already.
            running = self._generations.get(action.response_id)
            if action.response_id and running is asyncio.current_task():
                del self._generations[action.response_id]


class _Sink(Protocol):
    def text(self, delta: str) -> None: ...
    def clause(self, text: str) -> None: ...
    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None: ...
    def tool_started(self, call_id: str, name: str) -> None: ...
    def tool_delta(self, call_id: str, delta: str) -> None: ...
    def tool_finished(self, call_id: str, arguments: str) -> None: ...
    def finished(self, finished: Finished) -> None: ...
    def failed(
        self, message: str, code: str = "engine_error", error_type: str = "server_error"
    ) -> None: ...


class _CoreSink:
    """Forwards one response's engine results into the session core, timing the stages."""

    def __init__(self, runner: SessionRunner, response_id: str) -> None:
        self._runner = runner
        self._session = runner.session
        self._id = response_id

    def text(self, delta: str) -> None:
        self._runner._mark(self._id, "llm_first_token")
        self._runner._call(self._session.on_text, self._id, delta)

    def clause(self, text: str) -> None:
        self._runner._mark(self._id, "llm_first_token")
        self._runner._mark(self._id, "first_clause")

    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None:
        if len(pcm):
            self._runner._mark(self._id, "tts_first_audio")
        self._runner._call(self._session.on_audio, self._id, pcm, transcript)

    def tool_started(self, call_id: str, name: str) -> None:
        self._runner._mark(self._id, "llm_first_token")
        self._runner._call(self._session.on_tool_call_started, self._id, call_id, name)

    def tool_delta(self, call_id: str, delta: str) -> None:
        self._runner._call(self._session.on_tool_call_delta, self._id, call_id, delta)

    def tool_finished(self, call_id: str, arguments: str) -> None:
        self._runner._call(self._session.on_tool_call_finished, self._id, call_id, arguments)

    def finished(self, finished: Finished) -> None:
        self._runner._call(self._session.on_generation_finished, self._id, finished)

    def failed(
        self, message: str, code: str = "engine_error", error_type: str = "server_error"
    ) -> None:
        self._runner._call(self._session.on_generation_failed, self._id, message, code, error_type)


class _HeldSink:
    """A speculative reply's results, held unseen until the reply is adopted."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.started = now()
        self.marks: dict[str, float] = {}
        self._held: list[tuple[str, tuple[Any, ...]]] = []
        self._live: _CoreSink | None = None

    def adopt(self, live: _CoreSink) -> None:
        """Hand everything held to the real response, then forward live."""
        self._live = live
        held, self._held = self._held, []
        for name, args in _joined_audio(held):
            getattr(live, name)(*args)

    def _pass(self, name: str, *args: Any) -> None:
        if self._live is not None:
            getattr(self._live, name)(*args)
        else:
            self._held.append((name, args))

    def _mark(self, stage: str) -> None:
        if self._live is None:
            self.marks.setdefault(stage, self._now())

    def text(self, delta: str) -> None:
        self._mark("llm_first_token")
        self._pass("text", delta)

    def clause(self, text: str) -> None:
        self._mark("llm_first_token")
        self._mark("first_clause")
        self._pass("clause", text)

    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None:
        if len(pcm):
            self._mark("tts_first_audio")
        self._pass("audio", pcm, transcript)

    def tool_started(self, call_id: str, name: str) -> None:
        self._mark("llm_first_token")
        self._pass("tool_started", call_id, name)

    def tool_delta(self, call_id: str, delta: str) -> None:
        self._pass("tool_delta", call_id, delta)

    def tool_finished(self, call_id: str, arguments: str) -> None:
        self._pass("tool_finished", call_id, arguments)

    def finished(self, finished: Finished) -> None:
        self._pass("finished", finished)

    def failed(
        self, message: str, code: str = "engine_error", error_type: str = "server_error"
    ) -> None:
        self._pass("failed", message, code, error_type)


def _joined_audio(held: list[tuple[str, tuple[Any, ...]]]) -> list[tuple[str, tuple[Any, ...]]]:
    """``held`` with each clause's audio as one piece: the chunks after a clause's first carry
    no transcript, so the joined audio speaks the same words from the same sample. A reply
    held until the turn ends is two to three seconds in 100 ms chunks, each of which would
    be an input of the core, an event and a write (a tenth of the event loop's time at 150
    callers)."""
    joined: list[tuple[str, tuple[Any, ...]]] = []
    run: list[npt.NDArray[np.int16]] = []
    for name, args in held:
        if name == "audio" and not args[1] and run:
            run.append(args[0])
            continue
        if len(run) > 1:
            joined[-1] = ("audio", (np.concatenate(run), joined[-1][1][1]))
        run = [args[0]] if name == "audio" else []
        joined.append((name, args))
    if len(run) > 1:
        joined[-1] = ("audio", (np.concatenate(run), joined[-1][1][1]))
    return joined

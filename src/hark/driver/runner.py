"""The async driver of one session: takes a transport's inputs into the core and carries out
the actions the core produces.

Transports hand it client frames and forward what ``outgoing`` yields, or write events the
moment they are made through ``send_with``; they know nothing else. Every input reaches the
core with the wall time, and one timer wakes the core at its ``next_deadline()``; every
decision about the session is the core's, the runner only dispatches its actions: audio to
the VAD and the player, events to the backlog (:mod:`hark.driver.backlog`), engine work
(:mod:`hark.driver.engine_work`) and replies (:mod:`hark.driver.generation`) to tasks. It
also marks every response's stages (:mod:`hark.driver.timings`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from hark.driver.backlog import BACKLOG_EXCEEDED, MAX_BACKLOG_BYTES, MAX_BACKLOG_EVENTS, Backlog
from hark.driver.engine_work import EngineWork
from hark.driver.generation import Generations
from hark.driver.timings import TIMINGS_INCLUDE, ResponseTimings, timings_event
from hark.engines.llm import takes_images
from hark.engines.registry import Engines
from hark.engines.vad import Missed, Outcomes
from hark.observability.metrics import Metrics
from hark.observability.session_metrics import SessionMetrics
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.protocol.limits import SESSION_LIMIT_S
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
from hark.session.core import Session
from hark.session.results import (
    PlayoutCleared,
    PlayoutStarted,
    PlayoutStopped,
    VadMissed,
    VadScored,
)

log = logging.getLogger(__name__)

# The most runs of chunks (one per flush) whose arrival waits for the VAD's answer: half a
# minute of audio sent in real time, far more than a working VAD leaves unanswered.
MAX_VAD_WAITING_RUNS = 1024


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
        self._backlog = Backlog(max_backlog_events, max_backlog_bytes)
        # When the last sample of each chunk the VAD has not answered yet arrived.
        self._vad_waiting = _Arrivals(MAX_VAD_WAITING_RUNS)
        # When the audio behind the VAD result being handled now arrived.
        self._vad_arrived = 0.0
        self._vad_stream = engines.vad.open_stream(self._on_vad_outcomes)
        self._timings = ResponseTimings(monotonic)
        self._work = EngineWork(engines, self.session)
        self._generations = Generations(engines, self.session, self._timings, monotonic)
        self._tasks: set[asyncio.Task[None]] = set()
        # The one timer: wakes the core at its next deadline (see ``_arm_timer``).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: float | None = None
        self._closed = False

    @property
    def id(self) -> str:
        """The session id (``sess_…``)."""
        return self.session.id

    @property
    def generations_running(self) -> int:
        """Responses being generated for this session now (a worker's load)."""
        return self._generations.running

    async def recognition_idle(self) -> None:
        """Return once no recognition (a step, or an item's audio whole) runs or waits
        (including the steps that finishing ones start)."""
        await self._work.recognition_idle()

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

    def input_rate(self) -> int:
        """The sample rate ``receive_audio`` takes now: the session's input format's."""
        return self.session.input_rate

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
        self._timings.mark(response_id, "first_audio_sent")
        self._call(self.session.handle, PlayoutStarted(response_id))

    def playout_stopped(self, response_id: str) -> None:
        """The player finished a response's audio."""
        self._call(self.session.handle, PlayoutStopped(response_id))

    def playout_cleared(self, response_id: str, played_ms: int) -> None:
        """The player dropped the rest of a response after ``played_ms`` of it were heard."""
        self._call(self.session.handle, PlayoutCleared(response_id, played_ms))

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
        self._backlog.send = send
        self._backlog.stalled = stalled

    def outgoing(self) -> AsyncIterator[str]:
        """Serialised server events, in order; ends when the session is over."""
        return self._backlog.outgoing()

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
        # Cancelled tasks keep their tracebacks, whose frames refer back to this runner: held
        # here, they would keep the session and its audio until the cycle collector runs. So
        # would the transport's callbacks and player, which refer back to the runner.
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        tasks += self._work.stop()
        tasks += self._generations.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._work.close()
        self._timer = None
        self._player = None
        self._backlog.end()
        log.info("session %s closed", self.id)

    # ------------------------------------------------------------------ dispatch

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
        work = self._work
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
                work.recognise(out, self._call)
            elif isinstance(out, CancelRecognition):
                work.cancel_recognition(out.request_id)
            elif isinstance(out, Transcribe):
                work.transcribe(out, self._call)
            elif isinstance(out, ScoreTurn):
                work.score_turn(out, self._call)
            elif isinstance(out, Prefill):
                work.prefill(out)
            elif isinstance(out, Speculate):
                self._generations.speculate(out)
            elif isinstance(out, DiscardSpeculation):
                self._generations.discard(out.key)
            elif isinstance(out, Generate):
                self._generations.generate(out, self._call)
            elif isinstance(out, AdoptSpeculation):
                self._generations.adopt(out, self._call)
            elif isinstance(out, CancelGeneration):
                self._generations.cancel(out.response_id)
                work.cancel_mcp_calls(out.response_id)
            elif isinstance(out, ListMcpTools):
                work.list_mcp_tools(out, self._call)
            elif isinstance(out, CallMcpTool):
                work.call_mcp_tool(out, self._call)
            elif isinstance(out, CloseMcpServer):
                work.close_mcp_server(out.label)
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
                work.denoise(out, self._call)
            elif isinstance(out, CountDroppedAudio):
                self.metrics.audio_dropped()
            elif isinstance(out, Close):
                log.info("session %s ends: %s", self.id, out.reason)
                self._spawn(self.close(out.reason), "close")

    def _emit(self, text: str) -> None:
        if not self._backlog.emit(text):
            self._overflow()

    def _overflow(self) -> None:
        """The peer stopped reading: what waits for it is dropped and the session ends.

        The ``error`` event goes out alone, so that a peer that reads again learns why, and
        the session's engine work stops at once rather than making more events nobody reads.
        """
        backlog = self._backlog
        events, size = backlog.overflow()
        reason = backlog.reason
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
                backlog.put_last(se.encode_event(out).decode())
        if backlog.stalled is not None:
            backlog.stalled(reason)
        self._spawn(self.close(BACKLOG_EXCEEDED), "close")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _observe(self, event: se.ServerEvent) -> None:
        """Follow the turn through the events the core emits."""
        if isinstance(event, se.SpeechStopped):
            self._timings.turn_ended(self.session.last_pause_ms)
            self.metrics.vad_decision("speech_stopped", self._vad_arrived)
        elif isinstance(event, se.SpeechStarted):
            self.metrics.vad_decision("speech_started", self._vad_arrived)
        elif isinstance(event, se.ResponseCreated):
            self._timings.created(event.response.id)
        elif isinstance(event, se.OutputAudioDelta):
            self._timings.mark(event.response_id, "first_audio_sent")
        elif isinstance(event, se.ResponseDone):
            self._response_done(event.response)

    def _response_done(self, response: se.Response) -> None:
        if self._on_usage is not None and response.usage is not None:
            self._on_usage(response.usage.total_tokens)
        timings = self._timings.done(response.id)
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
            event_id = self.session.ids.new("event")
            self._emit(timings_event(event_id, response.id, timings))

    # ------------------------------------------------------------------ VAD and timer

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
                    session.handle(VadMissed(epoch, probability.error), now=clock)
                else:
                    if arrived is None:
                        arrived = now
                    self.metrics.vad_chunk(arrived, now)
                    self._vad_arrived = arrived
                    session.handle(VadScored(probability, epoch), now=clock)
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

"""The async driver of one session: feeds the core, runs the engine work it asks for.

Transports hand it client frames and forward what ``outgoing`` yields; they know nothing
else. Engine failures fail one response (or one transcription), never the session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from hark.engines.llm import Finished
from hark.engines.registry import Engines
from hark.protocol.server_events import ServerEvent, encode_event
from hark.protocol.session_config import SessionConfig
from hark.session.actions import (
    AnalyzeSpeech,
    CancelGeneration,
    ClearAudio,
    Close,
    Generate,
    PlayAudio,
    Transcribe,
)
from hark.session.core import Session
from hark.session.response_pipeline import run_generation

log = logging.getLogger(__name__)


class AudioPlayer(Protocol):
    """A transport that plays reply audio itself, paced in real time (WebRTC, SIP).

    It reports back through ``SessionRunner.playout_started`` / ``playout_stopped`` /
    ``playout_cleared``.
    """

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        """Queue audio of a response after whatever is queued already."""
        ...

    def clear(self, response_id: str) -> None:
        """Stop this response's audio within one frame and drop what is left of it."""
        ...


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
    ) -> None:
        self.engines = engines
        self.transport = transport
        self._clock = clock
        self._player = player
        self.session = Session(
            model=model,
            config=initial_config,
            created_at=clock(),
            plays_audio=player is not None,
        )
        self._out: asyncio.Queue[str | None] = asyncio.Queue()
        self._vad_in: asyncio.Queue[AnalyzeSpeech] = asyncio.Queue()
        self._vad_stream = engines.vad.open_stream()
        self._generations: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def id(self) -> str:
        """The session id (``sess_…``)."""
        return self.session.id

    async def start(self) -> None:
        """Queue ``session.created`` and start the session's background work."""
        self._spawn(self._vad_loop(), "vad")
        self._spawn(self._expiry_timer(), "expiry")
        self._call(self.session.start)
        log.info("session %s started (%s)", self.id, self.transport)

    def receive_text(self, text: str) -> None:
        """One client text frame (a JSON event). Never raises."""
        self.session.tick(self._clock())
        self._call(self.session.receive, text)

    def receive_audio(self, pcm: npt.NDArray[np.int16]) -> None:
        """Input audio from a media track, as PCM at ``self.session.input_rate``."""
        self._call(self.session.append_audio, pcm)

    def playout_started(self, response_id: str) -> None:
        """The player began a response's audio."""
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

    async def outgoing(self) -> AsyncIterator[str]:
        """Serialised server events, in order; ends when the session is over."""
        while (text := await self._out.get()) is not None:
            yield text

    async def close(self) -> None:
        """Stop all engine work of this session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        current = asyncio.current_task()
        tasks = [t for t in (*self._tasks, *self._generations.values()) if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._generations.clear()
        self._out.put_nowait(None)
        log.info("session %s closed", self.id)

    # ------------------------------------------------------------------ plumbing

    def _call(self, method: Callable[..., None], *args: object) -> None:
        """Call into the core and carry out what it produced; a core bug fails closed."""
        if self._closed:
            return
        try:
            method(*args)
        except Exception:
            log.exception("session %s: internal error", self.id)
            self.session.report_internal_error()
        self._flush()

    def _flush(self) -> None:
        for out in self.session.drain():
            if isinstance(out, ServerEvent):
                self._out.put_nowait(encode_event(out).decode())
            elif isinstance(out, AnalyzeSpeech):
                self._vad_in.put_nowait(out)
            elif isinstance(out, Transcribe):
                self._spawn(self._transcribe(out), f"asr {out.item_id}")
            elif isinstance(out, Generate):
                task = asyncio.create_task(self._generate(out), name=f"gen {out.response_id}")
                self._generations[out.response_id] = task
            elif isinstance(out, CancelGeneration):
                running = self._generations.pop(out.response_id, None)
                if running is not None:
                    running.cancel()
            elif isinstance(out, PlayAudio):
                assert self._player is not None
                self._player.play(out.response_id, out.item_id, out.pcm, out.rate)
            elif isinstance(out, ClearAudio):
                assert self._player is not None
                self._player.clear(out.response_id)
            elif isinstance(out, Close):
                log.info("session %s ends: %s", self.id, out.reason)
                self._spawn(self.close(), "close")

    def _spawn(self, coro: object, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ engine work

    async def _vad_loop(self) -> None:
        epoch = 0
        while True:
            request = await self._vad_in.get()
            if request.epoch != epoch:
                self._vad_stream.reset()
                epoch = request.epoch
            try:
                probability = await self._vad_stream.probability(request.chunk)
            except Exception:
                log.exception("session %s: VAD failed on a chunk", self.id)
                probability = 0.0
            self._call(self.session.on_vad, probability, request.epoch)

    async def _expiry_timer(self) -> None:
        delay = self.session.expires_at - self._clock()
        await asyncio.sleep(max(0.0, delay))
        self._call(self.session.tick, self._clock())

    async def _transcribe(self, action: Transcribe) -> None:
        text = ""
        seconds = len(action.audio) / self.engines.asr.sample_rate
        try:
            async for delta in self.engines.asr.transcribe(
                action.audio, language=action.language, prompt=action.prompt
            ):
                text += delta
                self._call(self.session.on_transcription_delta, action.item_id, delta)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: transcription of %s failed", self.id, action.item_id)
            self._call(self.session.on_transcription_failed, action.item_id, str(exc))
            return
        self._call(self.session.on_transcription_done, action.item_id, text.strip(), seconds)

    async def _generate(self, action: Generate) -> None:
        sink = _CoreSink(self, action.response_id)
        try:
            await run_generation(action, self.engines.llm, self.engines.tts, sink)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: response %s failed", self.id, action.response_id)
            self._call(self.session.on_generation_failed, action.response_id, str(exc))
        finally:
            self._generations.pop(action.response_id, None)


class _CoreSink:
    """Forwards one response's engine results into the session core."""

    def __init__(self, runner: SessionRunner, response_id: str) -> None:
        self._runner = runner
        self._session = runner.session
        self._id = response_id

    def text(self, delta: str) -> None:
        self._runner._call(self._session.on_text, self._id, delta)

    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None:
        self._runner._call(self._session.on_audio, self._id, pcm, transcript)

    def tool_started(self, call_id: str, name: str) -> None:
        self._runner._call(self._session.on_tool_call_started, self._id, call_id, name)

    def tool_delta(self, call_id: str, delta: str) -> None:
        self._runner._call(self._session.on_tool_call_delta, self._id, call_id, delta)

    def tool_finished(self, call_id: str, arguments: str) -> None:
        self._runner._call(self._session.on_tool_call_finished, self._id, call_id, arguments)

    def finished(self, finished: Finished) -> None:
        self._runner._call(self._session.on_generation_finished, self._id, finished)

"""One session's engine work besides its replies: noise reduction, transcription and
recognition, the LLM's prefill, end-of-turn scoring and MCP.

The runner hands each action of the core here with ``call``, its way back into the core (an
input of the core, its arguments; the wall time is added there). Engine failures fail one
transcription or one call, never the session.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from hark.engines.asr import AudioToTranscribe, TimedTranscript
from hark.engines.registry import Engines
from hark.engines.stage_timeouts import StageTimeoutError, limit
from hark.session.actions import (
    CallMcpTool,
    Denoise,
    ListMcpTools,
    Prefill,
    Recognise,
    ScoreTurn,
    Transcribe,
)
from hark.session.core import Session
from hark.session.results import (
    Denoised,
    DenoiseFailed,
    McpCallDone,
    McpCallFailed,
    McpListFailed,
    McpToolsListed,
    Recognised,
    RecognisedText,
    TranscriptionDelta,
    TranscriptionDone,
    TranscriptionFailed,
    TurnScored,
    TurnScoreFailed,
)

if TYPE_CHECKING:
    from hark.tools.mcp_client import McpClients

log = logging.getLogger(__name__)

# Long appends are denoised (``Denoise``) on threads of their own, so that uploads never hold
# up what the default executor runs (the /metrics exposition, model loads). Each session has
# at most one job; a closed session's job that has not started is dropped.
_DENOISE_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hark-denoise")
# The most audio (seconds) of a session waiting for or in the ASR: two full input buffers. A
# client committing audio faster than the ASR hears it would otherwise queue all it sends;
# past this, a request fails at once (its item's transcription failed) and the session goes on.
MAX_TRANSCRIBING_S = 600.0

# The runner's way into the core: an input of the core and its arguments.
CoreCall = Callable[..., None]


def engine_failed(session_id: str, what: str, exc: Exception) -> str:
    """Log an engine's failure at ``what``; what the client is told of it. A stage's timeout
    names the stage; any other error only gets an id, which the log line carries: an
    engine's error may name internal URLs and hosts."""
    if isinstance(exc, StageTimeoutError):
        log.warning("session %s: %s failed: %s", session_id, what, exc)
        return str(exc)
    error_id = "err_" + secrets.token_hex(6)
    log.error("session %s: %s failed (%s)", session_id, what, error_id, exc_info=exc)
    return f"The server's engine failed ({error_id}); its log has the details."


class EngineWork:
    """The engine work of one session other than generation, each job a task of its own."""

    def __init__(self, engines: Engines, session: Session) -> None:
        """``session``: the core whose inputs ``call`` is given."""
        self._engines = engines
        self._session = session
        self._tasks: set[asyncio.Task[None]] = set()
        # Seconds of audio in the ASR requests running (``MAX_TRANSCRIBING_S``).
        self._transcribing_s = 0.0
        # Recognition running (steps and whole items), by request id (CancelRecognition).
        self._recognitions: dict[str, asyncio.Task[None]] = {}
        # The LLM's read-ahead: a newer prefill reads all an older one would, so it replaces it.
        self._prefilling: asyncio.Task[None] | None = None
        # The session's MCP connections (made on first use) and its calls, by response id.
        self._mcp: McpClients | None = None
        self._mcp_calls: dict[str, set[asyncio.Task[None]]] = {}

    async def recognition_idle(self) -> None:
        """Return once no recognition (a step, or an item's audio whole) runs or waits
        (including the steps that finishing ones start)."""
        while self._recognitions:
            await asyncio.wait(list(self._recognitions.values()))

    def stop(self) -> list[asyncio.Task[None]]:
        """Cancel every job and forget them: the tasks, for the caller to wait for."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        self._recognitions.clear()
        self._mcp_calls.clear()
        self._prefilling = None
        return tasks

    async def close(self) -> None:
        """Close the MCP connections (after ``stop``)."""
        if self._mcp is not None:
            await self._mcp.close_all()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ noise reduction

    def denoise(self, action: Denoise, call: CoreCall) -> None:
        """Run a ``Denoise`` job on the denoising threads."""
        self._spawn(self._denoise(action, call), f"denoise {action.job_id}")

    async def _denoise(self, action: Denoise, call: CoreCall) -> None:
        # soxr and librnnoise release the GIL: the loop serves other sessions meanwhile. Closing
        # the session cancels the wait; the thread finishes its job and the result is dropped.
        try:
            loop = asyncio.get_running_loop()
            pcm = await loop.run_in_executor(_DENOISE_POOL, action.denoise, action.pcm)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: noise reduction failed", self._session.id)
            call(self._session.handle, DenoiseFailed(action.job_id, str(exc)))
            return
        call(self._session.handle, Denoised(action.job_id, pcm))

    # ------------------------------------------------------------------ ASR

    def cancel_recognition(self, request_id: str) -> None:
        """Stop a transcription or recognition request, if it still runs."""
        running = self._recognitions.pop(request_id, None)
        if running is not None:
            running.cancel()

    def _asr_admits(self, request_id: str, seconds: float, call: CoreCall) -> bool:
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
        call(self._session.handle, TranscriptionFailed(request_id, message))
        return False

    def transcribe(self, action: Transcribe, call: CoreCall) -> None:
        """Transcribe an item's audio whole."""

        def work(seconds: float) -> Awaitable[TranscriptionDone]:
            return self._transcription(action, seconds, call)

        self._start_asr(action.request_id, len(action.audio), "transcription", work, call)

    async def _transcription(
        self, action: Transcribe, seconds: float, call: CoreCall
    ) -> TranscriptionDone:
        asr = self._engines.asr
        text = ""
        heard: str | None = None
        if action.language is None:
            # Told first, so that the transcript is made in a language the session allows,
            # and the client hears which.
            heard = await asr.detect_language(action.audio, languages=action.languages)
        async for delta in asr.transcribe(
            AudioToTranscribe(action.audio, action.language or heard, action.prompt)
        ):
            text += delta
            call(self._session.handle, TranscriptionDelta(action.request_id, delta))
        return TranscriptionDone(action.request_id, text.strip(), seconds, heard)

    def recognise(self, action: Recognise, call: CoreCall) -> None:
        """Recognise a step of the turn (or an item) with word timings; with ``text_first``,
        its words go to the core as soon as the engine knows them, their times after."""

        async def work(_: float) -> Recognised:
            asr = self._engines.asr
            if not action.text_first:
                return Recognised(action.request_id, await asr.recognise(action.request))
            async with aclosing(asr.recognise_stages(action.request)) as stages:
                async for stage in stages:
                    if isinstance(stage, TimedTranscript):
                        return Recognised(action.request_id, stage)
                    call(self._session.handle, RecognisedText(action.request_id, stage.words))
            raise RuntimeError("the ASR engine gave no timed transcript")

        self._start_asr(action.request_id, len(action.request.audio), "recognition", work, call)

    def _start_asr(
        self,
        request_id: str,
        samples: int,
        what: str,
        work: Callable[[float], Awaitable[TranscriptionDone | Recognised]],
        call: CoreCall,
    ) -> None:
        """Run ``work`` (given the seconds of audio) for ``request_id`` within the session's
        transcription budget and the ASR's time limit, and tell the core what it made (or
        that the ``what`` failed)."""
        seconds = samples / self._engines.asr.sample_rate

        async def run() -> None:
            if not self._asr_admits(request_id, seconds, call):
                return
            try:
                async with limit(self._engines.timeouts.asr_request, "ASR request"):
                    result = await work(seconds)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._asr_failed(request_id, what, exc, call)
                return
            finally:
                self._transcribing_s -= seconds
            self._recognitions.pop(request_id, None)
            call(self._session.handle, result)

        self._recognitions[request_id] = self._spawn(run(), f"asr {request_id}")

    def _asr_failed(self, request_id: str, what: str, exc: Exception, call: CoreCall) -> None:
        """A transcription or recognition failed: logged, forgotten, and told to the core."""
        message = engine_failed(self._session.id, f"{what} {request_id}", exc)
        self._recognitions.pop(request_id, None)
        call(self._session.handle, TranscriptionFailed(request_id, message))

    # ------------------------------------------------------------------ LLM and turn model

    def prefill(self, action: Prefill) -> None:
        """Have the LLM read a prompt ahead, in place of any older read-ahead."""
        if self._prefilling is not None:
            # What the older one read stays in the engine's cache.
            self._prefilling.cancel()
        self._prefilling = self._spawn(self._prefill(action), "prefill")

    async def _prefill(self, action: Prefill) -> None:
        try:
            await self._engines.llm.prefill(action.request)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Only an optimisation: the next generation reads the prompt itself.
            log.warning("session %s: LLM prefill failed", self._session.id, exc_info=True)

    def score_turn(self, action: ScoreTurn, call: CoreCall) -> None:
        """Ask the end-of-turn model whether the words so far end the turn."""
        self._spawn(self._score_turn(action, call), f"turn {action.key}")

    async def _score_turn(self, action: ScoreTurn, call: CoreCall) -> None:
        session = self._session
        try:
            probability = await self._engines.turn.probability(
                action.transcript, context=action.context
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("session %s: end-of-turn scoring failed", session.id)
            call(session.handle, TurnScoreFailed(action.key))
            return
        call(session.handle, TurnScored(action.key, probability))

    # ------------------------------------------------------------------ MCP

    def _mcp_clients(self) -> McpClients:
        if self._mcp is None:
            # Imported on first use: most sessions never reach an MCP server.
            from hark.tools.mcp_client import McpClients

            self._mcp = McpClients()
        return self._mcp

    def list_mcp_tools(self, action: ListMcpTools, call: CoreCall) -> None:
        """List an MCP server's tools for the session."""
        self._spawn(self._list_mcp_tools(action, call), f"mcp list {action.server.label}")

    async def _list_mcp_tools(self, action: ListMcpTools, call: CoreCall) -> None:
        from hark.tools.mcp_client import McpCallFailed

        session = self._session
        try:
            tools = await self._mcp_clients().connection(action.server).list_tools()
        except McpCallFailed as exc:
            # The message names no header or token: see hark.tools.mcp_client.
            log.warning(
                "session %s: MCP server %s not listed: %s", session.id, action.server.label, exc
            )
            call(session.handle, McpListFailed(action.item_id, exc.error))
            return
        call(session.handle, McpToolsListed(action.item_id, tools))

    def call_mcp_tool(self, action: CallMcpTool, call: CoreCall) -> None:
        """Call a tool of an MCP server for a response (cancelled with the response)."""
        task = self._spawn(self._run_mcp_call(action, call), f"mcp call {action.item_id}")
        calls = self._mcp_calls.setdefault(action.response_id, set())
        calls.add(task)

        def forget(_: object) -> None:
            calls.discard(task)
            if not calls and self._mcp_calls.get(action.response_id) is calls:
                del self._mcp_calls[action.response_id]

        task.add_done_callback(forget)

    async def _run_mcp_call(self, action: CallMcpTool, call: CoreCall) -> None:
        from hark.tools.mcp_client import McpCallFailed as CallRefused

        session = self._session
        connection = self._mcp_clients().connection(action.server)
        try:
            output = await connection.call_tool(action.name, action.arguments)
        except CallRefused as exc:
            call(session.handle, McpCallFailed(action.response_id, action.item_id, exc.error))
            return
        call(session.handle, McpCallDone(action.response_id, action.item_id, output))

    def cancel_mcp_calls(self, response_id: str) -> None:
        """Stop a cancelled response's MCP calls."""
        for task in self._mcp_calls.pop(response_id, ()):
            task.cancel()

    def close_mcp_server(self, label: str) -> None:
        """Close the session's connection to an MCP server, if it has one."""
        if self._mcp is not None:
            self._spawn(self._mcp.close(label), f"mcp close {label}")

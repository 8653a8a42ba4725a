"""The driver of a translation session over a WebSocket: client events in, the VAD and the
engines run for the core (``hark.session.translation``), server events out.

Engine work runs one action at a time in a worker task, in the order the core asked for it
(the core itself asks for one utterance at a time); the VAD answers on the loop as it does
for a Realtime session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import numpy as np
from aiohttp import WSMsgType, web

from hark.audio.resample import resample
from hark.engines.asr import AudioToTranscribe
from hark.engines.llm import ChatMessage, GenerationRequest, TextDelta
from hark.engines.registry import Engines
from hark.engines.stage_timeouts import limit, within
from hark.engines.vad import Missed, Outcomes
from hark.protocol import translation as tr
from hark.protocol.server_events import encode_event
from hark.session.translation import (
    Close,
    Listen,
    Recognise,
    Speak,
    Translate,
    TranslationSession,
)

logger = logging.getLogger(__name__)

# A translation is a sentence or two: the LLM may say this much for one utterance.
_MAX_TOKENS = 400
# Translating, the LLM should not invent.
_TEMPERATURE = 0.2


async def run_translation(
    ws: web.WebSocketResponse,
    session: TranslationSession,
    engines: Engines,
    max_duration_s: float,
) -> None:
    """Run ``session`` on the prepared ``ws`` until the client closes it, the session ends
    (``session.close``) or it has lasted ``max_duration_s``."""
    work: asyncio.Queue[Recognise | Translate | Speak | Close] = asyncio.Queue()
    # Events are sent in order by one task; the core makes them only as fast as the engines
    # work through what the client said.
    outbox: asyncio.Queue[str | None] = asyncio.Queue()

    def flush() -> None:
        events, actions = session.take()
        for event in events:
            outbox.put_nowait(encode_event(event).decode())
        for action in actions:
            if isinstance(action, Listen):
                stream.push(action.chunks, 0)
            else:
                work.put_nowait(action)

    def on_outcomes(outcomes: Outcomes) -> None:
        session.on_vad([None if isinstance(p, Missed) else p for p, _ in outcomes])
        flush()

    stream = engines.vad.open_stream(on_outcomes)
    sender = asyncio.create_task(_send(ws, outbox))
    worker = asyncio.create_task(_work(work, session, engines, flush, outbox))
    flush()
    try:
        async with asyncio.timeout(max_duration_s):
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    continue
                stream.deliver_ready()
                session.receive(message.data)
                flush()
                if session.closed:
                    break
            if session.closed:
                # What the client still sends is not read: the worker ends the session.
                await worker
                await sender
    except TimeoutError:
        session.expire(max_duration_s)
        flush()
        outbox.put_nowait(None)
        await sender
    finally:
        stream.close()
        for task in (worker, sender):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not ws.closed:
            await ws.close()


async def _send(ws: web.WebSocketResponse, outbox: asyncio.Queue[str | None]) -> None:
    """Send the events in order; ``None`` ends the session (the connection is closed)."""
    while (text := await outbox.get()) is not None:
        if ws.closed:
            return
        await ws.send_str(text)
    await ws.close()


async def _generated(request: GenerationRequest, engines: Engines) -> AsyncIterator[str]:
    """The LLM's text for ``request``, each output within the stage's timeouts."""
    timeouts = engines.timeouts
    events = within(
        aiter(engines.llm.generate(request)),
        first_s=timeouts.llm_first_token,
        gap_s=timeouts.llm_token_gap,
        stage="LLM first token",
        gap_stage="LLM token gap",
    )
    # Closed here, not when collected: the LLM's request ends as soon as the reader stops.
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, TextDelta):
                yield event.text


async def _work(
    work: asyncio.Queue[Recognise | Translate | Speak | Close],
    session: TranslationSession,
    engines: Engines,
    flush: Callable[[], None],
    outbox: asyncio.Queue[str | None],
) -> None:
    timeouts = engines.timeouts
    while True:
        action = await work.get()
        if isinstance(action, Close):
            outbox.put_nowait(None)
            return
        utterance = action.utterance
        try:
            if isinstance(action, Recognise):
                pcm = resample(action.audio, tr.RATE, engines.asr.sample_rate)
                audio = AudioToTranscribe(pcm.astype(np.float32) / 32768.0)
                text = ""
                async with limit(timeouts.asr_request, "ASR request"):
                    async for delta in engines.asr.transcribe(audio):
                        text += delta
                session.on_recognised(utterance, text)
            elif isinstance(action, Translate):
                request = GenerationRequest(
                    messages=(
                        ChatMessage(role="system", content=action.instructions),
                        ChatMessage(role="user", content=action.text),
                    ),
                    max_tokens=_MAX_TOKENS,
                    temperature=_TEMPERATURE,
                )
                async for piece in _generated(request, engines):
                    session.on_translation_delta(utterance, piece)
                    flush()
                session.on_translated(utterance)
            elif isinstance(action, Speak):
                async with limit(timeouts.tts_clause, "TTS request"):
                    async for chunk in engines.tts.synthesize(action.text):
                        pcm = resample(chunk, engines.tts.sample_rate, tr.RATE)
                        session.on_speech(utterance, pcm.astype(np.int16))
                        flush()
                session.on_spoken(utterance)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("translation: %s failed: %r", type(action).__name__, exc)
            session.on_failed(utterance, f"The {_STAGES[type(action)]} failed.")
        flush()


_STAGES: dict[type, str] = {Recognise: "recognition", Translate: "translation", Speak: "speech"}

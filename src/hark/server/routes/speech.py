"""``POST /v1/audio/speech``: OpenAI's text-to-speech, spoken by hark's own TTS engine.

The audio streams as the engine makes it (chunked transfer), at OpenAI's 24 kHz mono
16-bit for ``pcm`` and ``wav``, and in the other formats through FFmpeg's encoders. An
error before the first byte is an OpenAI-shaped JSON error; one after it can only cut the
stream short, which the client sees as a broken transfer, not as a complete file.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt
from aiohttp import web

from hark.audio.files import CONTENT_TYPES, SpeechEncoder, missing_speech_encoder, speech_encoder
from hark.audio.resample import StreamResampler
from hark.protocol.errors import ProtocolError
from hark.protocol.speech import SpeechRequest, parse_speech_request
from hark.server.access import api_key_only, requires
from hark.server.admission import admit_engine_request
from hark.server.bodies import read_limited
from hark.server.errors import engine_failed, invalid_request
from hark.server.state import ENGINES

logger = logging.getLogger(__name__)

# OpenAI's pcm (and so its wav): 24 kHz, mono, signed 16-bit little-endian.
SPEECH_RATE = 24000
# 4096 characters of input as JSON-escaped text, and the other fields: room, not abuse.
MAX_SPEECH_BODY_BYTES = 64 * 1024


def routes() -> list[web.RouteDef]:
    """The speech route."""
    return [web.post("/v1/audio/speech", create_speech)]


@requires(api_key_only())
async def create_speech(request: web.Request) -> web.StreamResponse:
    """Speak the body's ``input`` in its ``voice`` and ``speed``, streamed as it is made."""
    try:
        body = await read_limited(request.content.read, MAX_SPEECH_BODY_BYTES)
        speech = parse_speech_request(body)
    except ProtocolError as exc:
        return invalid_request(exc, 413 if exc.code == "request_too_large" else 400)
    if speech.stream_format == "sse":
        return invalid_request(
            ProtocolError(
                "stream_format 'sse' is not supported by this server; use 'audio'.",
                param="stream_format",
                code="unsupported_value",
            )
        )
    missing = missing_speech_encoder(speech.response_format)
    if missing is not None:
        offered = ", ".join(f for f in CONTENT_TYPES if missing_speech_encoder(f) is None)
        return invalid_request(
            ProtocolError(
                f"response_format '{speech.response_format}' is not available on this "
                f"server: its FFmpeg has no {missing} encoder. Use one of: {offered}.",
                param="response_format",
                code="unsupported_value",
            )
        )
    refusal = await admit_engine_request(request)
    if refusal is not None:
        return refusal
    tts = request.app[ENGINES].tts
    chunks = tts.synthesize(speech.input, voice=speech.voice_name, speed=speech.speed)
    try:
        try:
            # The first audio before the answer starts: until then a failure is an error.
            first = await anext(chunks, None)
        except Exception:
            logger.exception("the TTS engine failed before any audio")
            return engine_failed("speech")
        response = web.StreamResponse(
            headers={"Content-Type": CONTENT_TYPES[speech.response_format]}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            await _stream_speech(response, speech, tts.sample_rate, first, chunks)
        except ConnectionError:
            logger.info("the client left before the speech ended")
            return response
    finally:
        # Closing the engine's iterator when the client leaves stops its work.
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    await response.write_eof()
    return response


async def _stream_speech(
    response: web.StreamResponse,
    speech: SpeechRequest,
    rate: int,
    first: npt.NDArray[np.int16] | None,
    chunks: AsyncIterator[npt.NDArray[np.int16]],
) -> None:
    resampler = StreamResampler(rate, SPEECH_RATE)
    encoder = speech_encoder(speech.response_format, SPEECH_RATE)
    if first is not None:
        await _write(response, encoder, resampler.process(first))
        async for chunk in chunks:
            await _write(response, encoder, resampler.process(chunk))
    tail = resampler.flush()
    await _write(response, encoder, tail.astype(np.int16, copy=False))
    data = await _encoded(encoder, None)
    if data:
        await response.write(data)


async def _write(
    response: web.StreamResponse, encoder: SpeechEncoder, pcm: npt.NDArray[np.int16]
) -> None:
    data = await _encoded(encoder, pcm)
    if data:
        await response.write(data)


async def _encoded(encoder: SpeechEncoder, pcm: npt.NDArray[np.int16] | None) -> bytes:
    """The encoder's output for ``pcm`` (None: its last bytes); compressed formats encode
    off the event loop."""
    if pcm is not None and pcm.size == 0:
        return b""
    call = encoder.finish if pcm is None else functools.partial(encoder.encode, pcm)
    return await asyncio.to_thread(call) if encoder.blocking else call()

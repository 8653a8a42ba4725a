"""``POST /v1/audio/transcriptions``: OpenAI's speech-to-text, heard by hark's own ASR.

The file is decoded by FFmpeg (WAV, MP3, FLAC, Ogg, WebM, M4A…) to the engine's rate and
heard whole: the engine deals with long audio itself. ``json`` and ``text`` take the
engine's plain transcript; ``verbose_json``, ``srt`` and ``vtt`` its timed one (segments
as the engine timed them, words when ``timestamp_granularities`` asks for them, the
language it heard). With ``stream=true`` the text comes as server-sent
``transcript.text.delta`` events as the engine recognises it, then ``transcript.text.done``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from hark.audio.files import AudioFileError, decode_file
from hark.engines.asr import AsrEngine, AudioToTranscribe, TimedTranscript
from hark.protocol.errors import ProtocolError
from hark.protocol.transcriptions import (
    DurationUsage,
    Segment,
    TextDelta,
    TextDone,
    Transcription,
    TranscriptionRequest,
    TranscriptionVerbose,
    Word,
    parse_transcription_form,
)
from hark.server.access import api_key_only, requires
from hark.server.admission import admit_engine_request
from hark.server.bodies import read_limited
from hark.server.errors import (
    engine_failed,
    error_response,
    invalid_request,
    too_large,
)
from hark.server.state import ENGINES

logger = logging.getLogger(__name__)

# OpenAI's limit on uploaded files.
MAX_FILE_BYTES = 25 * 1024 * 1024
# The text fields together (a prompt is the longest of them).
MAX_FIELDS_BYTES = 64 * 1024
# Decoded audio is float32: a heavily compressed 25 MB file could otherwise expand to GBs.
MAX_AUDIO_S = 30 * 60
# The form's parts: the file and a dozen fields, a few of them repeated (``include[]``); an
# empty part costs its headers' parsing and nothing of the fields' byte limit.
MAX_PARTS = 64
_TIMED_FORMATS = frozenset({"verbose_json", "srt", "vtt"})
# Text fields the SDKs send as ``name[]``, one per value.
_LIST_FIELDS = frozenset({"timestamp_granularities", "include"})

_encode = msgspec.json.Encoder().encode


def routes() -> list[web.RouteDef]:
    """The transcriptions route."""
    return [web.post("/v1/audio/transcriptions", create_transcription)]


@dataclass(frozen=True, slots=True)
class _Upload:
    request: TranscriptionRequest
    file: bytes


@requires(api_key_only())
async def create_transcription(request: web.Request) -> web.StreamResponse:
    """Transcribe the uploaded ``file``; the answer's shape follows ``response_format``."""
    length = request.content_length
    if length is not None and length > MAX_FILE_BYTES + MAX_FIELDS_BYTES:
        return invalid_request(too_large(MAX_FILE_BYTES + MAX_FIELDS_BYTES), 413)
    try:
        upload = await _read_form(request)
        _check_supported(upload.request)
    except ProtocolError as exc:
        return invalid_request(exc, 413 if exc.code == "request_too_large" else 400)
    refusal = await admit_engine_request(request)
    if refusal is not None:
        return refusal
    asr = request.app[ENGINES].asr
    try:
        audio = await asyncio.to_thread(
            decode_file, upload.file, asr.sample_rate, max_seconds=MAX_AUDIO_S
        )
    except AudioFileError as exc:
        return error_response(400, str(exc), param="file", code="invalid_value")
    form = upload.request
    if form.stream:
        return await _stream(request, asr, audio, form)
    try:
        if form.response_format in _TIMED_FORMATS:
            words = "word" in form.timestamp_granularities
            timed = await asr.transcribe_timed(
                AudioToTranscribe(audio, form.language, form.prompt, words=words)
            )
            return _timed_answer(form, timed)
        text = "".join([delta async for delta in _deltas(asr, audio, form)]).strip()
    except ValueError as exc:
        return _refused_by_engine(exc)
    except Exception:
        logger.exception("the ASR engine failed on a transcription")
        return engine_failed("transcription")
    usage = DurationUsage(seconds=round(audio.size / asr.sample_rate, 3))
    if form.response_format == "text":
        return web.Response(text=text + "\n", content_type="text/plain")
    return web.Response(
        body=_encode(Transcription(text=text, usage=usage)), content_type="application/json"
    )


def _deltas(
    asr: AsrEngine, audio: npt.NDArray[np.float32], form: TranscriptionRequest
) -> AsyncIterator[str]:
    return asr.transcribe(AudioToTranscribe(audio, form.language, form.prompt))


async def _read_form(request: web.Request) -> _Upload:
    if not request.content_type.startswith("multipart/form-data"):
        raise ProtocolError(
            "The request body must be multipart/form-data.", code="invalid_content_type"
        )
    try:
        fields, file = await _read_parts(request)
    except (ValueError, HttpProcessingError):
        # What aiohttp's multipart reader raises for broken framing or part headers.
        raise ProtocolError(
            "The multipart body could not be parsed.", code="invalid_body"
        ) from None
    request_fields = parse_transcription_form(fields)
    if file is None:
        raise ProtocolError(
            "Missing required parameter: 'file'.", param="file", code="missing_required_parameter"
        )
    return _Upload(request=request_fields, file=file)


async def _read_parts(request: web.Request) -> tuple[dict[str, str | list[str]], bytes | None]:
    """The text fields and the file of a multipart form, each within its limit."""
    fields: dict[str, str | list[str]] = {}
    file: bytes | None = None
    fields_bytes = 0
    reader = await request.multipart()
    parts = 0
    async for part in reader:
        parts += 1
        if parts > MAX_PARTS:
            raise ProtocolError(f"The form has more than {MAX_PARTS} parts.", code="too_many_parts")
        if not isinstance(part, BodyPartReader):
            raise ProtocolError("Nested multipart bodies are not supported.", code="invalid_body")
        name = part.name or ""
        if name == "file":
            file = await read_limited(part.read_chunk, MAX_FILE_BYTES)
            continue
        raw = await read_limited(part.read_chunk, MAX_FIELDS_BYTES)
        fields_bytes += len(raw)
        if fields_bytes > MAX_FIELDS_BYTES:
            raise too_large(MAX_FIELDS_BYTES)
        value = raw.decode("utf-8", "replace")
        if name.endswith("[]") and name[:-2] in _LIST_FIELDS:
            listed = fields.setdefault(name[:-2], [])
            if isinstance(listed, list):
                listed.append(value)
        else:
            fields[name] = value
    return fields, file


def _check_supported(form: TranscriptionRequest) -> None:
    if form.include:
        raise ProtocolError(
            "'logprobs' are not available from this server's ASR engine.",
            param="include",
            code="unsupported_value",
        )
    if form.stream and form.response_format not in ("json", "text"):
        raise ProtocolError(
            f"Streaming gives transcript events; response_format '{form.response_format}' "
            "cannot be streamed (use 'json' or 'text', or stream=false).",
            param="response_format",
            code="unsupported_value",
        )


def _timed_answer(form: TranscriptionRequest, timed: TimedTranscript) -> web.Response:
    segments = [
        Segment(
            id=index,
            seek=segment.seek if segment.seek is not None else round(segment.start * 100),
            start=round(segment.start, 3),
            end=round(segment.end, 3),
            text=segment.text,
            tokens=list(segment.tokens) if segment.tokens is not None else None,
            temperature=segment.temperature,
            avg_logprob=segment.avg_logprob,
            compression_ratio=segment.compression_ratio,
            no_speech_prob=segment.no_speech_prob,
        )
        for index, segment in enumerate(s for s in timed.segments if s.text)
    ]
    if form.response_format == "srt":
        return web.Response(
            text=_subtitles(segments, vtt=False), content_type="application/x-subrip"
        )
    if form.response_format == "vtt":
        return web.Response(text=_subtitles(segments, vtt=True), content_type="text/vtt")
    granularities = form.timestamp_granularities
    answer = TranscriptionVerbose(
        # The engine says what it heard; failing that, what it was told.
        language=timed.language or form.language or "unknown",
        duration=round(timed.duration, 3),
        text=timed.text,
        usage=DurationUsage(seconds=round(timed.duration, 3)),
    )
    # As OpenAI: segments unless only words were asked for.
    if not granularities or "segment" in granularities:
        answer.segments = segments
    if "word" in granularities:
        answer.words = [
            Word(word=w.word, start=round(w.start, 3), end=round(w.end, 3)) for w in timed.words
        ]
    return web.Response(body=_encode(answer), content_type="application/json")


def _subtitles(segments: list[Segment], *, vtt: bool) -> str:
    # One cue per segment: _timed_answer has already left out the empty ones.
    lines = ["WEBVTT", ""] if vtt else []
    for number, segment in enumerate(segments, start=1):
        if not vtt:
            lines.append(str(number))
        start, end = _clock(segment.start, vtt), _clock(segment.end, vtt)
        lines += [f"{start} --> {end}", segment.text, ""]
    return "\n".join(lines) + ("\n" if not lines or lines[-1] else "")


def _clock(seconds: float, vtt: bool) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{'.' if vtt else ','}{millis:03d}"


async def _stream(
    request: web.Request,
    asr: AsrEngine,
    audio: npt.NDArray[np.float32],
    form: TranscriptionRequest,
) -> web.StreamResponse:
    """Server-sent events: the engine's deltas as they come, then the whole text."""
    deltas = aiter(_deltas(asr, audio, form))
    try:
        # The first delta before the answer starts: the engine refuses bad input there.
        first = await anext(deltas, None)
    except ValueError as exc:
        return _refused_by_engine(exc)
    except Exception:
        logger.exception("the ASR engine failed on a transcription")
        return engine_failed("transcription")
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    said: list[str] = []
    try:
        while first is not None:
            # The streamed text is the plain answer's: no space before the first word.
            delta = first if said else first.lstrip()
            if delta:
                said.append(delta)
                await response.write(_event(TextDelta(delta=delta)))
            first = await anext(deltas, None)
        await response.write(_event(TextDone(text="".join(said).rstrip())))
    except ConnectionError:
        logger.info("the client left before its transcript was done")
        return response
    finally:
        await _close(deltas)
    await response.write_eof()
    return response


async def _close(deltas: AsyncIterator[str]) -> None:
    # Engines' transcribe is an async generator; closing it stops the recognition.
    close = getattr(deltas, "aclose", None)
    if close is not None:
        await close()


def _event(event: TextDelta | TextDone) -> bytes:
    return b"data: " + _encode(event) + b"\n\n"


def _refused_by_engine(exc: ValueError) -> web.Response:
    # The engine's own words: an unknown language, say.
    return error_response(400, str(exc), param="language", code="invalid_value")

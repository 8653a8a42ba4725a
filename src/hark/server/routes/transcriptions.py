"""``POST /v1/audio/transcriptions``: OpenAI's speech-to-text, heard by hark's own ASR.

The file is decoded by FFmpeg (WAV, MP3, FLAC, Ogg, WebM, M4A…) to the engine's rate and
cut into pieces of at most ``MAX_PIECE_S`` seconds, each at the quietest moment near its
end, so that every piece fits one Whisper window. The pieces are the segments of
``verbose_json``, ``srt`` and ``vtt``: their times are where the audio was cut, which is
as fine as the ASR interface (text deltas, no timestamps) allows; word timestamps are
refused rather than made up. Each piece is transcribed with the text before it as its
prompt, so the pieces read on. With ``stream=true`` the text comes as server-sent
``transcript.text.delta`` events as each piece is done, then ``transcript.text.done``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from hark.audio.files import AudioFileError, decode_file
from hark.engines.asr import AsrEngine
from hark.protocol.errors import ProtocolError
from hark.protocol.transcriptions import (
    DurationUsage,
    Segment,
    TextDelta,
    TextDone,
    Transcription,
    TranscriptionRequest,
    TranscriptionVerbose,
    parse_transcription_form,
)
from hark.server.access import KEY, principal, requires
from hark.server.admission import admit_request
from hark.server.errors import (
    engine_failed,
    engines_failed,
    error_response,
    invalid_request,
    too_large,
)
from hark.server.state import ENGINES, LIMITS, STATE

logger = logging.getLogger(__name__)

# OpenAI's limit on uploaded files.
MAX_FILE_BYTES = 25 * 1024 * 1024
# The text fields together (a prompt is the longest of them).
MAX_FIELDS_BYTES = 64 * 1024
# Decoded audio is float32: a heavily compressed 25 MB file could otherwise expand to GBs.
MAX_AUDIO_S = 30 * 60
# One Whisper window; a piece is cut at the quietest 100 ms of its last CUT_SEARCH_S.
MAX_PIECE_S = 30.0
CUT_SEARCH_S = 5.0
_CUT_FRAME_S = 0.1
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


@requires(KEY)
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
    refusal = await admit_request(request.app[LIMITS], principal(request).owner)
    if refusal is not None:
        return refusal
    if not await request.app[STATE].engines_ready():
        return engines_failed()
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
        segments = [segment async for segment, _ in _transcribe(asr, audio, form)]
    except ValueError as exc:
        return _refused_by_engine(exc)
    except Exception:
        logger.exception("the ASR engine failed on a transcription")
        return engine_failed("transcription")
    return _answer(form, segments, audio.size / asr.sample_rate)


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
    async for part in reader:
        if not isinstance(part, BodyPartReader):
            raise ProtocolError("Nested multipart bodies are not supported.", code="invalid_body")
        name = part.name or ""
        if name == "file":
            file = await _read_part(part, MAX_FILE_BYTES)
            continue
        raw = await _read_part(part, MAX_FIELDS_BYTES)
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


async def _read_part(part: BodyPartReader, limit: int) -> bytes:
    data = bytearray()
    while chunk := await part.read_chunk(64 * 1024):
        data += chunk
        if len(data) > limit:
            raise too_large(limit)
    return bytes(data)


def _check_supported(form: TranscriptionRequest) -> None:
    if "word" in form.timestamp_granularities:
        raise ProtocolError(
            "Word timestamps are not available from this server's ASR engine; "
            "ask for 'segment' timestamps.",
            param="timestamp_granularities",
            code="unsupported_value",
        )
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


async def _transcribe(
    asr: AsrEngine, audio: npt.NDArray[np.float32], form: TranscriptionRequest
) -> AsyncGenerator[tuple[Segment, list[str]], None]:
    """Each piece's segment, with its text deltas as the engine gave them."""
    rate = asr.sample_rate
    before = form.prompt or ""
    for index, (start, end) in enumerate(pieces(audio, rate)):
        deltas = [
            delta
            async for delta in asr.transcribe(
                audio[start:end], language=form.language, prompt=before or None
            )
        ]
        text = "".join(deltas).strip()
        if text:
            before = f"{before} {text}".strip()
        yield (
            Segment(
                id=index,
                seek=round(start * 100 / rate),
                start=start / rate,
                end=end / rate,
                text=text,
            ),
            deltas,
        )


def pieces(audio: npt.NDArray[np.float32], rate: int) -> list[tuple[int, int]]:
    """``(start, end)`` sample ranges of at most ``MAX_PIECE_S`` covering ``audio``, each
    cut at the quietest ``_CUT_FRAME_S`` of its last ``CUT_SEARCH_S`` seconds."""
    longest = int(MAX_PIECE_S * rate)
    frame = max(1, int(_CUT_FRAME_S * rate))
    search = int(CUT_SEARCH_S * rate)
    ranges: list[tuple[int, int]] = []
    start = 0
    while audio.size - start > longest:
        window = audio[start + longest - search : start + longest]
        frames = window[: window.size - window.size % frame].reshape(-1, frame)
        energy = np.mean(np.square(frames, dtype=np.float64), axis=1)
        # The quietest frame's middle; the latest of equally quiet ones keeps pieces long.
        quietest = energy.size - 1 - int(np.argmin(energy[::-1]))
        end = start + longest - search + quietest * frame + frame // 2
        ranges.append((start, end))
        start = end
    if audio.size > start or not ranges:
        ranges.append((start, audio.size))
    return ranges


def _answer(form: TranscriptionRequest, segments: list[Segment], duration: float) -> web.Response:
    text = " ".join(s.text for s in segments if s.text)
    usage = DurationUsage(seconds=round(duration, 3))
    fmt = form.response_format
    if fmt == "text":
        return web.Response(text=text + "\n", content_type="text/plain")
    if fmt == "srt":
        return web.Response(
            text=_subtitles(segments, vtt=False), content_type="application/x-subrip"
        )
    if fmt == "vtt":
        return web.Response(text=_subtitles(segments, vtt=True), content_type="text/vtt")
    answer: Transcription | TranscriptionVerbose
    if fmt == "verbose_json":
        answer = TranscriptionVerbose(
            language=form.language or "unknown",
            duration=round(duration, 3),
            text=text,
            segments=segments,
            usage=usage,
        )
    else:
        answer = Transcription(text=text, usage=usage)
    return web.Response(body=_encode(answer), content_type="application/json")


def _subtitles(segments: list[Segment], *, vtt: bool) -> str:
    cues = [s for s in segments if s.text]
    lines = ["WEBVTT", ""] if vtt else []
    for number, segment in enumerate(cues, start=1):
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
    """Server-sent events: the deltas as each piece is done, then the whole text."""
    results = _transcribe(asr, audio, form)
    try:
        # The first piece before the answer starts: the engine refuses bad input there.
        first = await anext(results, None)
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
    texts: list[str] = []
    try:
        while first is not None:
            segment, deltas = first
            if segment.text:
                for delta in _piece_deltas(deltas, joined=bool(texts)):
                    await response.write(_event(TextDelta(delta=delta)))
                texts.append(segment.text)
            first = await anext(results, None)
        await response.write(_event(TextDone(text=" ".join(texts))))
    except ConnectionError:
        logger.info("the client left before its transcript was done")
        return response
    finally:
        await results.aclose()
    await response.write_eof()
    return response


def _piece_deltas(deltas: list[str], *, joined: bool) -> list[str]:
    """A piece's deltas as streamed: together they are its text (stripped), after a space
    when it follows another piece, as in the text of the whole."""
    parts = [d for d in deltas if d]
    parts[0] = parts[0].lstrip()
    parts[-1] = parts[-1].rstrip()
    if joined:
        parts[0] = " " + parts[0]
    return [p for p in parts if p]


def _event(event: TextDelta | TextDone) -> bytes:
    return b"data: " + _encode(event) + b"\n\n"


def _refused_by_engine(exc: ValueError) -> web.Response:
    # The engine's own words: an unknown language, say.
    return error_response(400, str(exc), param="language", code="invalid_value")

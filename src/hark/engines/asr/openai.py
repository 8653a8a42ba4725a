"""Speech recognition by any OpenAI audio API: ``POST {url}/audio/transcriptions``.

OpenAI itself, speaches, or another hark (on a GPU box, say). Each utterance is uploaded as
a 16 kHz 16-bit mono WAV file. The request asks for ``stream=true``: servers that stream
(OpenAI's gpt-4o transcribe models, hark) send ``transcript.text.delta`` events as the text
is recognised, and the deltas are yielded as they come; servers that do not (``whisper-1``
ignores the field) answer with JSON or plain text, yielded as one delta. Timed
transcriptions ask for ``verbose_json`` with segment (and word) timestamps, and so does each
window of incremental recognition (``recognise``), with word timestamps.

Audio longer than ``MAX_UPLOAD_S`` (a 16-bit WAV of it stays under the 25 MB that OpenAI and
hark accept) goes up in pieces, each cut at the quietest moment near its end and sent with
the text before it as its prompt, so that the pieces read on.

The API key travels only in the ``Authorization`` header; it is scrubbed from error messages
in case a server echoes it back, and URLs in messages lose their credentials and query.
"""

from __future__ import annotations

import io
import json
import wave
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt

from hark.engines.asr import (
    AudioToTranscribe,
    RecognitionRequest,
    TimedSegment,
    TimedTranscript,
    TimedWord,
)
from hark.engines.openai_http import OpenAIEndpoint, endpoint_url, error_message, sse_objects

DEFAULT_MODEL = "whisper-1"
SAMPLE_RATE = 16000
# Half a second of silence: enough for any server to accept as audio.
_WARMUP_SAMPLES = SAMPLE_RATE // 2
# Ten minutes of 16 kHz 16-bit WAV: 19.2 MB. A piece is cut at the quietest 100 ms of its
# last CUT_SEARCH_S seconds.
MAX_UPLOAD_S = 600.0
CUT_SEARCH_S = 5.0
_CUT_FRAME_S = 0.1


class AsrEndpointError(RuntimeError):
    """The endpoint failed one transcription: unreachable, an HTTP error, or a broken answer."""


class OpenAIAsr(OpenAIEndpoint):
    """Transcribes 16 kHz float32 audio with a remote OpenAI audio API; an ``AsrEngine``.

    ``base_url`` includes the version prefix (``http://host:8000/v1``). ``stream``: ask for
    server-sent text deltas (servers that cannot stream answer in one piece either way).
    ``timeout_s`` bounds connecting and each wait for the next bytes of an answer. Call
    :meth:`aclose` when done.
    """

    sample_rate: int = SAMPLE_RATE

    def __init__(
        self,
        base_url: str,
        *,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        stream: bool = True,
        timeout_s: float = 60.0,
    ) -> None:
        super().__init__(
            "ASR",
            base_url,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            accept="application/json, text/event-stream, text/plain",
        )
        self._url = endpoint_url(base_url, "/audio/transcriptions")
        self.stream = stream

    async def transcribe(self, request: AudioToTranscribe) -> AsyncGenerator[str, None]:
        """Upload the audio and yield the transcript's deltas as the server sends them.

        The API takes the ISO-639-1 part of the language. Cancelling closes the connection.
        Raises ``AsrEndpointError`` when the request fails.
        """
        audio = request.audio
        before = request.prompt or ""
        joined = False
        for start, end in pieces(audio, SAMPLE_RATE, MAX_UPLOAD_S):
            fields = self._fields(request.language, before, "json")
            if self.stream:
                fields.append(("stream", "true"))
            said: list[str] = []
            async with self._post(audio[start:end], fields) as response:
                try:
                    async for delta in self._deltas(response):
                        if not delta:
                            continue
                        if joined and not said:
                            # A later piece's text follows the earlier ones after a space.
                            delta = " " + delta.lstrip()
                        said.append(delta)
                        yield delta
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise AsrEndpointError(
                        f"the ASR answer broke off: {self._endpoint.scrub(repr(exc))}"
                    ) from None
            text = "".join(said).strip()
            if text:
                joined = True
                before = f"{before} {text}".strip()

    async def transcribe_timed(self, request: AudioToTranscribe) -> TimedTranscript:
        """Upload the audio for ``verbose_json`` with segment timestamps (and word ones when
        ``request.words`` is true); the endpoint's segments, words and language.

        The language is as the endpoint names it (OpenAI says ``english``). Raises
        ``AsrEndpointError`` when the request fails or the answer lacks the timed shape.
        """
        audio = request.audio
        before = request.prompt or ""
        duration = audio.size / SAMPLE_RATE
        segments: list[TimedSegment] = []
        timed_words: list[TimedWord] = []
        heard: str | None = None
        for start, end in pieces(audio, SAMPLE_RATE, MAX_UPLOAD_S):
            fields = self._fields(request.language, before, "verbose_json")
            fields.append(("timestamp_granularities[]", "segment"))
            if request.words:
                fields.append(("timestamp_granularities[]", "word"))
            async with self._post(audio[start:end], fields) as response:
                try:
                    raw = await response.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise AsrEndpointError(
                        f"the ASR answer broke off: {self._endpoint.scrub(repr(exc))}"
                    ) from None
            piece = _verbose(raw, offset=start / SAMPLE_RATE, duration=duration)
            segments += piece.segments
            timed_words += piece.words
            heard = heard or piece.language
            if piece.text:
                before = f"{before} {piece.text}".strip()
        return TimedTranscript(
            segments=tuple(segments),
            language=heard,
            duration=duration,
            words=tuple(timed_words) if request.words else (),
        )

    async def recognise_stages(
        self, request: RecognitionRequest
    ) -> AsyncGenerator[TimedTranscript, None]:
        """``recognise``'s transcript alone, in one request: the endpoint gives the words
        with their times."""
        yield await self.recognise(request)

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        """One ``verbose_json`` request for the window with word timestamps; the words that
        the endpoint times, without probabilities (the API gives none).

        The endpoint serves requests as they come: ``request.urgency`` orders nothing here.
        Cancelling closes the connection. Raises ``AsrEndpointError`` as
        ``transcribe_timed`` does.
        """
        return await self.transcribe_timed(
            AudioToTranscribe(request.audio, request.language, request.prompt, words=True)
        )

    async def detect_language(
        self, audio: npt.NDArray[np.float32], *, languages: Sequence[str] = ()
    ) -> str | None:
        """``None``: the transcription API tells the language only with a transcript, and
        takes one ``language``, so detection among several cannot be held to them."""
        return None

    def _fields(self, language: str | None, prompt: str, response_format: str) -> list[Field]:
        fields: list[Field] = [("model", self.model), ("response_format", response_format)]
        if language:
            fields.append(("language", language.split("-")[0].lower()))
        if prompt:
            fields.append(("prompt", prompt))
        return fields

    def _post(
        self, audio: npt.NDArray[np.float32], fields: Sequence[Field]
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """The endpoint's successful response to ``audio`` with ``fields``."""
        form = aiohttp.FormData()
        form.add_field("file", _wav(audio), filename="audio.wav", content_type="audio/wav")
        for name, value in fields:
            form.add_field(name, value)
        return self._endpoint.post(self._url, AsrEndpointError, data=form)

    async def warmup(self) -> None:
        """Transcribe half a second of silence: the endpoint answers, and takes the model
        and the key."""
        silence = np.zeros(_WARMUP_SAMPLES, dtype=np.float32)
        async for _ in self.transcribe(AudioToTranscribe(silence)):
            pass

    async def _deltas(self, response: aiohttp.ClientResponse) -> AsyncIterator[str]:
        if response.content_type == "text/event-stream":
            async for delta in self._streamed(response.content):
                yield delta
            return
        raw = await response.read()
        if response.content_type == "text/plain":
            text = raw.decode("utf-8", errors="replace")
        else:
            try:
                body = json.loads(raw)
            except ValueError:
                raise AsrEndpointError(
                    f"the ASR endpoint answered {response.content_type or 'no content type'} "
                    "that is not JSON"
                ) from None
            answer = body.get("text") if isinstance(body, dict) else None
            if not isinstance(answer, str):
                raise AsrEndpointError("the ASR endpoint's answer has no text")
            text = answer
        if text:
            yield text

    async def _streamed(self, stream: aiohttp.StreamReader) -> AsyncIterator[str]:
        said = False
        async for event in sse_objects(stream, AsrEndpointError, "stream event"):
            kind = event.get("type")
            if kind == "transcript.text.delta" and isinstance(event.get("delta"), str):
                said = said or bool(event["delta"])
                yield event["delta"]
            elif kind == "transcript.text.done":
                # Servers that send only the end still say the whole transcript there.
                if not said and isinstance(event.get("text"), str) and event["text"]:
                    yield event["text"]
                return
            elif kind == "error" or "error" in event:
                message = error_message(event) or "unknown error"
                raise AsrEndpointError(
                    f"the ASR endpoint reported: {self._endpoint.scrub(message)}"
                )
        raise AsrEndpointError("the ASR stream ended before transcript.text.done")


Field = tuple[str, str]


def pieces(audio: npt.NDArray[np.float32], rate: int, longest_s: float) -> list[tuple[int, int]]:
    """``(start, end)`` sample ranges of at most ``longest_s`` seconds covering ``audio``,
    each cut at the quietest ``_CUT_FRAME_S`` of its last ``CUT_SEARCH_S`` seconds."""
    longest = int(longest_s * rate)
    frame = max(1, int(_CUT_FRAME_S * rate))
    search = min(int(CUT_SEARCH_S * rate), longest)
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


def _verbose(raw: bytes, *, offset: float, duration: float) -> TimedTranscript:
    """A ``verbose_json`` answer for audio that starts ``offset`` seconds into the whole
    ``duration``, its times moved to match."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise AsrEndpointError("the ASR endpoint's verbose_json answer is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        raise AsrEndpointError("the ASR endpoint's answer has no text")
    try:
        segments = tuple(
            TimedSegment(
                start=_at(item["start"], offset, duration),
                end=_at(item["end"], offset, duration),
                text=str(item["text"]).strip(),
                tokens=tuple(int(t) for t in item["tokens"]) if "tokens" in item else None,
                avg_logprob=_number(item.get("avg_logprob")),
                compression_ratio=_number(item.get("compression_ratio")),
                no_speech_prob=_number(item.get("no_speech_prob")),
                temperature=_number(item.get("temperature")),
            )
            for item in body.get("segments") or ()
        )
        words = tuple(
            TimedWord(
                word=str(item["word"]).strip(),
                start=_at(item["start"], offset, duration),
                end=_at(item["end"], offset, duration),
            )
            for item in body.get("words") or ()
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise AsrEndpointError(
            f"the ASR endpoint's verbose_json answer is malformed: {exc!r}"
        ) from None
    if not segments and body["text"].strip():
        # Text without segments: the endpoint did not time it, and times are not made up.
        raise AsrEndpointError("the ASR endpoint's answer has text but no timed segments")
    language = body.get("language")
    return TimedTranscript(
        segments=segments,
        language=language if isinstance(language, str) else None,
        duration=duration,
        words=words,
    )


def _at(seconds: Any, offset: float, duration: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"a time is not a number: {seconds!r}")
    return min(max(offset + float(seconds), 0.0), duration)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _wav(audio: npt.NDArray[np.float32]) -> bytes:
    """Mono float32 audio in [-1, 1] at ``SAMPLE_RATE`` as a 16-bit WAV file."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(SAMPLE_RATE)
        writer.writeframes(pcm.tobytes())
    return out.getvalue()

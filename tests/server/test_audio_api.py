"""OpenAI's audio API (``/v1/audio/speech``, ``/v1/audio/transcriptions``) through the
official SDK against a real server: shapes and errors on fake ASR/TTS engines, and the
real Piper and Whisper (slow)."""

from __future__ import annotations

import asyncio
import difflib
import io
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import av
import numpy as np
import numpy.typing as npt
import openai
import pytest

from hark.audio import files
from hark.audio.files import decode_file, wav_header
from hark.config import Settings
from hark.engines.asr import AudioToTranscribe
from hark.engines.fake import FakeAsr, FakeLlm, FakeTts
from hark.engines.registry import Engines
from hark.engines.vad.batcher import BatchedSileroVad
from hark.server.routes.transcriptions import MAX_FILE_BYTES
from tests.conftest import shared_end_of_turn
from tests.helpers.audio import tone
from tests.helpers.net import bearer
from tests.speech import RATE, spoken

from .conftest import API_KEY, RunningServer, StartServer

KEYED = Settings(api_keys=(API_KEY,))
WORDS = "one two three four five"


@dataclass
class RecordingTts(FakeTts):
    """The fake TTS, remembering what it was asked; after the first chunk of each request it
    waits for ``gate`` (set by default)."""

    rate: int = 24000
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[tuple[str, str | None, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.rate)
        self.gate.set()

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        self.calls.append((text, voice, speed))
        first = True
        async for chunk in super().synthesize(text, voice=voice, speed=speed):
            yield chunk
            if first:
                first = False
                await self.gate.wait()


class PieceAsr(FakeAsr):
    """Hears ``piece N`` in the Nth piece of audio, remembering lengths and prompts."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[tuple[int, str | None, str | None]] = []

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        if request.language == "xx":
            raise ValueError("Whisper does not know the language 'xx'")
        self.heard.append((request.audio.size, request.prompt, request.language))
        yield "piece"
        yield f" {len(self.heard)}"


def engines(tts: FakeTts | None = None, asr: FakeAsr | None = None) -> Engines:
    return Engines(
        vad=BatchedSileroVad(),
        asr=asr or PieceAsr(),
        llm=FakeLlm(),
        tts=tts or RecordingTts(),
        turn=shared_end_of_turn(),
    )


Client = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    """``client(server, key=API_KEY)``: an SDK client of ``server``, closed afterwards."""
    made: list[openai.AsyncOpenAI] = []

    def make(server: RunningServer, key: str = API_KEY) -> openai.AsyncOpenAI:
        made.append(openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0))
        return made[-1]

    yield make
    for sdk in made:
        await sdk.close()


def wav_tone(seconds: float) -> bytes:
    """A 16-bit mono WAV at 16 kHz: ``seconds`` of a 300 Hz tone."""
    pcm = (tone(300, seconds, level=0.3, dtype=np.float64) * 32767).astype("<i2")
    return wav_header(16000, frames=pcm.size) + pcm.tobytes()


# ------------------------------------------------------------------------------- speech


async def test_speech_streams_pcm_at_24_khz_as_the_engine_speaks(
    client: Client,
    start_server: StartServer,
) -> None:
    tts = RecordingTts(rate=16000)
    tts.gate.clear()
    server = await start_server(KEYED, engines(tts=tts))
    async with client(server).audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=WORDS, response_format="pcm"
    ) as response:
        assert response.headers["Content-Type"] == "audio/pcm"
        assert response.headers["Transfer-Encoding"] == "chunked"
        received = bytearray()
        chunks = response.iter_bytes()
        # The first chunk arrives while the engine is still held after it: it streams.
        received += await asyncio.wait_for(anext(chunks), timeout=30)
        assert received and not tts.gate.is_set()
        tts.gate.set()
        async for chunk in chunks:
            received += chunk
    assert tts.calls == [(WORDS, "alloy", 1.0)]
    # Five words of 0.4 s, made at 16 kHz and resampled to 24 kHz, 2 bytes a sample.
    samples = len(received) // 2
    assert len(received) % 2 == 0 and abs(samples - 2.0 * 24000) <= 24


async def test_speech_as_wav_has_a_streaming_header(
    client: Client, start_server: StartServer
) -> None:
    server = await start_server(KEYED, engines())
    response = await client(server).audio.speech.create(
        model="gpt-4o-mini-tts",
        voice={"id": "voice_custom"},
        input=WORDS,
        response_format="wav",
        speed=2.0,
        instructions="Speak cheerfully.",
    )
    data = response.content
    riff, riff_size, wave, fmt, _, pcm, channels, rate, _, _, bits, tag, size = struct.unpack(
        "<4sI4s4sIHHIIHH4sI", data[:44]
    )
    assert (riff, wave, fmt, tag) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert (pcm, channels, rate, bits) == (1, 1, 24000, 16)
    # Sizes unknown while streaming, as OpenAI's streamed WAV.
    assert riff_size == size == 0xFFFFFFFF
    # Twice as fast: 1 s of audio instead of 2.
    assert len(data) - 44 == 24000 * 2
    assert decode_file(data, 24000, max_seconds=60).size == 24000


@pytest.mark.parametrize(
    ("response_format", "container"),
    [("mp3", "mp3"), ("opus", "ogg"), ("aac", "aac"), ("flac", "flac")],
)
async def test_speech_in_compressed_formats(
    client: Client, start_server: StartServer, response_format: str, container: str
) -> None:
    server = await start_server(KEYED, engines())
    response = await client(server).audio.speech.create(
        model="tts-1",
        voice="alloy",
        input=WORDS,
        response_format=response_format,  # type: ignore[arg-type]
    )
    with av.open(io.BytesIO(response.content)) as decoded:
        assert container in decoded.format.name
        assert decoded.streams.audio[0].codec_context.channels == 1
    audio = decode_file(response.content, 24000, max_seconds=60)
    # Encoders add a little padding (MP3 and AAC frames), never lose audio.
    assert 2.0 * 24000 <= audio.size <= 2.1 * 24000
    assert np.abs(audio).max() > 0.1


async def test_speech_defaults_to_mp3(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server(KEYED, engines())
    async with http.post(
        server.url + "/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": "hello"},
        headers=bearer(API_KEY),
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "audio/mpeg"
        body = await response.read()
    with av.open(io.BytesIO(body)) as decoded:
        assert decoded.format.name == "mp3"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"voice": "alloy", "input": "hi"}, "model", "missing_required_parameter"),
        ({"model": "tts-1", "voice": "alloy"}, "input", "missing_required_parameter"),
        ({"model": "tts-1", "voice": "alloy", "input": ""}, "input", "invalid_value"),
        ({"model": "tts-1", "voice": "alloy", "input": "x" * 4097}, "input", "invalid_value"),
        ({"model": "tts-1", "voice": "alloy", "input": "hi", "speed": 5}, "speed", None),
        (
            {"model": "tts-1", "voice": "alloy", "input": "hi", "response_format": "ogg"},
            "response_format",
            "invalid_value",
        ),
        (
            {"model": "tts-1", "voice": "alloy", "input": "hi", "stream_format": "sse"},
            "stream_format",
            "unsupported_value",
        ),
        ({"model": "tts-1", "voice": 7, "input": "hi"}, "voice", "invalid_type"),
        ({"model": "tts-1", "voice": "a", "input": "hi", "pitch": 2}, "pitch", None),
        ([], None, "invalid_type"),
    ],
)
async def test_invalid_speech_requests(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    body: Any,
    param: str | None,
    code: str | None,
) -> None:
    tts = RecordingTts()
    server = await start_server(KEYED, engines(tts=tts))
    async with http.post(
        server.url + "/v1/audio/speech", json=body, headers=bearer(API_KEY)
    ) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert tts.calls == []


async def test_a_format_whose_encoder_this_build_lacks_is_refused_before_any_audio(
    start_server: StartServer, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in the image built without GPL components, whose FFmpeg has no MP3 encoder: before,
    # the answer began (200) and broke off at the first encode.
    monkeypatch.setitem(files._CODECS, "mp3", ("mp3", "no-such-mp3-encoder"))
    files._has_encoder.cache_clear()
    try:
        tts = RecordingTts()
        server = await start_server(KEYED, engines(tts=tts))
        body = {"model": "tts-1", "voice": "alloy", "input": "hi"}
        async with http.post(
            server.url + "/v1/audio/speech", json=body, headers=bearer(API_KEY)
        ) as response:
            assert response.status == 400
            error = (await response.json())["error"]
        assert error["param"] == "response_format" and error["code"] == "unsupported_value"
        assert "no-such-mp3-encoder" in error["message"]
        assert "opus" in error["message"] and "mp3" not in error["message"].split("Use")[1]
        assert tts.calls == []
        # The other formats still speak.
        body["response_format"] = "opus"
        async with http.post(
            server.url + "/v1/audio/speech", json=body, headers=bearer(API_KEY)
        ) as response:
            assert response.status == 200
            assert await response.read()
    finally:
        files._has_encoder.cache_clear()


async def test_speech_needs_a_key_and_a_bounded_body(
    client: Client, start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server(KEYED, engines())
    with pytest.raises(openai.AuthenticationError):
        await client(server, "sk-wrong").audio.speech.create(
            model="tts-1", voice="alloy", input="hi"
        )
    huge = {"model": "tts-1", "voice": "alloy", "input": "x" * (200 * 1024)}
    async with http.post(
        server.url + "/v1/audio/speech", json=huge, headers=bearer(API_KEY)
    ) as response:
        assert response.status == 413
        assert (await response.json())["error"]["code"] == "request_too_large"


# ------------------------------------------------------------------------ transcriptions


async def test_transcription_as_json_and_text(client: Client, start_server: StartServer) -> None:
    asr = PieceAsr()
    server = await start_server(KEYED, engines(asr=asr))
    sdk = client(server)
    result = await sdk.audio.transcriptions.create(
        model="whisper-1", file=("hello.wav", wav_tone(2.0)), language="en", prompt="Greetings."
    )
    assert result.text == "piece 1"
    assert result.usage is not None and result.usage.type == "duration"
    assert result.usage.seconds == pytest.approx(2.0)
    # The file reached the engine as 2 s at its rate, with the language and prompt.
    assert asr.heard == [(32000, "Greetings.", "en")]
    text = await sdk.audio.transcriptions.create(
        model="whisper-1", file=("hello.wav", wav_tone(2.0)), response_format="text"
    )
    assert text.strip() == "piece 2"


async def test_other_containers_are_decoded(client: Client, start_server: StartServer) -> None:
    asr = PieceAsr()
    server = await start_server(KEYED, engines(asr=asr))
    pcm = (0.3 * np.sin(2 * np.pi * 300 * np.arange(24000) / 24000) * 32767).astype(np.int16)
    encoder_output = io.BytesIO()
    with av.open(encoder_output, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=24000)
        assert isinstance(stream, av.AudioStream)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[np.newaxis], format="s16", layout="mono")
        frame.sample_rate = 24000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    await client(server).audio.transcriptions.create(
        model="whisper-1", file=("one-second.flac", encoder_output.getvalue())
    )
    # One second at 24 kHz in the file, one second at the engine's 16 kHz.
    assert abs(asr.heard[0][0] - 16000) <= 16


TWO_SENTENCES = "Hello there. How are you today?"


async def test_verbose_json_carries_the_engines_segments_words_and_language(
    client: Client, start_server: StartServer
) -> None:
    server = await start_server(KEYED, engines(asr=FakeAsr(TWO_SENTENCES)))
    sdk = client(server)
    # The fake ASR gives each of its 6 words a sixth of the 60 s: 10 s a word.
    both = await sdk.audio.transcriptions.create(
        model="whisper-1",
        file=("long.wav", wav_tone(60.0)),
        language="de-CH",
        response_format="verbose_json",
        timestamp_granularities=["segment", "word"],
    )
    assert (both.language, both.duration, both.text) == ("de", 60.0, TWO_SENTENCES)
    assert both.usage is not None and both.usage.seconds == 60.0
    assert both.segments is not None
    assert [(s.id, s.seek, s.start, s.end, s.text) for s in both.segments] == [
        (0, 0, 0.0, 20.0, "Hello there."),
        (1, 2000, 20.0, 60.0, "How are you today?"),
    ]
    assert both.words is not None
    assert [(w.word, w.start, w.end) for w in both.words] == [
        (word, 10.0 * index, 10.0 * (index + 1)) for index, word in enumerate(TWO_SENTENCES.split())
    ]
    # Segments by default, words only when asked for; no language asked: the engine's own.
    plain = await sdk.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", wav_tone(6.0)), response_format="verbose_json"
    )
    assert plain.language == "en" and plain.words is None
    assert plain.segments is not None and [s.end for s in plain.segments] == [2.0, 6.0]
    words = await sdk.audio.transcriptions.create(
        model="whisper-1",
        file=("a.wav", wav_tone(6.0)),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert words.segments is None
    assert words.words is not None and [w.end for w in words.words] == [1, 2, 3, 4, 5, 6]


async def test_long_audio_is_heard_whole(client: Client, start_server: StartServer) -> None:
    asr = PieceAsr()
    server = await start_server(KEYED, engines(asr=asr))
    result = await client(server).audio.transcriptions.create(
        model="whisper-1", file=("long.wav", wav_tone(70.0)), response_format="verbose_json"
    )
    assert result.text == "piece 1" and result.duration == pytest.approx(70.0)
    assert result.segments is not None and result.segments[0].end == pytest.approx(70.0)
    assert [size for size, _, _ in asr.heard] == [70 * 16000]


async def test_subtitles(client: Client, start_server: StartServer) -> None:
    server = await start_server(KEYED, engines(asr=FakeAsr(TWO_SENTENCES)))
    sdk = client(server)
    wav = wav_tone(3.0)
    srt = await sdk.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", wav), response_format="srt"
    )
    vtt = await sdk.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", wav), response_format="vtt"
    )
    # Half a second a word: the segments' own times.
    assert str(srt).splitlines() == [
        "1",
        "00:00:00,000 --> 00:00:01,000",
        "Hello there.",
        "",
        "2",
        "00:00:01,000 --> 00:00:03,000",
        "How are you today?",
    ]
    assert str(vtt).splitlines() == [
        "WEBVTT",
        "",
        "00:00:00.000 --> 00:00:01.000",
        "Hello there.",
        "",
        "00:00:01.000 --> 00:00:03.000",
        "How are you today?",
    ]


async def test_streamed_transcription_events(client: Client, start_server: StartServer) -> None:
    server = await start_server(KEYED, engines())
    stream = await client(server).audio.transcriptions.create(
        model="gpt-4o-mini-transcribe", file=("long.wav", wav_tone(45.0)), stream=True
    )
    events = [event async for event in stream]
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert [e.type for e in events][-1] == "transcript.text.done"
    done = events[-1]
    assert done.type == "transcript.text.done"
    assert deltas == ["piece", " 1"]
    assert done.text == "".join(deltas) == "piece 1"


@pytest.mark.parametrize(
    ("options", "param", "code"),
    [
        ({"include": ["logprobs"]}, "include", "unsupported_value"),
        ({"response_format": "diarized_json"}, "response_format", "invalid_value"),
        ({"response_format": "srt", "stream": True}, "response_format", "unsupported_value"),
        ({"language": "xx"}, "language", "invalid_value"),
        ({"temperature": 3}, "temperature", "invalid_value"),
        ({"extra_body": {"colour": "blue"}}, "colour", "unknown_parameter"),
    ],
)
async def test_invalid_transcription_requests(
    client: Client, start_server: StartServer, options: dict[str, Any], param: str, code: str
) -> None:
    server = await start_server(KEYED, engines())
    with pytest.raises(openai.BadRequestError) as caught:
        await client(server).audio.transcriptions.create(
            model="whisper-1", file=("a.wav", wav_tone(1.0)), **options
        )
    error: Any = caught.value.body
    assert (error["param"], error["code"]) == (param, code)
    assert error["message"]


async def test_bad_files_and_bodies(
    client: Client, start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    asr = PieceAsr()
    server = await start_server(KEYED, engines(asr=asr))
    url = server.url + "/v1/audio/transcriptions"
    sdk = client(server)
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", b"not audio" * 9))
    assert caught.value.body["param"] == "file"  # type: ignore[index]
    form = aiohttp.FormData({"model": "whisper-1"}, default_to_multipart=True)
    async with http.post(url, data=form, headers=bearer(API_KEY)) as response:
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "file"
    async with http.post(url, json={"model": "whisper-1"}, headers=bearer(API_KEY)) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "invalid_content_type"
    # Over 25 MB: refused as too large, whether or not the client declared its length.
    big = aiohttp.FormData({"model": "whisper-1"})
    big.add_field("file", b"\0" * (MAX_FILE_BYTES + 1), filename="big.wav")
    async with http.post(url, data=big, headers=bearer(API_KEY)) as response:
        assert response.status == 413
        assert (await response.json())["error"]["code"] == "request_too_large"

    async def chunked() -> AsyncIterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        for _ in range(MAX_FILE_BYTES // (1 << 20) + 1):
            yield b"\0" * (1 << 20)

    headers = {**bearer(API_KEY), "Content-Type": "multipart/form-data; boundary=b"}
    async with http.post(url, data=chunked(), headers=headers) as response:
        assert response.status == 413
    async with http.post(url, data=b"--b\r\nno headers end", headers=headers) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "invalid_body"
    with pytest.raises(openai.AuthenticationError):
        await client(server, "sk-wrong").audio.transcriptions.create(
            model="whisper-1", file=("a.wav", wav_tone(1.0))
        )
    assert asr.heard == []


# --------------------------------------------------------------------- the real engines


@pytest.fixture
async def real_engines() -> AsyncIterator[Engines]:
    """Piper and Whisper (and the real VAD, which the server warms up too)."""
    from hark.engines.asr.whisper import WhisperAsr
    from hark.engines.tts.piper import PiperTts

    built = Engines(
        vad=BatchedSileroVad(),
        asr=WhisperAsr(),
        llm=FakeLlm(),
        tts=PiperTts(),
        turn=shared_end_of_turn(),
    )
    yield built


@pytest.mark.slow
async def test_piper_speaks_and_whisper_hears_it(
    client: Client, start_server: StartServer, real_engines: Engines
) -> None:
    server = await start_server(KEYED, real_engines)
    sdk = client(server)
    sentence = "The quick brown fox jumps over the lazy dog."
    async with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=sentence, response_format="wav"
    ) as response:
        wav = await response.read()
    audio = decode_file(wav, 24000, max_seconds=60)
    assert 1.0 < audio.size / 24000 < 6.0 and np.abs(audio).max() > 0.1

    # Piper draws noise for each rendering, and a Whisper path may mishear a word of one
    # rendering (a CI run heard "quit brown fox" once): most words, not all, must be heard.
    timed = await sdk.audio.transcriptions.create(
        model="whisper-1", file=("fox.wav", wav), response_format="verbose_json"
    )
    assert _heard_most(timed.text, sentence)
    assert timed.segments is not None and len(timed.segments) == 1

    plain = await sdk.audio.transcriptions.create(model="whisper-1", file=("fox.wav", wav))
    assert _heard_most(plain.text, sentence)
    stream = await sdk.audio.transcriptions.create(
        model="whisper-1", file=("fox.wav", wav), stream=True
    )
    events = [event async for event in stream]
    done = events[-1]
    # The streamed answer is the plain one's, decoded the same way from the same file.
    assert done.type == "transcript.text.done" and done.text == plain.text
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == done.text


def _heard_most(heard: str, said: str) -> bool:
    """All but at most one of the words said were heard, in order."""
    matcher = difflib.SequenceMatcher(a=_words(said), b=_words(heard), autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    return matched >= len(_words(said)) - 1


def _words(text: str) -> list[str]:
    return [w for w in "".join(c if c.isalnum() else " " for c in text.lower()).split()]


@pytest.mark.slow
async def test_whisper_times_segments_and_words(
    client: Client, start_server: StartServer, real_engines: Engines
) -> None:
    server = await start_server(KEYED, real_engines)
    first, second = "Turn off the lights in the kitchen.", "Can you recommend a good book?"
    pause = np.zeros(RATE * 3 // 2, dtype=np.int16)
    pcm = np.concatenate((pause, spoken(first), pause, spoken(second), pause))
    duration = pcm.size / RATE
    result = await client(server).audio.transcriptions.create(
        model="whisper-1",
        file=("two.wav", wav_header(RATE, frames=pcm.size) + pcm.astype("<i2").tobytes()),
        response_format="verbose_json",
        timestamp_granularities=["segment", "word"],
    )
    assert result.language == "en" and result.duration == pytest.approx(duration, abs=1e-3)
    assert _words(result.text) == _words(f"{first} {second}")
    assert result.segments is not None and result.words is not None
    starts = [s.start for s in result.segments]
    ends = [s.end for s in result.segments]
    # Each segment within the audio, in order.
    assert all(0 <= a < b <= duration for a, b in zip(starts, ends, strict=True))
    assert starts == sorted(starts)
    assert " ".join(s.text for s in result.segments) == result.text
    assert all(s.tokens and s.avg_logprob <= 0 and s.temperature == 0 for s in result.segments)
    # The words, in order and in time, say the text; the second sentence's start after the
    # pause that follows the first (1.5 s of it and the first sentence's length).
    assert _words(" ".join(w.word for w in result.words)) == _words(result.text)
    times = [t for w in result.words for t in (w.start, w.end)]
    assert times == sorted(times) and times[0] >= 0 and times[-1] <= duration
    second_start = next(w.start for w in result.words if w.word.lower().startswith("can"))
    assert second_start >= 1.5 + spoken(first).size / RATE


class BrokenTts(RecordingTts):
    """Fails on text containing ``break``."""

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        if "break" in text:
            raise RuntimeError("the voice model crashed")
        async for chunk in super().synthesize(text, voice=voice, speed=speed):
            yield chunk


class BrokenAsr(PieceAsr):
    """Fails on audio of an odd number of seconds."""

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        if (request.audio.size // self.sample_rate) % 2:
            raise RuntimeError("the recogniser crashed")
        async for delta in super().transcribe(request):
            yield delta


async def test_a_failing_engine_fails_the_request_not_the_server(
    start_server: StartServer, client: Client
) -> None:
    server = await start_server(KEYED, engines(tts=BrokenTts(), asr=BrokenAsr()))
    sdk = client(server)
    with pytest.raises(openai.InternalServerError) as speech_failed:
        await sdk.audio.speech.create(model="tts-1", voice="alloy", input="break it")
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as transcription_failed:
            await sdk.audio.transcriptions.create(
                model="whisper-1", file=("a.wav", wav_tone(1.0)), stream=stream
            )
        assert transcription_failed.value.body["type"] == "server_error"  # type: ignore[index]
    assert speech_failed.value.body["type"] == "server_error"  # type: ignore[index]
    spoken = await sdk.audio.speech.create(
        model="tts-1", voice="alloy", input="fine", response_format="pcm"
    )
    assert len(spoken.content) == 0.4 * 24000 * 2
    heard = await sdk.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav_tone(2.0)))
    assert heard.text == "piece 1"

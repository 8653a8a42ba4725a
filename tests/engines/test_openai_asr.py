"""The openai ASR engine against real endpoints: a `hark serve` process, and a scripted peer
where a test needs a server of another kind, one that misbehaves, or to see the client hang
up."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import logging
import re
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from aiohttp import web

from hark.engines.asr import AsrEngine, AudioToTranscribe, RecognitionRequest
from hark.engines.asr import openai as openai_asr
from hark.engines.asr.openai import AsrEndpointError, OpenAIAsr, pieces
from tests.helpers.audio import tone
from tests.helpers.net import free_port
from tests.servers import HarkProcess

from .conftest import QUESTION, Say, scripted_peer

API_KEY = "sk-openai-asr-test-6a5b4c3d2e"
# Bounds a hang, never speed.
LIVENESS_S = 30.0
# What the fake ASR of `hark serve --engines fake` hears in any audio.
FAKE_TRANSCRIPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def hark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A hark whose own ASR is the fake one: the transcript is then known."""
    log = tmp_path_factory.mktemp("hark") / "server.log"
    with HarkProcess(["--engines", "fake"], log, env={"HARK_API_KEYS": API_KEY}) as server:
        yield server.url + "/v1"


async def hear(engine: AsrEngine, audio: npt.NDArray[np.float32], **options: Any) -> list[str]:
    return [delta async for delta in engine.transcribe(AudioToTranscribe(audio, **options))]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_hark_transcribes_streamed_or_not(hark: str, stream: bool) -> None:
    engine = OpenAIAsr(hark, api_key=API_KEY, stream=stream)
    try:
        asr: AsrEngine = engine
        assert asr.sample_rate == 16000
        deltas = await hear(
            asr, tone(440, 1.0, level=0.5, dtype=np.float32), language="en-US", prompt="Geography."
        )
    finally:
        await engine.aclose()
    assert "".join(deltas).strip() == FAKE_TRANSCRIPT


async def test_warmup_transcribes_once(hark: str) -> None:
    engine = OpenAIAsr(hark, api_key=API_KEY)
    try:
        await engine.warmup()
    finally:
        await engine.aclose()


async def test_a_wrong_key_fails_the_request_without_showing_it(
    hark: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    engine = OpenAIAsr(hark, api_key="sk-wrong-key-9876543210")
    try:
        with pytest.raises(AsrEndpointError, match="HTTP 401") as failed:
            await hear(engine, tone(440, 0.5, level=0.5, dtype=np.float32))
    finally:
        await engine.aclose()
    assert "sk-wrong-key-9876543210" not in str(failed.value)
    assert "sk-wrong-key-9876543210" not in caplog.text


async def test_an_unreachable_endpoint_fails_the_request() -> None:
    engine = OpenAIAsr(f"http://user:sk-in-url@127.0.0.1:{free_port()}/v1", timeout_s=5)
    try:
        with pytest.raises(AsrEndpointError, match="unreachable") as failed:
            await hear(engine, tone(440, 0.5, level=0.5, dtype=np.float32))
    finally:
        await engine.aclose()
    assert "sk-in-url" not in str(failed.value)


def sse(*events: dict[str, object]) -> bytes:
    return b"".join(f"data: {json.dumps(event)}\n\n".encode() for event in events)


class ScriptedTranscriptions:
    """An ``/audio/transcriptions`` endpoint answering what the test sets in ``answer``:
    ``(content type, body parts)``, written one part at a time; the upload is kept. With
    ``hold`` the answer stays open after its parts until the client hangs up."""

    def __init__(self) -> None:
        self.answer: tuple[str, list[bytes]] = ("application/json", [b'{"text": ""}'])
        self.status = 200
        self.hold = False
        self.fields: dict[str, str] = {}
        self.wav = b""
        self.parts_written = 0
        self.part_read = asyncio.Event()
        self.hung_up = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        upload = form["file"]
        assert isinstance(upload, web.FileField)
        self.wav = upload.file.read()
        self.fields = {k: v for k, v in form.items() if isinstance(v, str)}
        self.fields["authorization"] = request.headers.get("Authorization", "")
        content_type, parts = self.answer
        response = web.StreamResponse(status=self.status, headers={"Content-Type": content_type})
        await response.prepare(request)
        try:
            for number, part in enumerate(parts):
                if number:
                    # The next part only once the client took the last one, so that deltas
                    # are seen arriving one by one.
                    await asyncio.wait_for(self.part_read.wait(), LIVENESS_S)
                    self.part_read.clear()
                await response.write(part)
                self.parts_written += 1
            while self.hold:
                await response.write(b": still here\n\n")
                await asyncio.sleep(0.005)
        except (ConnectionResetError, ConnectionError):
            self.hung_up.set()
            raise
        return response


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[ScriptedTranscriptions, str]]:
    peer = ScriptedTranscriptions()
    async with scripted_peer("/audio/transcriptions", peer.handle) as url:
        yield peer, url


async def test_deltas_are_yielded_as_they_arrive_and_the_upload_is_a_wav(
    scripted: tuple[ScriptedTranscriptions, str],
) -> None:
    peer, url = scripted
    peer.answer = (
        "text/event-stream",
        [
            sse({"type": "transcript.text.delta", "delta": "Hello"}),
            sse({"type": "transcript.text.delta", "delta": " world."}),
            sse({"type": "transcript.text.done", "text": "Hello world."}),
        ],
    )
    engine = OpenAIAsr(url, model="gpt-4o-transcribe", api_key="sk-scripted")
    audio = tone(440, 0.25, level=0.5, dtype=np.float32)
    deltas: list[str] = []
    try:
        async for delta in engine.transcribe(
            AudioToTranscribe(audio, language="en-US", prompt="Greetings.")
        ):
            # Each delta is in hand while the server has written only its own event.
            assert peer.parts_written == len(deltas) + 1
            deltas.append(delta)
            peer.part_read.set()
    finally:
        await engine.aclose()
    assert deltas == ["Hello", " world."]
    assert peer.fields == {
        "model": "gpt-4o-transcribe",
        "response_format": "json",
        "stream": "true",
        "language": "en",
        "prompt": "Greetings.",
        "authorization": "Bearer sk-scripted",
    }
    with wave.open(io.BytesIO(peer.wav)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16000)
        sent = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    np.testing.assert_allclose(sent / 32767.0, audio, atol=1 / 32767)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b'{"text": " Hello world."}'),
        ("text/plain", b" Hello world."),
        ("text/event-stream", sse({"type": "transcript.text.done", "text": " Hello world."})),
    ],
)
async def test_an_answer_in_one_piece_is_one_delta(
    scripted: tuple[ScriptedTranscriptions, str], content_type: str, body: bytes
) -> None:
    peer, url = scripted
    peer.answer = (content_type, [body])
    engine = OpenAIAsr(url, stream=False)
    try:
        assert await hear(engine, tone(440, 0.25, level=0.5, dtype=np.float32)) == [" Hello world."]
    finally:
        await engine.aclose()
    assert "stream" not in peer.fields
    assert peer.fields["model"] == "whisper-1"
    assert peer.fields["authorization"] == ""


async def test_closing_the_transcription_hangs_up(
    scripted: tuple[ScriptedTranscriptions, str],
) -> None:
    peer, url = scripted
    peer.answer = ("text/event-stream", [sse({"type": "transcript.text.delta", "delta": "Hel"})])
    peer.hold = True
    engine = OpenAIAsr(url)
    try:
        stream = engine.transcribe(AudioToTranscribe(tone(440, 0.25, level=0.5, dtype=np.float32)))
        assert await anext(stream) == "Hel"
        await stream.aclose()
        await asyncio.wait_for(peer.hung_up.wait(), LIVENESS_S)
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    ("status", "content_type", "body", "message"),
    [
        (500, "application/json", b'{"error": {"message": "bad key KEY"}}', "HTTP 500: bad key"),
        (400, "application/json", b'{"detail": "no model KEY"}', "HTTP 400: no model"),
        (
            200,
            "text/event-stream",
            sse({"type": "error", "error": {"message": "broke with KEY"}}),
            "reported: broke with",
        ),
        (
            200,
            "text/event-stream",
            sse({"type": "transcript.text.delta", "delta": "Hi"}),
            "ended before transcript.text.done",
        ),
        (200, "application/json", b"<html>KEY</html>", "not JSON"),
        (200, "application/json", b'{"txt": "KEY"}', "has no text"),
    ],
)
async def test_a_failed_transcription_says_why_without_the_key(
    scripted: tuple[ScriptedTranscriptions, str],
    caplog: pytest.LogCaptureFixture,
    status: int,
    content_type: str,
    body: bytes,
    message: str,
) -> None:
    peer, url = scripted
    key = "sk-echoed-secret-1234"
    peer.status = status
    peer.answer = (content_type, [body.replace(b"KEY", key.encode())])
    caplog.set_level(logging.DEBUG)
    engine = OpenAIAsr(url, api_key=key)
    try:
        with pytest.raises(AsrEndpointError, match=message) as failed:
            await hear(engine, tone(440, 0.25, level=0.5, dtype=np.float32))
    finally:
        await engine.aclose()
    assert key not in str(failed.value)
    assert key not in caplog.text


@pytest.mark.parametrize("words", [True, False])
async def test_a_hark_gives_timed_transcripts(hark: str, words: bool) -> None:
    engine = OpenAIAsr(hark, api_key=API_KEY)
    try:
        asr: AsrEngine = engine
        timed = await asr.transcribe_timed(
            AudioToTranscribe(
                tone(440, 3.0, level=0.5, dtype=np.float32), language="fr-CA", words=words
            )
        )
    finally:
        await engine.aclose()
    # The hark's fake ASR gives each of its six words half of the 3 s.
    assert (timed.language, timed.duration, timed.text) == ("fr", 3.0, FAKE_TRANSCRIPT)
    assert [(s.start, s.end, s.text) for s in timed.segments] == [(0.0, 3.0, FAKE_TRANSCRIPT)]
    expected = [
        (word, 0.5 * index, 0.5 * (index + 1)) for index, word in enumerate(FAKE_TRANSCRIPT.split())
    ]
    assert [(w.word, w.start, w.end) for w in timed.words] == (expected if words else [])


@pytest.mark.parametrize("timed", [True, False])
async def test_long_audio_goes_up_in_pieces_that_read_on(
    hark: str, monkeypatch: pytest.MonkeyPatch, timed: bool
) -> None:
    monkeypatch.setattr(openai_asr, "MAX_UPLOAD_S", 2.0)
    audio = tone(440, 5.0, level=0.5, dtype=np.float32)
    audio[int(1.5 * 16000) : int(1.7 * 16000)] = 0
    audio[int(3.0 * 16000) : int(3.2 * 16000)] = 0
    engine = OpenAIAsr(hark, api_key=API_KEY)
    try:
        if timed:
            result = await engine.transcribe_timed(AudioToTranscribe(audio, words=True))
            text = result.text
        else:
            text = "".join(await hear(engine, audio))
    finally:
        await engine.aclose()
    # Three uploads of at most 2 s, each cut in a silence.
    assert text == " ".join([FAKE_TRANSCRIPT] * 3)
    if timed:
        starts = [s.start for s in result.segments]
        ends = [s.end for s in result.segments]
        assert starts[0] == 0.0 and 1.5 <= ends[0] <= 1.7 and 3.0 <= ends[1] <= 3.2
        assert ends[-1] == 5.0
        assert starts[1:] == pytest.approx(ends[:-1])
        times = [t for w in result.words for t in (w.start, w.end)]
        assert len(result.words) == 18 and times == sorted(times)


def test_pieces_cover_the_audio_without_gaps() -> None:
    rate = 16000
    longest = 30.0
    for seconds in (0.0, 1.0, longest, longest + 0.01, 95.3):
        audio = np.random.default_rng(1).normal(0, 0.1, int(seconds * rate)).astype(np.float32)
        ranges = pieces(audio, rate, longest)
        assert ranges[0][0] == 0 and ranges[-1][1] == audio.size
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert all(0 < end - start <= longest * rate for start, end in ranges if audio.size)


OPENAI_VERBOSE = {
    "task": "transcribe",
    "language": "english",
    "duration": 2.0,
    "text": "Hello world.",
    "segments": [
        {
            "id": 0,
            "seek": 0,
            "start": 0.1,
            "end": 1.9,
            "text": " Hello world.",
            "tokens": [50364, 2425, 1002, 13],
            "temperature": 0.0,
            "avg_logprob": -0.25,
            "compression_ratio": 0.8,
            "no_speech_prob": 0.01,
        }
    ],
    "words": [
        {"word": "Hello", "start": 0.1, "end": 0.8},
        {"word": "world.", "start": 0.9, "end": 2.5},
    ],
}


async def test_verbose_json_as_openai_sends_it(
    scripted: tuple[ScriptedTranscriptions, str],
) -> None:
    peer, url = scripted
    peer.answer = ("application/json", [json.dumps(OPENAI_VERBOSE).encode()])
    engine = OpenAIAsr(url)
    try:
        timed = await engine.transcribe_timed(
            AudioToTranscribe(
                tone(440, 2.0, level=0.5, dtype=np.float32), prompt="Greetings.", words=True
            )
        )
    finally:
        await engine.aclose()
    assert peer.fields["response_format"] == "verbose_json"
    assert peer.fields["prompt"] == "Greetings." and "stream" not in peer.fields
    assert timed.language == "english" and timed.text == "Hello world."
    (segment,) = timed.segments
    assert (segment.start, segment.end, segment.text, segment.tokens) == (
        0.1,
        1.9,
        "Hello world.",
        (50364, 2425, 1002, 13),
    )
    assert (segment.avg_logprob, segment.no_speech_prob, segment.temperature) == (
        -0.25,
        0.01,
        0.0,
    )
    # A time past the end of the audio is the end.
    assert [(w.word, w.start, w.end) for w in timed.words] == [
        ("Hello", 0.1, 0.8),
        ("world.", 0.9, 2.0),
    ]


async def test_recognise_asks_for_word_times_and_knows_no_probabilities(
    scripted: tuple[ScriptedTranscriptions, str],
) -> None:
    peer, url = scripted
    peer.answer = ("application/json", [json.dumps(OPENAI_VERBOSE).encode()])
    engine = OpenAIAsr(url)
    request = RecognitionRequest(
        tone(440, 2.0, level=0.5, dtype=np.float32), prompt="Greetings.", language="en-GB"
    )
    try:
        timed = await engine.recognise(request)
    finally:
        await engine.aclose()
    assert peer.fields["response_format"] == "verbose_json"
    # The form's last granularity: segment comes first, word after it.
    assert peer.fields["timestamp_granularities[]"] == "word"
    assert (peer.fields["prompt"], peer.fields["language"]) == ("Greetings.", "en")
    assert [(w.word, w.start, w.end, w.probability) for w in timed.words] == [
        ("Hello", 0.1, 0.8, None),
        ("world.", 0.9, 2.0, None),
    ]
    assert timed.text == "Hello world."


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": "Hello."}, "no timed segments"),
        ({"text": "Hi", "segments": [{"start": "0", "end": 1, "text": "Hi"}]}, "malformed"),
        ({"text": "Hi", "segments": [{"start": 0, "text": "Hi"}]}, "malformed"),
        ({"segments": []}, "has no text"),
    ],
)
async def test_an_untimed_or_broken_verbose_answer_fails(
    scripted: tuple[ScriptedTranscriptions, str], body: dict[str, object], message: str
) -> None:
    peer, url = scripted
    peer.answer = ("application/json", [json.dumps(body).encode()])
    engine = OpenAIAsr(url)
    try:
        with pytest.raises(AsrEndpointError, match=message):
            await engine.transcribe_timed(
                AudioToTranscribe(tone(440, 1.0, level=0.5, dtype=np.float32))
            )
    finally:
        await engine.aclose()


@pytest.mark.slow
async def test_real_speech_through_a_hark_with_whisper(say: Say, tmp_path: Path) -> None:
    args = ["--engines", "fake", "--asr", "whisper"]
    with HarkProcess(args, tmp_path / "server.log", env={"HARK_API_KEYS": API_KEY}) as server:
        engine = OpenAIAsr(server.url + "/v1", api_key=API_KEY)
        try:
            heard = "".join(await hear(engine, say(QUESTION), language="en"))
        finally:
            await engine.aclose()
    assert {"capital", "france"} <= set(re.findall(r"[a-z]+", heard.lower())), heard

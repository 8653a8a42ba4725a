"""The openai TTS engine against real endpoints: a `hark serve` process, and a scripted peer
where a test needs the server to misbehave or to see the client hang up."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from aiohttp import web

from hark.engines.tts import TtsEngine
from hark.engines.tts.openai import OpenAITts, TtsEndpointError
from tests.helpers.net import free_port
from tests.servers import HarkProcess

from .conftest import scripted_peer

API_KEY = "sk-openai-tts-test-5f4e3d2c1b"
# Bounds a hang, never speed.
LIVENESS_S = 30.0


@pytest.fixture(scope="module")
def hark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A hark whose own TTS is the fake one (a 440 Hz tone, 0.4 s a word): what the engine
    gets is then known to the sample."""
    log = tmp_path_factory.mktemp("hark") / "server.log"
    with HarkProcess(["--engines", "fake"], log, env={"HARK_API_KEYS": API_KEY}) as server:
        yield server.url + "/v1"


@pytest.fixture
async def tts(hark: str) -> AsyncIterator[OpenAITts]:
    engine = OpenAITts(hark, api_key=API_KEY)
    yield engine
    await engine.aclose()


async def speak(
    engine: TtsEngine, text: str, voice: str | None = None, speed: float = 1.0
) -> list[npt.NDArray[np.int16]]:
    return [chunk async for chunk in engine.synthesize(text, voice=voice, speed=speed)]


def dominant_hz(audio: npt.NDArray[np.int16], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(audio.astype(np.float64)))
    return float(np.fft.rfftfreq(audio.size, 1 / rate)[int(np.argmax(spectrum))])


async def test_speech_arrives_as_24_khz_pcm(tts: OpenAITts) -> None:
    engine: TtsEngine = tts
    assert engine.sample_rate == 24000
    chunks = await speak(engine, "Hello there, friend.")
    audio = np.concatenate(chunks)
    assert all(chunk.dtype == np.int16 for chunk in chunks)
    # Three words of the fake voice: 1.2 s; read at the wrong rate or with a header taken
    # for samples, the length or the pitch would be off.
    assert audio.size == pytest.approx(1.2 * 24000, abs=240)
    assert dominant_hz(audio, 24000) == pytest.approx(440, abs=5)


async def test_speed_and_voice_reach_the_server(tts: OpenAITts) -> None:
    normal = np.concatenate(await speak(tts, "One two three four.", voice="marin"))
    fast = np.concatenate(await speak(tts, "One two three four.", speed=2.0, voice="cedar"))
    assert fast.size == pytest.approx(normal.size / 2, abs=240)
    with pytest.raises(ValueError, match="speed"):
        await speak(tts, "One.", speed=0)


async def test_empty_text_asks_for_nothing(tts: OpenAITts) -> None:
    assert await speak(tts, "  \n") == []


async def test_warmup_speaks_once(tts: OpenAITts) -> None:
    await tts.warmup()


async def test_a_wrong_key_fails_the_request_without_showing_it(
    hark: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    engine = OpenAITts(hark, api_key="sk-wrong-key-0123456789")
    try:
        with pytest.raises(TtsEndpointError, match="HTTP 401") as failed:
            await speak(engine, "Hello.")
    finally:
        await engine.aclose()
    assert "sk-wrong-key-0123456789" not in str(failed.value)
    assert "sk-wrong-key-0123456789" not in caplog.text


async def test_an_unreachable_endpoint_fails_the_request() -> None:
    engine = OpenAITts(f"http://user:sk-in-url@127.0.0.1:{free_port()}/v1", timeout_s=5)
    try:
        with pytest.raises(TtsEndpointError, match="unreachable") as failed:
            await speak(engine, "Hello.")
    finally:
        await engine.aclose()
    assert "sk-in-url" not in str(failed.value)


class ScriptedSpeech:
    """An ``/audio/speech`` endpoint that streams PCM until the client hangs up, splitting
    samples across writes; or that fails, echoing the key it was given."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.hung_up = asyncio.Event()
        self.fail = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        if self.fail:
            key = request.headers.get("Authorization", "")
            return web.json_response({"error": {"message": f"bad key {key}"}}, status=500)
        response = web.StreamResponse(headers={"Content-Type": "audio/pcm"})
        await response.prepare(request)
        samples = np.arange(480, dtype="<i2").tobytes()
        try:
            while True:
                # Three bytes, then the rest: a sample split between two reads.
                await response.write(samples[:3])
                await asyncio.sleep(0.005)
                await response.write(samples[3:])
                await asyncio.sleep(0.005)
        except (ConnectionResetError, ConnectionError):
            self.hung_up.set()
            raise


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[ScriptedSpeech, str]]:
    peer = ScriptedSpeech()
    async with scripted_peer("/audio/speech", peer.handle) as url:
        yield peer, url


async def test_closing_the_stream_hangs_up(scripted: tuple[ScriptedSpeech, str]) -> None:
    peer, url = scripted
    engine = OpenAITts(url, model="kokoro", api_key="sk-scripted")
    try:
        stream = engine.synthesize("A long story.", voice="af_bella", speed=9.0)
        first = await anext(stream)
        second = await anext(stream)
        await stream.aclose()
        await asyncio.wait_for(peer.hung_up.wait(), LIVENESS_S)
    finally:
        await engine.aclose()
    # Whole samples in order, however the bytes were cut.
    joined = np.concatenate([first, second])
    assert joined.tolist() == list(range(joined.size))
    assert peer.bodies == [
        {
            "model": "kokoro",
            "input": "A long story.",
            "voice": "af_bella",
            "response_format": "pcm",
            "speed": 4.0,
        }
    ]


async def test_a_cancelled_reply_hangs_up(scripted: tuple[ScriptedSpeech, str]) -> None:
    peer, url = scripted
    engine = OpenAITts(url)
    got_audio = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.synthesize("Interrupted."):
            got_audio.set()

    task = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(got_audio.wait(), LIVENESS_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(peer.hung_up.wait(), LIVENESS_S)
    finally:
        await engine.aclose()


async def test_a_server_error_is_clear_and_scrubbed(
    scripted: tuple[ScriptedSpeech, str], caplog: pytest.LogCaptureFixture
) -> None:
    peer, url = scripted
    peer.fail = True
    caplog.set_level(logging.DEBUG)
    engine = OpenAITts(url + "?token=sk-query", api_key="sk-echoed-secret")
    try:
        with pytest.raises(TtsEndpointError, match=r"HTTP 500: bad key Bearer \[api key\]") as e:
            await speak(engine, "Hello.")
    finally:
        await engine.aclose()
    assert "sk-echoed-secret" not in str(e.value) and "sk-query" not in str(e.value)
    assert "sk-echoed-secret" not in caplog.text


@pytest.mark.slow
async def test_real_speech_from_a_hark_with_piper(tmp_path: Path) -> None:
    from hark.audio.resample import resample
    from hark.engines.asr import AudioToTranscribe
    from hark.engines.asr.whisper import WhisperAsr

    args = ["--engines", "fake", "--tts", "piper"]
    with HarkProcess(args, tmp_path / "server.log", env={"HARK_API_KEYS": API_KEY}) as server:
        engine = OpenAITts(server.url + "/v1", api_key=API_KEY)
        try:
            audio = np.concatenate(await speak(engine, "Turn off the lights in the kitchen."))
        finally:
            await engine.aclose()
    heard_audio = resample(audio, 24000, 16000).astype(np.float32) / 32768.0
    heard = "".join(
        [d async for d in WhisperAsr().transcribe(AudioToTranscribe(heard_audio, language="en"))]
    )
    assert {"lights", "kitchen"} <= set(re.findall(r"[a-z]+", heard.lower())), heard

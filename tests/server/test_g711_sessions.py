"""G.711 through a whole session over a real WebSocket: spoken input appended as A-law (or
μ-law), the turn found by the real VAD, and the reply audio in the same law.

The ASR, LLM and TTS are the fake engines; the ASR records what it was given, so the test can
see that the server decoded the input with the right law. The reply is FakeTts's 440 Hz tone,
so its decoded shape is known exactly.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.codecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from hark.audio.resample import resample
from hark.config import Settings
from hark.engines.asr import AudioToTranscribe
from hark.engines.fake import FakeAsr, FakeLlm, FakeTts
from hark.engines.registry import Engines, build_engines
from tests.e2e.conftest import speech
from tests.helpers.net import bearer

from .conftest import API_KEY, StartServer

pytestmark = pytest.mark.slow

KEYED = Settings(api_keys=(API_KEY,))
RATE = 8000
QUESTION = "What is the capital of France?"
# FakeLlm's reply, spoken by FakeTts at 0.4 s a word.
REPLY_S = FakeTts.seconds_per_word * len(FakeLlm().reply.split())
Encode = Callable[[npt.NDArray[np.int16]], bytes]
Decode = Callable[[bytes], npt.NDArray[np.int16]]
LAWS: dict[str, tuple[Encode, Decode]] = {
    "audio/pcma": (alaw_encode, alaw_decode),
    "audio/pcmu": (ulaw_encode, ulaw_decode),
}


class RecordingAsr(FakeAsr):
    """FakeAsr that keeps the audio of every request (float32 at 16 kHz)."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[npt.NDArray[np.float32]] = []

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        """Record the audio, then answer as FakeAsr does."""
        self.heard.append(request.audio.copy())
        async for delta in super().transcribe(request):
            yield delta


@pytest.fixture
async def engines() -> AsyncIterator[Engines]:
    built = build_engines(Settings(engines="fake"))
    built.asr = RecordingAsr()
    yield built
    await built.aclose()


def tone_fit(pcm: npt.NDArray[np.int16]) -> tuple[float, float]:
    """The amplitude of the best-fitting 440 Hz sine, and what the fit leaves unexplained
    (RMS of the residual over RMS of the signal)."""
    t = np.arange(len(pcm)) / RATE
    basis = np.stack(
        [np.sin(2 * np.pi * FakeTts.frequency * t), np.cos(2 * np.pi * FakeTts.frequency * t)], 1
    )
    signal = pcm.astype(np.float64)
    coefficients, *_ = np.linalg.lstsq(basis, signal, rcond=None)
    residual = signal - basis @ coefficients
    rms = float(np.sqrt(np.mean(signal**2)))
    return float(np.hypot(*coefficients)), float(np.sqrt(np.mean(residual**2))) / rms


def correlation(a: npt.NDArray[np.floating[Any]], b: npt.NDArray[np.floating[Any]]) -> float:
    return float(np.corrcoef(a.astype(np.float64), b.astype(np.float64))[0, 1])


@pytest.mark.parametrize("law", sorted(LAWS))
async def test_a_spoken_turn_in_g711_gets_a_reply_in_g711(
    law: str,
    start_server: StartServer,
    http: aiohttp.ClientSession,
    engines: Engines,
) -> None:
    encode, decode = LAWS[law]
    other_decode = LAWS["audio/pcmu" if law == "audio/pcma" else "audio/pcma"][1]
    asr = engines.asr
    assert isinstance(asr, RecordingAsr)
    server = await start_server(KEYED, engines)
    sent = encode(await speech(QUESTION, RATE))
    async with http.ws_connect(server.ws_url, headers=bearer(API_KEY)) as ws:
        assert json.loads((await ws.receive()).data)["type"] == "session.created"
        fmt = {"type": law}
        await ws.send_json(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {"input": {"format": fmt}, "output": {"format": fmt}},
                },
            }
        )
        # 20 ms appends, then a second of silence for the end of the turn.
        audio = sent + encode(np.zeros(RATE, np.int16))
        for start in range(0, len(audio), RATE // 50):
            payload = base64.b64encode(audio[start : start + RATE // 50]).decode()
            await ws.send_json({"type": "input_audio_buffer.append", "audio": payload})
        events: list[dict[str, Any]] = []
        async with asyncio.timeout(120):
            while not events or events[-1]["type"] != "response.done":
                msg = await ws.receive()
                assert msg.type is aiohttp.WSMsgType.TEXT, msg
                events.append(json.loads(msg.data))
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, events
    updated = events[kinds.index("session.updated")]["session"]["audio"]
    assert updated["input"]["format"] == updated["output"]["format"] == fmt

    # Input: the real VAD found the turn where it was spoken ...
    started = events[kinds.index("input_audio_buffer.speech_started")]
    stopped = events[kinds.index("input_audio_buffer.speech_stopped")]
    spoken_ms = len(sent) * 1000 // RATE
    assert 0 <= started["audio_start_ms"] < stopped["audio_end_ms"]
    assert spoken_ms - 600 <= stopped["audio_end_ms"] <= spoken_ms + 1000
    # ... and the ASR heard the appended audio decoded with the session's law.
    heard = asr.heard[-1]
    first = started["audio_start_ms"] * RATE // 1000
    length = len(heard) * RATE // asr.sample_rate
    span = sent[first : first + length]
    assert len(heard) >= asr.sample_rate // 2
    expected = resample(decode(span), RATE, asr.sample_rate).astype(np.float32) / 32768
    wrong = resample(other_decode(span), RATE, asr.sample_rate).astype(np.float32) / 32768
    n = min(len(heard), len(expected)) - 100
    assert correlation(heard[:n], expected[:n]) > 0.99
    assert correlation(heard[:n], wrong[:n]) < 0.9

    # Output: the reply's audio deltas, in the same law, are the reply's tone.
    (done,) = [e for e in events if e["type"] == "response.done"]
    assert done["response"]["status"] == "completed"
    assert done["response"]["audio"]["output"]["format"] == fmt
    reply = b"".join(
        base64.b64decode(e["delta"])
        for e in events
        if e["type"] == "response.output_audio.delta" and e["response_id"] == done["response"]["id"]
    )
    assert abs(len(reply) - REPLY_S * RATE) <= RATE // 100
    # The first and last 10 ms hold the resampler's edges.
    steady = slice(RATE // 100, -RATE // 100)
    amplitude, unexplained = tone_fit(decode(reply)[steady])
    assert amplitude == pytest.approx(FakeTts.amplitude * 32767, rel=0.03)
    # G.711 keeps about 38 dB of signal to noise, a residual of about 1 %.
    assert unexplained < 0.05
    # Decoded with the other law, the same bytes are not the tone: the check can tell.
    wrong_amplitude, wrong_unexplained = tone_fit(other_decode(reply)[steady])
    assert wrong_unexplained > 0.2 or abs(wrong_amplitude / amplitude - 1) > 0.2

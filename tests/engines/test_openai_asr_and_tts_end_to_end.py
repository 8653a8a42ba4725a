"""A hark whose ASR and TTS are another hark (``--asr openai --tts openai``): a spoken
question over the Realtime WebSocket is heard by the other hark's Whisper, and the reply is
spoken by its Piper. The engine seam proved with real engines on both sides."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest

from hark.audio.resample import resample
from hark.engines.asr import AudioToTranscribe
from hark.engines.asr.whisper import WhisperAsr
from tests.helpers.text import words
from tests.servers import HarkProcess
from tests.speech import spoken

pytestmark = pytest.mark.slow

AUDIO_KEY = "sk-audio-box-key-0a1b2c3d4e"
FRONT_KEY = "sk-front-key-5f6a7b8c9d"
RATE = 24000
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarkProcess]:
    """The hark a client talks to, with its ASR and TTS on the audio box (another hark,
    with Whisper and Piper). The LLM is the fake one: the audio path is what is tested."""
    logs = tmp_path_factory.mktemp("hark")
    audio_box = HarkProcess(
        ["--engines", "fake", "--asr", "whisper", "--tts", "piper"],
        logs / "audio-box.log",
        env={"HARK_API_KEYS": AUDIO_KEY},
    )
    with audio_box:
        url = audio_box.url + "/v1"
        server = HarkProcess(
            ["--engines", "fake", "--asr", "openai", "--asr-url", url, "--tts-url", url],
            logs / "front.log",
            env={
                "HARK_API_KEYS": FRONT_KEY,
                "HARK_ASR_API_KEY": AUDIO_KEY,
                "HARK_TTS_API_KEY": AUDIO_KEY,
            },
        )
        with server:
            yield server


async def test_a_spoken_question_gets_a_transcript_and_spoken_reply(front: HarkProcess) -> None:
    # The question, then a second of silence for the server VAD to end the turn.
    pcm = np.concatenate((spoken(QUESTION, RATE), np.zeros(RATE, np.int16)))
    url = front.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"
    headers = {"Authorization": f"Bearer {FRONT_KEY}"}
    events: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=headers) as ws:
        assert json.loads((await ws.receive()).data)["type"] == "session.created"
        await ws.send_json(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"}}},
                },
            }
        )
        for start in range(0, len(pcm), RATE // 50):
            chunk = pcm[start : start + RATE // 50].astype("<i2").tobytes()
            await ws.send_json(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}
            )
        kinds: set[str] = set()
        transcribed = "conversation.item.input_audio_transcription.completed"
        async with asyncio.timeout(180):
            while not {"response.done", transcribed} <= kinds:
                message = await ws.receive()
                assert message.type is aiohttp.WSMsgType.TEXT, message
                events.append(json.loads(message.data))
                kinds.add(events[-1]["type"])
    assert "error" not in kinds, [e for e in events if e["type"] == "error"]

    (heard,) = [e["transcript"] for e in events if e["type"] == transcribed]
    assert {"capital", "france"} <= set(words(heard, word=r"[a-z0-9]+")), heard

    (done,) = [e["response"] for e in events if e["type"] == "response.done"]
    assert done["status"] == "completed"
    reply = np.frombuffer(
        b"".join(
            base64.b64decode(e["delta"])
            for e in events
            if e["type"] == "response.output_audio.delta"
        ),
        dtype="<i2",
    )
    (said,) = [
        e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"
    ]
    assert reply.size > 0.3 * RATE
    # The reply audio is speech saying the reply's text (Piper on the audio box), not a tone.
    audio = resample(reply.astype(np.int16), RATE, 16000).astype(np.float32) / 32768.0
    recognised = "".join(
        [d async for d in WhisperAsr().transcribe(AudioToTranscribe(audio, language="en"))]
    )
    matched = sum(w in set(words(recognised)) for w in words(said)) / len(words(said))
    assert matched >= 0.6, (said, recognised)

    # The audio box's key went only where it belongs: it is nowhere in the front's log.
    assert AUDIO_KEY not in front.log.read_text()

"""Incremental recognition with the embedded models: Silero hears the turn, Whisper
recognises it step by step through the runner, as a long turn is spoken."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.driver.runner import SessionRunner
from hark.engines.asr import AudioToTranscribe
from hark.engines.fake import FakeLlm, FakeTts
from hark.engines.registry import Engines
from hark.engines.vad.batcher import BatchedSileroVad
from tests.conftest import shared_end_of_turn
from tests.speech import RATE, spoken

# A monologue of about 20 s, the sentences 250 ms apart: pauses that server_vad's 500 ms
# window lets pass, so it is one turn (and each pause is recognised, then cancelled).
MONOLOGUE = (
    "Could you tell me what the capital of France is, and how many people live there?",
    "My phone number is four one five five five five one two three four.",
    "Tell me a long story about a dragon and a knight.",
    "Tell me a joke about penguins, please.",
    "Turn off the lights in the kitchen.",
    "I'd like to cancel my subscription.",
)
GAP_S = 0.25
INPUT_RATE = 24000
CHUNK_MS = 20


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's length."""
    ref, hyp = words_of(reference), words_of(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1] / len(ref)


def monologue(rate: int) -> npt.NDArray[np.int16]:
    """The sentences, each without the silence around it, ``GAP_S`` apart."""
    gap = np.zeros(int(GAP_S * rate), np.int16)
    parts: list[npt.NDArray[np.int16]] = [gap]
    for sentence in MONOLOGUE:
        pcm = spoken(sentence, rate)
        loud = np.flatnonzero(np.abs(pcm) > 300)
        parts += [pcm[loud[0] : loud[-1] + 1], gap]
    return np.concatenate(parts)


@pytest.mark.slow
async def test_captions_of_a_long_turn_come_while_it_is_spoken_and_match_whole_decoding() -> None:
    from hark.engines.asr.whisper import WhisperAsr

    asr = WhisperAsr()
    engines = Engines(
        vad=BatchedSileroVad(),
        asr=asr,
        llm=FakeLlm(),
        tts=FakeTts(),
        turn=shared_end_of_turn(),
    )
    await asr.warmup()
    runner = SessionRunner(engines, model="gpt-realtime")
    events: list[dict[str, Any]] = []

    def send(text: str) -> bool:
        events.append(json.loads(text))
        return True

    runner.send_with(send)
    await runner.start()
    runner.receive_text(
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "output_modalities": ["text"],
                    "audio": {"input": {"transcription": {"model": "whisper-1"}}},
                },
            }
        )
    )
    speech = monologue(INPUT_RATE)
    assert len(speech) / INPUT_RATE >= 15
    audio = np.concatenate([speech, np.zeros(INPUT_RATE, np.int16)])
    step = INPUT_RATE * CHUNK_MS // 1000
    for start in range(0, len(audio), step):
        chunk = audio[start : start + step].astype("<i2").tobytes()
        runner.receive_text(
            json.dumps(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}
            )
        )
        # Spoken in real time, and the recogniser keeps pace with the speaker whatever this
        # machine's speed: the next audio also waits for the step in flight.
        await asyncio.sleep(CHUNK_MS / 1000)
        await runner.recognition_idle()

    async def completed() -> dict[str, Any]:
        while True:
            done = [
                e
                for e in events
                if e["type"] == "conversation.item.input_audio_transcription.completed"
            ]
            if done:
                return done[0]
            await asyncio.sleep(0.01)

    transcript = (await asyncio.wait_for(completed(), 120))["transcript"]
    await runner.close()
    types = [e["type"] for e in events]
    assert types.count("input_audio_buffer.speech_stopped") == 1
    stopped = types.index("input_audio_buffer.speech_stopped")
    deltas = [e["delta"] for e in events if e["type"].endswith("transcription.delta")]
    before = [
        e
        for e in events[:stopped]
        if e["type"] == "conversation.item.input_audio_transcription.delta"
    ]
    assert len(before) >= 3
    assert "".join(deltas) == transcript

    whole = await asr.transcribe_timed(
        AudioToTranscribe(monologue(RATE).astype(np.float32) / 32768.0)
    )
    reference = " ".join(MONOLOGUE)
    streamed_wer = word_error_rate(reference, transcript)
    whole_wer = word_error_rate(reference, whole.text)
    assert streamed_wer <= whole_wer + 0.01, (transcript, whole.text)

"""Turn-taking with real models: complete questions end fast, a pause mid-sentence does not.

Positions are read on the session's sample clock (``audio_end_ms``), not the wall clock: the
test checks the decision, not the machine's speed.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import pytest

from .conftest import Server, speech, words

pytestmark = pytest.mark.slow

RATE = 24000


def last_voiced_ms(pcm: np.ndarray) -> float:
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 1000)
    return float(loud[-1]) * 1000 / RATE


async def converse(server: Server, segments: list[np.ndarray], tail_ms: int) -> list[Any]:
    """Stream the segments back to back in real time with semantic_vad, then silence, and
    collect the events until the first response is done."""
    stream = np.concatenate([*segments, np.zeros(RATE * tail_ms // 1000, np.int16)])
    events: list[Any] = []
    async with server.client().realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {
                    "input": {
                        "transcription": {"model": "whisper-1", "language": "en"},
                        "turn_detection": {"type": "semantic_vad", "eagerness": "auto"},
                    }
                },
            }
        )
        assert (await conn.recv()).type == "session.updated"

        async def send() -> None:
            for i in range(0, len(stream), RATE // 50):
                chunk = stream[i : i + RATE // 50].astype("<i2").tobytes()
                await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                await asyncio.sleep(0.02)

        sender = asyncio.create_task(send())
        try:
            async with asyncio.timeout(120):
                while True:
                    event = await conn.recv()
                    events.append(event)
                    if event.type == "response.done":
                        break
        finally:
            sender.cancel()
    return events


async def test_a_complete_question_ends_the_turn_without_waiting_for_the_cap(
    server: Server,
) -> None:
    question = await speech("What is the capital of France?")
    events = await converse(server, [question], tail_ms=5000)
    (stopped,) = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    waited = stopped.audio_end_ms - last_voiced_ms(question)
    # semantic_vad auto waits up to 4 s for an utterance that sounds unfinished.
    assert waited < 2000, waited


async def test_a_pause_mid_sentence_does_not_end_the_turn(server: Server) -> None:
    first = await speech("My phone number is four one five,")
    second = await speech("five five five, one two three four.")
    pause = np.zeros(RATE * 12 // 10, np.int16)
    events = await converse(server, [first, pause, second], tail_ms=5000)
    stopped = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    assert len(stopped) == 1
    second_end = (len(first) + len(pause)) * 1000 / RATE + last_voiced_ms(second)
    assert stopped[0].audio_end_ms > second_end
    (heard,) = [
        e for e in events if e.type == "conversation.item.input_audio_transcription.completed"
    ]
    said = words(heard.transcript)
    assert "415" in said or said[4:7] == ["four", "one", "five"], heard.transcript
    # One turn holds both halves of the number (Whisper tiny may garble a digit or two).
    rest = " ".join(said[4:])
    assert "555" in rest.replace(" ", "") or "five five five" in rest, heard.transcript

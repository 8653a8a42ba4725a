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

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

RATE = 24000
# Bounds a hang, never speed.
LIVENESS_S = 120


def last_voiced_ms(pcm: np.ndarray) -> float:
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 1000)
    return float(loud[-1]) * 1000 / RATE


_TRANSCRIBED = {
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
}


async def converse(server: Server, segments: list[np.ndarray], tail_ms: int) -> list[Any]:
    """Stream the segments back to back in real time with semantic_vad, then ``tail_ms`` of
    silence and nothing more, and collect the events until the first response is done and
    the turn's transcript is in (transcription runs beside the response: either may be last).

    Once the audio stops, so does the session's clock: whatever ends the turn later is a
    decision about the audio sent, not about how long the machine took to make it.
    """
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
                        # Eagerness low: a pause the end-of-turn model has not judged (yet)
                        # ends after about 1.3 s (hark.session.turn_policy), so what these
                        # tests read is the model's verdict, whenever it comes, never how
                        # fast the machine produced it.
                        "turn_detection": {"type": "semantic_vad", "eagerness": "low"},
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
            async with asyncio.timeout(LIVENESS_S):
                while True:
                    event = await conn.recv()
                    events.append(event)
                    seen = {e.type for e in events}
                    if "response.done" in seen and seen & _TRANSCRIBED:
                        break
        except TimeoutError:
            kinds = [event.type for event in events]
            raise AssertionError(
                f"no response.done and transcript in {LIVENESS_S} s; got {kinds}"
            ) from None
        finally:
            sender.cancel()
    return events


async def test_a_complete_question_ends_the_turn_without_waiting_for_the_cap(
    server: Server,
) -> None:
    question = await speech("What is the capital of France?")
    # The question ends in about 0.5 s of silence; the audio stops 0.5 s later, short of the
    # 1.3 s an unjudged pause waits with eagerness low, and the session's clock stops with
    # it: the turn can only end if the end-of-turn model judged the question complete,
    # however long it took to say so.
    tail_ms = 500
    events = await converse(server, [question], tail_ms=tail_ms)
    (stopped,) = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    sent_ms = len(question) * 1000 / RATE + tail_ms
    assert last_voiced_ms(question) < stopped.audio_end_ms <= sent_ms, (stopped, sent_ms)


async def test_a_pause_mid_sentence_does_not_end_the_turn(server: Server) -> None:
    first = await speech("My phone number is four one five,")
    second = await speech("five five five, one two three four.")
    # The two halves' own silences make a pause of about 0.9 s: longer than server_vad's
    # 500 ms, shorter than the 1.3 s an unjudged pause waits with eagerness low. The turn
    # can end there only if the end-of-turn model judged the first half complete.
    events = await converse(server, [first, second], tail_ms=5000)
    stopped = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    assert len(stopped) == 1
    second_end = len(first) * 1000 / RATE + last_voiced_ms(second)
    assert stopped[0].audio_end_ms > second_end
    (heard,) = [
        e for e in events if e.type == "conversation.item.input_audio_transcription.completed"
    ]
    said = words(heard.transcript)
    assert "415" in said or said[4:7] == ["four", "one", "five"], heard.transcript
    # One turn holds both halves of the number (Whisper tiny may garble a digit or two).
    rest = " ".join(said[4:])
    assert "555" in rest.replace(" ", "") or "five five five" in rest, heard.transcript

"""End to end: the official `openai` SDK against `hark serve` on the embedded models."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import (
    RealtimeConversationItemAssistantMessage,
    RealtimeFunctionToolParam,
    RealtimeSessionCreateRequest,
)

from tests.helpers.streams import of_type

from .conftest import Server, events_until, speech, stream_realtime, transcribe, words

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

MODEL = "gpt-realtime"


async def collect(conn: Any, stop: str = "response.done", limit_s: float = 180) -> list[Any]:
    return [e async for e in events_until(conn, stop, limit_s)]


class Microphone:
    """Streams silence in real time, as a live microphone would, and speech on demand."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._queue: asyncio.Queue[np.ndarray] = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    def say(self, pcm: np.ndarray) -> None:
        self._queue.put_nowait(pcm)

    async def _run(self) -> None:
        silence = np.zeros(24000 // 50, np.int16)
        while True:
            pcm = self._queue.get_nowait() if not self._queue.empty() else silence
            await stream_realtime(self._conn.input_audio_buffer.append, pcm)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def test_text_turn(server: Server) -> None:
    async with server.client().realtime.connect(model=MODEL) as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
            }
        )
        updated = await conn.recv()
        assert updated.type == "session.updated"
        assert isinstance(updated.session, RealtimeSessionCreateRequest)
        assert updated.session.output_modalities == ["text"]
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the capital of France?"}],
            }
        )
        await conn.response.create()
        events = await collect(conn)
    deltas = "".join(e.delta for e in of_type(events, "response.output_text.delta"))
    (text_done,) = of_type(events, "response.output_text.done")
    assert text_done.text == deltas
    assert "paris" in deltas.lower()
    done = events[-1].response
    assert done.status == "completed"
    assert done.usage.output_tokens > 0
    assert done.output[0].content[0].text == deltas


async def test_spoken_turn(server: Server) -> None:
    question = await speech("What is the capital of France?")
    async with server.client().realtime.connect(model=MODEL) as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {
                        "transcription": {"model": "whisper-1", "language": "en"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                    }
                },
            }
        )
        assert (await conn.recv()).type == "session.updated"
        mic = Microphone(conn)
        mic.say(question)
        try:
            # hark finishes recognition before the reply starts, so it comes before response.done.
            events = await collect(conn)
        finally:
            await mic.close()
    types = [e.type for e in events]
    assert (
        types.index("input_audio_buffer.speech_started")
        < types.index("input_audio_buffer.speech_stopped")
        < types.index("response.created")
    )
    (heard_question,) = of_type(events, "conversation.item.input_audio_transcription.completed")
    assert {"capital", "france"} <= set(words(heard_question.transcript))
    done = events[-1].response
    assert done.status == "completed"
    audio = np.frombuffer(
        b"".join(base64.b64decode(e.delta) for e in of_type(events, "response.output_audio.delta")),
        dtype="<i2",
    ).astype(np.int16)
    (transcript_done,) = of_type(events, "response.output_audio_transcript.done")
    transcript = transcript_done.transcript
    assert transcript.strip()
    assert "".join(e.delta for e in of_type(events, "response.output_audio_transcript.delta")) == (
        transcript
    )
    assert len(audio) > 24000 * 0.3
    heard_reply = await transcribe(audio, 24000)
    said, heard = words(transcript), set(words(heard_reply))
    matched = sum(w in heard for w in said) / len(said)
    assert matched >= 0.6, (transcript, heard_reply)


WEATHER: RealtimeFunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


async def test_forced_tool_call_and_answer(server: Server) -> None:
    async with server.client().realtime.connect(model=MODEL) as conn:
        await conn.recv()
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "name": "get_weather"},
            }
        )
        assert (await conn.recv()).type == "session.updated"
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What's the weather like in Paris?"}],
            }
        )
        await conn.response.create()
        events = await collect(conn)
        (call,) = of_type(events, "response.function_call_arguments.done")
        assert call.name == "get_weather"
        arguments = json.loads(call.arguments)
        assert set(arguments) == {"city", "unit"}
        assert isinstance(arguments["city"], str) and arguments["city"]
        assert arguments["unit"] in ("celsius", "fahrenheit")
        streamed = "".join(
            e.delta for e in of_type(events, "response.function_call_arguments.delta")
        )
        assert streamed == call.arguments
        done = events[-1].response
        assert done.status == "completed"
        assert done.output[0].type == "function_call"
        assert done.output[0].call_id == call.call_id

        await conn.conversation.item.create(
            item={
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": json.dumps({"temperature": 18, "unit": "celsius", "sky": "sunny"}),
            }
        )
        await conn.response.create(response={"tool_choice": "none"})
        answer = await collect(conn)
    final = answer[-1].response
    assert final.status == "completed"
    assert final.output[0].type == "message"
    text = "".join(e.delta for e in of_type(answer, "response.output_text.delta"))
    assert text.strip()


async def test_barge_in_and_truncate(server: Server) -> None:
    question = await speech("Tell me a long story about a dragon and a knight.")
    interruption = await speech("Wait, stop please.")
    async with server.client().realtime.connect(model=MODEL) as conn:
        await conn.recv()
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "You are a storyteller. Tell long, detailed stories of at "
                "least ten sentences.",
                "max_output_tokens": 400,
                "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
            }
        )
        assert (await conn.recv()).type == "session.updated"
        mic = Microphone(conn)
        mic.say(question)
        received = 0
        item_id = None
        transcript = ""
        try:
            async with asyncio.timeout(180):
                while True:
                    event = await conn.recv()
                    if event.type == "response.output_audio.delta":
                        if received == 0:
                            mic.say(interruption)
                        item_id = event.item_id
                        received += len(base64.b64decode(event.delta)) // 2
                    elif event.type == "response.output_audio_transcript.delta":
                        transcript += event.delta
                    elif event.type == "response.done":
                        done = event.response
                        break
        finally:
            await mic.close()
        assert done.status == "cancelled"
        assert done.status_details is not None
        assert done.status_details.reason == "turn_detected"
        assert item_id is not None and received > 0
        # The listener heard half of what arrived: cut the item there.
        heard_ms = received * 1000 // 24000 // 2
        await conn.conversation.item.truncate(
            item_id=item_id, content_index=0, audio_end_ms=heard_ms
        )
        async with asyncio.timeout(30):
            while (event := await conn.recv()).type != "conversation.item.truncated":
                assert event.type != "error", event
        assert event.item_id == item_id and event.audio_end_ms == heard_ms
        await conn.conversation.item.retrieve(item_id=item_id)
        async with asyncio.timeout(30):
            while (event := await conn.recv()).type != "conversation.item.retrieved":
                pass
    assert isinstance(event.item, RealtimeConversationItemAssistantMessage)
    part = event.item.content[0]
    assert part.audio is not None
    assert len(base64.b64decode(part.audio)) == heard_ms * 24 * 2
    kept = words(part.transcript or "")
    assert kept == words(transcript)[: len(kept)]
    assert len(kept) < len(words(transcript))


async def test_bad_input_gets_errors_and_the_session_goes_on(server: Server) -> None:
    half_second = base64.b64encode(np.zeros(12000, "<i2").tobytes()).decode()
    bad: list[tuple[str | bytes, str]] = [
        ("{this is not json", "invalid_json"),
        (json.dumps({"event_id": "e_missing"}), "invalid_event"),
        (json.dumps({"type": "no.such.event", "event_id": "e_unknown"}), "invalid_value"),
        (
            json.dumps(
                {"type": "session.update", "event_id": "e_type", "session": {"instructions": 5}}
            ),
            "invalid_type",
        ),
        (
            json.dumps({"type": "input_audio_buffer.append", "event_id": "e_b64", "audio": "%%%"}),
            "invalid_value",
        ),
        (
            json.dumps(
                {
                    "type": "input_audio_buffer.append",
                    "event_id": "e_big",
                    "audio": "A" * (15 * 1024 * 1024 + 8),
                }
            ),
            "invalid_value",
        ),
        (
            json.dumps({"type": "input_audio_buffer.commit", "event_id": "e_commit"}),
            "input_audio_buffer_commit_empty",
        ),
        (
            json.dumps({"type": "response.cancel", "event_id": "e_cancel"}),
            "response_cancel_not_active",
        ),
        (
            json.dumps(
                {
                    "type": "conversation.item.truncate",
                    "event_id": "e_trunc_unknown",
                    "item_id": "item_unknown",
                    "content_index": 0,
                    "audio_end_ms": 100,
                }
            ),
            "item_not_found",
        ),
        (
            json.dumps(
                {
                    "type": "conversation.item.truncate",
                    "event_id": "e_trunc_past",
                    "item_id": "assistant_audio",
                    "content_index": 0,
                    "audio_end_ms": 5000,
                }
            ),
            "invalid_value",
        ),
        (b"\x00\x01binary", "invalid_event"),
    ]
    async with server.client().realtime.connect(model=MODEL) as conn:
        await conn.recv()
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        assert (await conn.recv()).type == "session.updated"
        await conn.conversation.item.create(
            item={
                "id": "assistant_audio",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_audio", "audio": half_second, "transcript": "Hi."}],
            }
        )
        assert (await conn.recv()).type == "conversation.item.added"
        assert (await conn.recv()).type == "conversation.item.done"
        for raw, code in bad:
            await conn.send_raw(raw)
            async with asyncio.timeout(30):
                error = await conn.recv()
            assert error.type == "error", (raw[:80], error)
            assert error.error.code == code, (raw[:80], error.error)
            assert error.error.message
            if isinstance(raw, str) and '"event_id"' in raw:
                assert error.error.event_id == json.loads(raw)["event_id"]
            # The next valid event works.
            await conn.session.update(session={"type": "realtime", "instructions": "Still here."})
            async with asyncio.timeout(30):
                assert (await conn.recv()).type == "session.updated"

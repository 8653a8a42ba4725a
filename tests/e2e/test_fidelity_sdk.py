"""End to end with the official `openai` SDK on the fake engines: what clients written for
OpenAI do that used to wedge or go unanswered (issue 16).

Audio items with no transcript are transcribed and answered; ``idle_timeout_ms`` fires for a
WebSocket client that stopped sending.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.helpers.streams import of_type

from .conftest import Server, events_until, fake_hark, speech

pytestmark = [pytest.mark.slow, pytest.mark.realtime]


@pytest.fixture(scope="module")
def fake_server() -> Iterator[Server]:
    """`hark serve --engines fake`: a real server and VAD, scripted ASR, LLM and TTS."""
    with fake_hark("e2e-fidelity-fake-server.log") as server:
        yield server


async def collect(conn: Any, stop: str = "response.done", limit_s: float = 60) -> list[Any]:
    return [e async for e in events_until(conn, stop, limit_s)]


async def audio_item() -> dict[str, Any]:
    pcm = await speech("What is the capital of France?")
    audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
    return {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}


async def text_session(conn: Any) -> None:
    assert (await conn.recv()).type == "session.created"
    await conn.session.update(
        session={
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}},
        }
    )
    assert (await conn.recv()).type == "session.updated"


async def test_inline_audio_without_a_transcript_is_answered(fake_server: Server) -> None:
    async with fake_server.client().realtime.connect(model="gpt-realtime") as conn:
        await text_session(conn)
        inline = {"input": [await audio_item()]}
        await conn.response.create(response=inline)  # type: ignore[arg-type]
        events = await collect(conn)
        assert not of_type(events, "error")
        (done,) = of_type(events, "response.done")
        assert done.response.status == "completed"
        assert "Paris" in "".join(e.delta for e in of_type(events, "response.output_text.delta"))
        # The conversation's next response is not blocked behind it.
        await conn.response.create()
        later = await collect(conn)
        assert of_type(later, "response.done")[0].response.status == "completed"


async def test_a_created_audio_item_is_answered_once_transcribed(fake_server: Server) -> None:
    async with fake_server.client().realtime.connect(model="gpt-realtime") as conn:
        await text_session(conn)
        await conn.conversation.item.create(item=await audio_item())  # type: ignore[arg-type]
        await conn.response.create()
        events = await collect(conn)
        assert not of_type(events, "error")
        added = [e.item for e in of_type(events, "conversation.item.added")]
        assert [item.role for item in added] == ["user", "assistant"]
        # Announced before its words are known: the transcript is null, not missing; the
        # reply is announced before its content.
        assert added[0].content[0].transcript is None
        assert added[1].content == []
        assert of_type(events, "response.done")[0].response.status == "completed"


async def test_idle_timeout_reaches_a_client_that_stopped_sending(fake_server: Server) -> None:
    async with fake_server.client().realtime.connect(model="gpt-realtime") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 1000}}
                },
            }
        )
        assert (await conn.recv()).type == "session.updated"
        pcm = np.concatenate(
            (await speech("What is the capital of France?"), np.zeros(24000, np.int16))
        )
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm.tobytes()).decode())
        turn = await collect(conn)
        assert of_type(turn, "response.done")[0].response.status == "completed"
        # Not one more byte of audio: the timeout comes on the wall clock.
        idle = await collect(conn, "input_audio_buffer.timeout_triggered", limit_s=30)
        (triggered,) = of_type(idle, "input_audio_buffer.timeout_triggered")
        assert triggered.audio_start_ms == triggered.audio_end_ms
        after = await collect(conn)
        (committed,) = of_type(after, "input_audio_buffer.committed")
        assert committed.item_id == triggered.item_id
        assert of_type(after, "response.done")[0].response.status == "completed"


async def test_any_model_name_opens_and_updates_a_session(fake_server: Server) -> None:
    client = fake_server.client()
    secret = await client.realtime.client_secrets.create(
        session={"type": "realtime", "model": "gpt-realtime-2.1"}
    )
    assert secret.session.model == "gpt-realtime-2.1"  # type: ignore[union-attr]
    async with fake_server.client(secret.value).realtime.connect(model="my-own-model") as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        await conn.session.update(session={"type": "realtime", "model": "gpt-4o-realtime-preview"})
        updated = await conn.recv()
        assert updated.type == "session.updated"
        assert updated.session.model == "gpt-4o-realtime-preview"  # type: ignore[union-attr]

"""End to end: transcription sessions (``?intent=transcription``) with the official `openai`
SDK against `hark serve` on the embedded models: spoken turns with server VAD and with
manual commits are transcribed and never answered; the intents and client secrets that open
such sessions."""

from __future__ import annotations

from typing import Any

import aiohttp
import numpy as np
import pytest
from openai.types.realtime import (
    RealtimeSessionCreateRequest,
    RealtimeTranscriptionSessionCreateRequest,
)

from .conftest import API_KEY, Server, events_until, speech, stream_realtime, words

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

TRANSCRIPTION = {"intent": "transcription"}
LONG = "Could you tell me what the capital of France is, and how many people live there?"
COMPLETED = "conversation.item.input_audio_transcription.completed"
LOGPROBS = "item.input_audio_transcription.logprobs"


def transcription_update(turn_detection: dict[str, Any] | None, include: list[str]) -> Any:
    """A transcription session's ``session.update`` body, as the SDK types it."""
    return {
        "type": "transcription",
        "include": include,
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": turn_detection,
            }
        },
    }


async def next_event(conn: Any) -> Any:
    """The next server event, as the SDK parsed it."""
    return await conn.recv()


def check_transcript(events: list[Any], expected: set[str]) -> str:
    """One completed transcript with ``expected`` among its words, the deltas adding up to it
    on the same item, and no response anywhere."""
    (completed,) = [e for e in events if e.type == COMPLETED]
    assert expected <= set(words(completed.transcript)), completed.transcript
    deltas = [e for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert deltas
    assert {d.item_id for d in deltas} == {completed.item_id}
    assert "".join(d.delta for d in deltas).strip() == completed.transcript.strip()
    assert not [e.type for e in events if e.type.startswith("response.")]
    return str(completed.item_id)


async def test_server_vad_transcription_session(server: Server) -> None:
    pcm = await speech(LONG)
    async with server.client().realtime.connect(extra_query=TRANSCRIPTION) as conn:
        created = await next_event(conn)
        assert created.type == "session.created"
        assert isinstance(created.session, RealtimeTranscriptionSessionCreateRequest)
        assert created.session.type == "transcription"
        await conn.session.update(
            session=transcription_update(
                {"type": "server_vad", "silence_duration_ms": 500}, [LOGPROBS]
            )
        )
        updated = await next_event(conn)
        assert updated.type == "session.updated"
        assert isinstance(updated.session, RealtimeTranscriptionSessionCreateRequest)
        assert updated.session.audio is not None and updated.session.audio.input is not None
        transcription = updated.session.audio.input.transcription
        assert transcription is not None and transcription.model == "gpt-4o-transcribe"
        assert updated.session.include == [LOGPROBS]
        # The sentence, then a second of silence to end the turn, at the pace of real time.
        await stream_realtime(
            conn.input_audio_buffer.append, np.concatenate((pcm, np.zeros(24000, np.int16)))
        )
        events: list[Any] = [e async for e in events_until(conn, COMPLETED)]
    types = [e.type for e in events]
    assert (
        types.index("input_audio_buffer.speech_started")
        < types.index("input_audio_buffer.speech_stopped")
        < types.index("input_audio_buffer.committed")
    )
    item_id = check_transcript(events, {"capital", "france", "people", "live"})
    assert events[types.index("input_audio_buffer.committed")].item_id == item_id
    # ``include`` adds a log probability per token, the tokens spelling the transcript.
    completed = events[types.index(COMPLETED)]
    assert completed.logprobs
    assert "".join(p.token for p in completed.logprobs) == completed.transcript
    assert all(p.logprob <= 0 for p in completed.logprobs)
    for delta in (e for e in events if e.type.endswith("transcription.delta")):
        assert delta.logprobs and "".join(p.token for p in delta.logprobs) == delta.delta


async def test_manual_commit_transcription_session(server: Server) -> None:
    pcm = await speech(LONG)
    async with server.client().realtime.connect(extra_query=TRANSCRIPTION) as conn:
        assert (await next_event(conn)).type == "session.created"
        await conn.session.update(session=transcription_update(None, []))
        updated = await next_event(conn)
        assert updated.type == "session.updated"
        assert updated.session.audio.input.turn_detection is None
        # A transcription session never answers: asking is an error, and the session goes on.
        await conn.response.create(event_id="evt_ask_1")
        refused = await next_event(conn)
        assert refused.type == "error"
        assert refused.error.code == "invalid_event"
        assert refused.error.event_id == "evt_ask_1"
        await stream_realtime(conn.input_audio_buffer.append, pcm)
        await conn.input_audio_buffer.commit()
        events: list[Any] = [e async for e in events_until(conn, COMPLETED)]
    types = [e.type for e in events]
    assert "input_audio_buffer.speech_started" not in types
    committed = events[types.index("input_audio_buffer.committed")]
    assert check_transcript(events, {"capital", "france", "people", "live"}) == committed.item_id
    # Without turn detection the captions still stream while the audio arrives.
    assert types.index("conversation.item.input_audio_transcription.delta") < types.index(
        "input_audio_buffer.committed"
    )


async def test_intents_and_transcription_client_secrets(server: Server) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    url = f"{server.ws}/realtime"
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{url}?intent=realtime", headers=auth) as ws:
            created = await ws.receive_json()
        assert isinstance(created["session"], dict)
        assert created["session"]["type"] == "realtime"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{url}?intent=translation", headers=auth)
        assert refused.value.status == 400

    client = server.client()
    secret = await client.realtime.client_secrets.create(
        session={
            "type": "transcription",
            "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}},
        }
    )
    assert secret.session.type == "transcription"
    # The key opens a transcription session without being told the intent.
    async with server.client(secret.value).realtime.connect() as conn:
        created = await next_event(conn)
    assert isinstance(created.session, RealtimeTranscriptionSessionCreateRequest)
    transcription = created.session.model_dump()["audio"]["input"]["transcription"]
    assert transcription["model"] == "gpt-4o-transcribe"
    # A realtime intent contradicts the key's session.
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(
                f"{url}?intent=realtime", headers={"Authorization": f"Bearer {secret.value}"}
            )
        assert refused.value.status == 400
    # And a realtime session is still one with the SDK's defaults.
    async with server.client().realtime.connect(model="gpt-realtime") as conn:
        assert isinstance((await next_event(conn)).session, RealtimeSessionCreateRequest)

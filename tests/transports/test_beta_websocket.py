"""End to end: a client of the beta dialect (``OpenAI-Beta: realtime=v1``) over a raw
WebSocket against a real server on the fake engines (real VAD), the beta way to mint keys
(``POST /v1/realtime/sessions``), and GA clients beside it, unchanged."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from hark.config import Settings
from tests.conftest import engines_sharing_turn
from tests.server.conftest import RunningServer, serving, wait_ready

API_KEY = "sk-test-beta-dialect-0123456789"
BETA = {"OpenAI-Beta": "realtime=v1"}
# Names a beta client must never see: GA's for what the beta called otherwise.
GA_NAMES = {
    "conversation.item.added",
    "conversation.item.done",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.delta",
    "response.output_audio_transcript.done",
    "response.output_text.delta",
    "response.output_text.done",
}


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    async with serving() as start:
        settings = Settings(engines="fake", api_keys=(API_KEY,))
        running = await start(settings, engines_sharing_turn(settings))
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, running)
        yield running


def auth(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), timeout=30)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    event: dict[str, Any] = json.loads(msg.data)
    return event


async def until(ws: aiohttp.ClientWebSocketResponse, last: str) -> list[dict[str, Any]]:
    """Events up to and including the next one of type ``last``."""
    events = [await receive(ws)]
    while events[-1]["type"] != last:
        events.append(await receive(ws))
    return events


async def send(ws: aiohttp.ClientWebSocketResponse, event: dict[str, Any]) -> None:
    await ws.send_str(json.dumps(event))


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def test_a_text_turn_in_the_beta_dialect(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    async with http.ws_connect(server.ws_url, headers={**auth(), **BETA}) as ws:
        created = await receive(ws)
        assert created["type"] == "session.created"
        session = created["session"]
        assert session["object"] == "realtime.session"
        assert session["modalities"] == ["audio", "text"]
        assert session["input_audio_format"] == "pcm16"
        assert "audio" not in session and "output_modalities" not in session
        assert (await receive(ws))["type"] == "conversation.created"

        await send(
            ws,
            {
                "type": "session.update",
                "session": {"modalities": ["text"], "instructions": "Answer briefly."},
            },
        )
        updated = await receive(ws)
        assert updated["type"] == "session.updated"
        assert updated["session"]["modalities"] == ["text"]
        assert updated["session"]["instructions"] == "Answer briefly."

        await send(
            ws,
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What is the capital?"}],
                },
            },
        )
        (item_created,) = await until(ws, "conversation.item.created")
        assert item_created["item"]["role"] == "user"
        await send(ws, {"type": "response.create"})
        events = await until(ws, "response.done")
    kinds = types(events)
    assert not GA_NAMES & set(kinds), kinds
    assert kinds[0] == "response.created"
    assert events[0]["response"]["modalities"] == ["text"]
    deltas = [e["delta"] for e in events if e["type"] == "response.text.delta"]
    (text_done,) = [e for e in events if e["type"] == "response.text.done"]
    assert "".join(deltas) == text_done["text"] == "The capital of France is Paris."
    (assistant,) = [e for e in events if e["type"] == "conversation.item.created"]
    assert assistant["item"]["role"] == "assistant"
    (output,) = events[-1]["response"]["output"]
    assert output["content"] == [{"type": "text", "text": text_done["text"]}]


async def test_an_audio_turn_in_the_beta_dialect(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # A browser's form: the dialect as a subprotocol, the key as another.
    protocols = ("realtime", "openai-beta.realtime-v1", f"openai-insecure-api-key.{API_KEY}")
    async with http.ws_connect(server.ws_url, protocols=protocols) as ws:
        assert ws.protocol == "realtime"
        await until(ws, "conversation.created")
        await send(
            ws,
            {
                "type": "session.update",
                "session": {
                    "turn_detection": None,
                    "input_audio_format": "g711_ulaw",
                    "output_audio_format": "g711_ulaw",
                    "voice": "verse",
                    "input_audio_transcription": {"model": "whisper-1"},
                },
            },
        )
        updated = await receive(ws)
        assert updated["session"]["turn_detection"] is None
        assert updated["session"]["output_audio_format"] == "g711_ulaw"
        # Half a second of μ-law silence (0xFF), committed by hand.
        audio = base64.b64encode(bytes([0xFF]) * 4000).decode()
        await send(ws, {"type": "input_audio_buffer.append", "audio": audio})
        await send(ws, {"type": "input_audio_buffer.commit"})
        committed = await until(ws, "conversation.item.created")
        assert types(committed) == ["input_audio_buffer.committed", "conversation.item.created"]
        assert committed[-1]["item"]["content"][0]["type"] == "input_audio"
        await send(ws, {"type": "response.create"})
        events = await until(ws, "response.done")
    kinds = types(events)
    assert not GA_NAMES & set(kinds), kinds
    audio_deltas = [e for e in events if e["type"] == "response.audio.delta"]
    assert audio_deltas
    pcm = b"".join(base64.b64decode(e["delta"]) for e in audio_deltas)
    (transcript,) = [
        e["transcript"] for e in events if e["type"] == "response.audio_transcript.done"
    ]
    # The fake TTS speaks 0.4 s a word, here as 8000 μ-law bytes a second.
    assert len(pcm) == len(transcript.split()) * 3200
    assert "response.audio.done" in kinds
    (part,) = [e["part"] for e in events if e["type"] == "response.content_part.added"]
    assert part["type"] == "audio"
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert done["voice"] == "verse" and done["output_audio_format"] == "g711_ulaw"
    assert done["output"][0]["content"][0]["type"] == "audio"


async def test_ga_clients_are_unchanged_and_keep_the_transcription_alias(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    async with http.ws_connect(server.ws_url, headers=auth()) as ws:
        created = await receive(ws)
        assert created["session"]["output_modalities"] == ["audio"]
        await send(
            ws,
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hi."}],
                },
            },
        )
        assert types(await until(ws, "conversation.item.done")) == [
            "conversation.item.added",
            "conversation.item.done",
        ]
    url = server.ws_url + "?intent=transcription"
    async with http.ws_connect(url, headers=auth()) as ws:
        assert (await receive(ws))["session"]["type"] == "transcription"
        await send(
            ws,
            {
                "type": "transcription_session.update",
                "event_id": "t1",
                "session": {"input_audio_format": "g711_alaw", "turn_detection": None},
            },
        )
        updated = await receive(ws)
        assert updated["type"] == "transcription_session.updated"
        assert updated["session"]["input_audio_format"] == "g711_alaw"
        await send(
            ws, {"type": "transcription_session.update", "session": {"input_audio_format": 1}}
        )
        error = (await receive(ws))["error"]
        assert error["param"] == "session.input_audio_format"


async def test_a_beta_transcription_session(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    url = server.ws_url + "?intent=transcription"
    async with http.ws_connect(url, headers=auth() | BETA) as ws:
        created = await receive(ws)
        assert created["type"] == "transcription_session.created"
        assert created["session"]["object"] == "realtime.transcription_session"
        await send(
            ws,
            {
                "type": "transcription_session.update",
                "session": {"input_audio_transcription": {"model": "whisper-1"}},
            },
        )
        # Next comes the answer: no conversation.created was sent before it.
        updated = await receive(ws)
        assert updated["type"] == "transcription_session.updated"
        assert "client_secret" not in updated["session"]


async def test_beta_sessions_route_mints_a_key_for_a_flat_session(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = {
        "modalities": ["text"],
        "instructions": "Speak like a pirate.",
        "voice": "ash",
        "input_audio_format": "g711_alaw",
        "client_secret": {"expires_after": {"anchor": "created_at", "seconds": 120}},
    }
    async with http.post(server.url + "/v1/realtime/sessions", json=body, headers=auth()) as r:
        assert r.status == 200, await r.text()
        minted = await r.json()
    assert minted["client_secret"]["value"].startswith("ek_")
    assert minted["client_secret"]["expires_at"] == minted["expires_at"]
    assert minted["object"] == "realtime.session" and minted["id"].startswith("sess_")
    assert minted["modalities"] == ["text"] and minted["voice"] == "ash"
    assert minted["input_audio_format"] == "g711_alaw"
    key = minted["client_secret"]["value"]
    async with http.ws_connect(server.ws_url, headers={**auth(key), **BETA}) as ws:
        session = (await receive(ws))["session"]
        assert session["instructions"] == "Speak like a pirate."
        assert session["input_audio_format"] == "g711_alaw"
    # The key cannot mint another; mistakes name the flat field.
    async with http.post(server.url + "/v1/realtime/sessions", json={}, headers=auth(key)) as r:
        assert r.status in (401, 403)
    bad = {"voice": 5}
    async with http.post(server.url + "/v1/realtime/sessions", json=bad, headers=auth()) as r:
        assert r.status == 400
        error = (await r.json())["error"]
        assert error["param"] == "voice"
    short = {"client_secret": {"expires_after": {"seconds": 1}}}
    async with http.post(server.url + "/v1/realtime/sessions", json=short, headers=auth()) as r:
        assert r.status == 400
        assert (await r.json())["error"]["code"] == "integer_below_min_value"


async def test_beta_transcription_sessions_route(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = {
        "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "fr"},
        "turn_detection": None,
    }
    url = server.url + "/v1/realtime/transcription_sessions"
    async with http.post(url, json=body, headers=auth()) as r:
        assert r.status == 200, await r.text()
        minted = await r.json()
    assert minted["object"] == "realtime.transcription_session"
    assert minted["input_audio_transcription"]["language"] == "fr"
    assert minted["turn_detection"] is None
    async with http.ws_connect(server.ws_url, headers=auth(minted["client_secret"]["value"])) as ws:
        session = (await receive(ws))["session"]
        assert session["type"] == "transcription"
        assert session["audio"]["input"]["transcription"]["language"] == "fr"
    async with http.post(url, json={"instructions": "x"}, headers=auth()) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "instructions"

"""The append limit over a real WebSocket: an append at the limit is taken whole, one byte of
audio over it gets one ``error`` and the session goes on. One number everywhere: the core's
``MAX_APPEND_BYTES``, which the transport's frame limit and the README follow."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from hark.config import Settings
from hark.engines.registry import Engines
from hark.protocol.limits import MAX_APPEND_BYTES, MAX_MESSAGE_BYTES, MiB

from .conftest import API_KEY, StartServer, bearer

KEYED = Settings(api_keys=(API_KEY,))
README = Path(__file__).resolve().parents[2] / "README.md"
# The most audio bytes whose base64 fits the limit, and one more.
AT_LIMIT = MAX_APPEND_BYTES // 4 * 3
OVER_LIMIT = AT_LIMIT + 1
RATE = 24000


def append(audio: bytes, event_id: str) -> str:
    return json.dumps(
        {
            "type": "input_audio_buffer.append",
            "event_id": event_id,
            "audio": base64.b64encode(audio).decode(),
        }
    )


@pytest.fixture
async def ws(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A session without turn detection that transcribes what is committed."""
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(server.ws_url, headers=bearer(API_KEY)) as socket:
        assert (await next_event(socket))["type"] == "session.created"
        await socket.send_json(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {
                        "input": {
                            "turn_detection": None,
                            "transcription": {"model": "whisper-1"},
                        }
                    },
                },
            }
        )
        assert (await next_event(socket))["type"] == "session.updated"
        yield socket
    await fake_engines.aclose()


async def next_event(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), timeout=60)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    event: dict[str, Any] = json.loads(msg.data)
    return event


async def event_of_type(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    """The next event of type ``kind``; any ``error`` before it fails the test."""
    while (event := await next_event(ws))["type"] != kind:
        assert event["type"] != "error", event
    return event


def test_the_limit_is_fifteen_mib_of_base64_everywhere() -> None:
    assert MAX_APPEND_BYTES == 15 * 1024 * 1024
    assert len(base64.b64encode(bytes(AT_LIMIT))) == MAX_APPEND_BYTES
    assert len(base64.b64encode(bytes(OVER_LIMIT))) > MAX_APPEND_BYTES
    # The transport lets every append up to the limit, and one just over, reach the session.
    assert len(append(bytes(OVER_LIMIT), "x" * 100)) < MAX_MESSAGE_BYTES
    assert MiB >= MAX_MESSAGE_BYTES - MAX_APPEND_BYTES
    readme = " ".join(README.read_text().split())
    assert (
        f"appends whose base64 audio is over {MAX_APPEND_BYTES // MiB} MiB "
        f"({MAX_APPEND_BYTES:,} characters)" in readme
    )
    assert f"Frames over {MAX_MESSAGE_BYTES // MiB} MiB" in readme


async def test_an_append_at_the_limit_is_taken_whole(
    ws: aiohttp.ClientWebSocketResponse,
) -> None:
    # Whole 16-bit samples: 245.76 s of audio/pcm at 24 kHz.
    assert AT_LIMIT % 2 == 0
    audio = np.full(AT_LIMIT // 2, 1000, "<i2").tobytes()
    await ws.send_str(append(audio, "evt_at_limit"))
    await ws.send_json({"type": "input_audio_buffer.commit", "event_id": "evt_commit"})
    committed = await event_of_type(ws, "input_audio_buffer.committed")
    completed = await event_of_type(ws, "conversation.item.input_audio_transcription.completed")
    assert completed["item_id"] == committed["item_id"]
    # All of it reached the buffer: the transcription was of every second appended.
    assert completed["usage"]["seconds"] == pytest.approx(AT_LIMIT / 2 / RATE, abs=0.01)


async def test_one_byte_over_the_limit_gets_one_error_and_the_session_goes_on(
    ws: aiohttp.ClientWebSocketResponse,
) -> None:
    await ws.send_str(append(bytes(OVER_LIMIT), "evt_over"))
    # Nothing of it reached the buffer: a commit finds it empty.
    await ws.send_json({"type": "input_audio_buffer.commit", "event_id": "evt_empty"})
    over = await next_event(ws)
    empty = await next_event(ws)
    assert over == {
        "type": "error",
        "event_id": over["event_id"],
        "error": {
            "type": "invalid_request_error",
            "code": "invalid_value",
            "message": f"Audio append of {MAX_APPEND_BYTES + 4} bytes exceeds the 15 MiB limit "
            "per event.",
            "param": "audio",
            "event_id": "evt_over",
        },
    }
    assert over["event_id"].startswith("event_")
    assert empty["type"] == "error"
    assert empty["error"]["code"] == "input_audio_buffer_commit_empty"
    assert empty["error"]["event_id"] == "evt_empty"

    # The session goes on: audio appended now is committed as usual.
    await ws.send_str(append(np.full(RATE // 5, 1000, "<i2").tobytes(), "evt_small"))
    await ws.send_json({"type": "input_audio_buffer.commit"})
    await event_of_type(ws, "input_audio_buffer.committed")
    completed = await event_of_type(ws, "conversation.item.input_audio_transcription.completed")
    assert completed["usage"]["seconds"] == pytest.approx(0.2, abs=0.01)

"""Two sessions on one real server, run at the same time, never see each other's events or
audio: each hears its own tone, gets its own transcript and reply, in its own format, and
no id of the other session appears in anything it receives."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import pytest

from hark.audio.formats import decode_audio, encode_audio, format_rate
from hark.config import Settings
from hark.engines.fake import FakeTts
from hark.engines.registry import Engines, build_engines
from hark.protocol.session_config import AudioFormat, PcmaFormat, PcmFormat
from tests.helpers.audio import tone
from tests.helpers.net import bearer

from .conftest import API_KEY, StartServer
from .isolation import EchoLlm, PitchAsr, ids_in, own_ids

KEYED = Settings(api_keys=(API_KEY,))


@dataclass
class Caller:
    """One client: the tone it speaks and the format it uses, and all it received."""

    hertz: int
    fmt: AudioFormat
    wire_format: dict[str, Any]
    sent: bytes = b""
    texts: list[str] = field(default_factory=list)

    @property
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(text) for text in self.texts]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


@pytest.fixture
async def engines() -> AsyncIterator[Engines]:
    built = build_engines(Settings(engines="fake"))
    built.asr = PitchAsr()
    built.llm = EchoLlm()
    yield built
    await built.aclose()


async def receive_until(
    ws: aiohttp.ClientWebSocketResponse, caller: Caller, kind: str
) -> dict[str, Any]:
    async with asyncio.timeout(60):
        while True:
            msg = await ws.receive()
            assert msg.type is aiohttp.WSMsgType.TEXT, msg
            caller.texts.append(msg.data)
            event: dict[str, Any] = json.loads(msg.data)
            if event["type"] == kind:
                return event


async def converse(
    http: aiohttp.ClientSession, url: str, caller: Caller, both_ready: asyncio.Barrier
) -> None:
    """Say a tone, commit it, ask for a reply, and read everything up to the reply's end."""
    async with http.ws_connect(url, headers=bearer(API_KEY)) as ws:
        await receive_until(ws, caller, "session.created")
        await ws.send_json(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "instructions": f"Session of {caller.hertz} hertz.",
                    "audio": {
                        "input": {
                            "format": caller.wire_format,
                            "turn_detection": None,
                            "transcription": {"model": "whisper-1"},
                        },
                        "output": {"format": caller.wire_format},
                    },
                },
            }
        )
        await receive_until(ws, caller, "session.updated")
        # From here on both sessions exist and both send at once.
        await both_ready.wait()
        rate = format_rate(caller.fmt)
        caller.sent = encode_audio(
            caller.fmt, tone(caller.hertz, 0.6, rate=rate, level=0.3 * 32767)
        )
        step = len(caller.sent) // 30
        for start in range(0, len(caller.sent), step):
            payload = base64.b64encode(caller.sent[start : start + step]).decode()
            await ws.send_json({"type": "input_audio_buffer.append", "audio": payload})
            await asyncio.sleep(0)
        await ws.send_json({"type": "input_audio_buffer.commit"})
        committed = await receive_until(ws, caller, "input_audio_buffer.committed")
        await receive_until(ws, caller, "conversation.item.input_audio_transcription.completed")
        await ws.send_json({"type": "response.create"})
        await receive_until(ws, caller, "response.done")
        await ws.send_json({"type": "conversation.item.retrieve", "item_id": committed["item_id"]})
        await receive_until(ws, caller, "conversation.item.retrieved")


async def test_two_websocket_sessions_on_one_server_stay_apart(
    start_server: StartServer, http: aiohttp.ClientSession, engines: Engines
) -> None:
    server = await start_server(KEYED, engines)
    low = Caller(300, PcmFormat(), {"type": "audio/pcm", "rate": 24000})
    high = Caller(700, PcmaFormat(), {"type": "audio/pcma"})
    both_ready = asyncio.Barrier(2)
    await asyncio.gather(
        converse(http, server.ws_url, low, both_ready),
        converse(http, server.ws_url, high, both_ready),
    )

    for me, other in ((low, high), (high, low)):
        # Its own session, items and responses, and none of the other's.
        (created,) = me.of_type("session.created")
        session_ids = {e["session"]["id"] for e in me.events if "session" in e}
        assert session_ids == {created["session"]["id"]}
        mine, theirs = own_ids(me.events), own_ids(other.events)
        assert mine and theirs and not mine & theirs
        assert not ids_in(me.texts) & theirs
        assert not ids_in(me.texts) & ids_in(other.texts)
        assert f"{other.hertz} hertz" not in "".join(me.texts)

        # What it said was heard as its own tone, and the reply says so.
        (transcribed,) = me.of_type("conversation.item.input_audio_transcription.completed")
        assert transcribed["transcript"] == f"{me.hertz} hertz"
        (done,) = me.of_type("response.done")
        assert done["response"]["status"] == "completed"
        reply = done["response"]["output"][0]["content"][0]["transcript"]
        assert reply == f"{me.hertz} hertz"
        (updated,) = me.of_type("session.updated")
        assert updated["session"]["instructions"] == f"Session of {me.hertz} hertz."

        # The reply's audio is its own, in its own format: FakeTts's tone for two words.
        rate = format_rate(me.fmt)
        deltas = [e for e in me.events if e["type"] == "response.output_audio.delta"]
        assert {e["response_id"] for e in deltas} == {done["response"]["id"]}
        audio = b"".join(base64.b64decode(e["delta"]) for e in deltas)
        pcm = decode_audio(me.fmt, audio)
        assert abs(len(pcm) - 2 * FakeTts.seconds_per_word * rate) <= rate // 100
        spectrum = np.abs(np.fft.rfft(pcm))
        assert np.argmax(spectrum) * rate / len(pcm) == pytest.approx(FakeTts.frequency, abs=5)

        # The conversation holds the audio it sent, not the other's.
        (retrieved,) = me.of_type("conversation.item.retrieved")
        kept = base64.b64decode(retrieved["item"]["content"][0]["audio"])
        assert kept == me.sent

"""A WebRTC call and a WebSocket session on one server, at the same time, never see each
other's events or audio."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from hark.bench.webrtc import AUDIBLE_RMS, CallClient
from hark.config import Settings
from hark.engines.fake import FakeTts
from hark.engines.registry import build_engines
from tests.server.isolation import EchoLlm, PitchAsr, ids_in, own_ids
from tests.transports.conftest import API_KEY, StartRtcServer, bearer, collect, of_type, until

MakeClient = Callable[..., CallClient]
CALL_SAYS = "alpha one two"
SOCKET_SAYS = "beta one two three"


def ask(text: str) -> list[dict[str, Any]]:
    """The client events that put ``text`` in the conversation and ask for a reply."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return [{"type": "conversation.item.create", "item": item}, {"type": "response.create"}]


def reply_ms(text: str) -> float:
    return FakeTts.seconds_per_word * len(text.split()) * 1000


async def websocket_turn(
    http: aiohttp.ClientSession, url: str, texts: list[str], together: asyncio.Barrier
) -> None:
    """Ask over a WebSocket once both sessions are open; stay until both are done."""
    async with http.ws_connect(url, headers=bearer(API_KEY)) as ws:

        async def until_event(kind: str) -> None:
            async with asyncio.timeout(60):
                while True:
                    msg = await ws.receive()
                    assert msg.type is aiohttp.WSMsgType.TEXT, msg
                    texts.append(msg.data)
                    if json.loads(msg.data)["type"] == kind:
                        return

        await until_event("session.created")
        await together.wait()
        for event in ask(SOCKET_SAYS):
            await ws.send_json(event)
        await until_event("response.done")
        await together.wait()


async def call_turn(
    client: CallClient, http: aiohttp.ClientSession, url: str, together: asyncio.Barrier
) -> list[Any]:
    """Ask over a call once both sessions are open; stay until both are done."""
    await client.connect(http, url, api_key=API_KEY)
    events = [await client.next_event("session.created")]
    await together.wait()
    for event in ask(CALL_SAYS):
        client.send(event)
    events += await collect(client, "output_audio_buffer.stopped", limit_s=60)
    await together.wait()
    return events


async def test_a_call_and_a_websocket_on_one_server_stay_apart(
    start_rtc_server: StartRtcServer, http: aiohttp.ClientSession, clients: MakeClient
) -> None:
    engines = build_engines(Settings(engines="fake"))
    engines.asr = PitchAsr()
    engines.llm = EchoLlm()
    server = await start_rtc_server(built=engines)
    client = clients()
    socket_texts: list[str] = []
    together = asyncio.Barrier(2)
    call_events, _ = await asyncio.gather(
        call_turn(client, http, server.url, together),
        websocket_turn(http, server.ws_url, socket_texts, together),
    )
    socket_events = [json.loads(text) for text in socket_texts]
    call_texts = [json.dumps(event) for event in call_events]

    mine, theirs = own_ids(call_events), own_ids(socket_events)
    assert mine and theirs and not mine & theirs
    assert not ids_in(call_texts) & ids_in(socket_texts)
    assert "beta" not in "".join(call_texts)
    assert "alpha" not in "".join(socket_texts)

    # Each got the reply to what it said.
    (call_done,) = of_type(call_events, "response.done")
    (socket_done,) = of_type(socket_events, "response.done")
    assert call_done["response"]["output"][0]["content"][0]["transcript"] == CALL_SAYS
    assert socket_done["response"]["output"][0]["content"][0]["transcript"] == SOCKET_SAYS

    # The call's audio came on its track, only its own reply's length of it ...
    assert [e["response_id"] for e in of_type(call_events, "output_audio_buffer.stopped")] == [
        call_done["response"]["id"]
    ]
    assert not of_type(call_events, "response.output_audio.delta")

    def heard_ms() -> int:
        return 20 * sum(f.rms > AUDIBLE_RMS for f in client.frames)

    await until(lambda: heard_ms() >= reply_ms(CALL_SAYS) - 100)
    assert heard_ms() <= reply_ms(CALL_SAYS) + 100
    # ... and the socket's as deltas of its own response, its own reply's length.
    deltas = [e for e in socket_events if e["type"] == "response.output_audio.delta"]
    assert {e["response_id"] for e in deltas} == {socket_done["response"]["id"]}
    samples = sum(len(base64.b64decode(e["delta"])) for e in deltas) // 2
    assert abs(samples - reply_ms(SOCKET_SAYS) * 24) <= 240

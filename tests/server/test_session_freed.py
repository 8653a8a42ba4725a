"""Sessions that ended on a real server are freed without the cycle collector.

Whatever ``hark serve`` keeps beside a session (its registry, metrics, the WebSocket
transport's callbacks) must let go of it when it ends, and nothing may tie the session's parts
into a cycle: otherwise each ended session's conversation audio waits for a full collection,
which hark's GC tuning makes rare, and the server's memory climbs with every session.
"""

from __future__ import annotations

import asyncio
import gc
import json
from base64 import b64encode

import aiohttp
import numpy as np
import pytest

from hark.config import Settings
from hark.engines.registry import Engines
from hark.server.app import STATE
from hark.session.core import Session
from tests.helpers.net import bearer

from .conftest import API_KEY, RunningServer, StartServer, wait_ready


def sessions_alive() -> int:
    """Session cores that still exist, reachable or not (the collector is off)."""
    return sum(1 for obj in gc.get_objects() if type(obj) is Session)


async def spoken_turn(http: aiohttp.ClientSession, server: RunningServer) -> None:
    """One WebSocket session: a second of audio, committed and answered in audio; then closed
    by the client, and returns once the server has ended the session."""
    state = server.app[STATE]
    pcm = (np.sin(np.arange(24_000) / 5) * 8000).astype("<i2")
    events = [
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
        },
        {"type": "input_audio_buffer.append", "audio": b64encode(pcm.tobytes()).decode()},
        {"type": "input_audio_buffer.commit"},
        {"type": "response.create"},
    ]
    async with http.ws_connect(server.ws_url + "?model=m", headers=bearer(API_KEY)) as ws:
        for event in events:
            await ws.send_str(json.dumps(event))
        async for message in ws:
            event = json.loads(message.data)
            assert event["type"] != "error", event
            if event["type"] == "response.done":
                assert event["response"]["status"] == "completed"
                break
    while state.sessions:
        state.session_ended.clear()
        await asyncio.wait_for(state.session_ended.wait(), 30)


@pytest.mark.usefixtures("no_cycle_collector")
async def test_ended_websocket_sessions_are_freed_without_the_cycle_collector(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    server = await start_server(Settings(api_keys=(API_KEY,)), fake_engines)
    await wait_ready(http, server)
    before = sessions_alive()
    for _ in range(3):
        await spoken_turn(http, server)
    # The handler's last references go as its task finishes.
    for _ in range(3):
        await asyncio.sleep(0)
    assert sessions_alive() == before

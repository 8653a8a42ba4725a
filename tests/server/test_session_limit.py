"""The session limit over a real WebSocket: the client is told, the socket is closed.

OpenAI's limit is 60 minutes; ``create_app(session_limit_s=…)`` shortens it here so that the
limit passes during the test.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from hark.config import Settings
from hark.engines.registry import Engines
from hark.protocol.limits import SESSION_LIMIT_S
from hark.server.app import SESSION_LIMIT, STATE
from tests.helpers.net import bearer

from .conftest import API_KEY, HangingLlm, StartServer

KEYED = Settings(api_keys=(API_KEY,), rtc_port=0)
# Long enough for a loaded machine to connect and start a response before it passes.
SHORT_LIMIT_S = 2.0


async def next_message(ws: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
    return await asyncio.wait_for(ws.receive(), timeout=30)


async def test_the_default_limit_is_sixty_minutes(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    assert SESSION_LIMIT_S == 60 * 60
    server = await start_server(KEYED, fake_engines)
    app, url = server.app, server.ws_url
    assert app[SESSION_LIMIT] == SESSION_LIMIT_S
    before = int(time.time())
    async with http.ws_connect(url, headers=bearer(API_KEY)) as ws:
        created = json.loads((await next_message(ws)).data)
        after = int(time.time()) + 1
    assert before + 3600 <= created["session"]["expires_at"] <= after + 3600


async def test_the_limit_cancels_the_response_tells_the_client_and_closes_the_socket(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    llm = fake_engines.llm = HangingLlm()
    server = await start_server(KEYED, fake_engines, session_limit_s=SHORT_LIMIT_S)
    app, url = server.app, server.ws_url
    before = time.time()
    async with http.ws_connect(url, headers=bearer(API_KEY)) as ws:
        created = json.loads((await next_message(ws)).data)
        assert created["type"] == "session.created"
        assert before <= created["session"]["expires_at"] <= time.time() + SHORT_LIMIT_S
        await ws.send_json({"type": "response.create", "response": {"conversation": "none"}})
        await asyncio.wait_for(llm.started.wait(), timeout=30)

        events: list[dict[str, Any]] = []
        while (msg := await next_message(ws)).type is aiohttp.WSMsgType.TEXT:
            events.append(json.loads(msg.data))
        # The server closed the socket normally once the client had been told why.
        assert msg.type is aiohttp.WSMsgType.CLOSE, msg
        assert msg.data == aiohttp.WSCloseCode.OK
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["response.done", "error"]
    assert events[-2]["response"]["status"] == "cancelled"
    error = events[-1]["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "session_expired"
    assert error["message"] == "Your session hit the maximum duration of 2 seconds."
    assert error["event_id"] is None
    # The session's engine work was stopped and the server let go of it.
    await asyncio.wait_for(llm.cancelled.wait(), timeout=10)
    state = app[STATE]
    await asyncio.wait_for(state.session_ended.wait(), timeout=10)
    assert not state.sessions
    assert not state.websockets

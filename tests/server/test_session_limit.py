"""The session limit over a real WebSocket: the client is told, the socket is closed.

OpenAI's limit is 60 minutes; ``create_app(session_limit_s=…)`` shortens it here so that the
limit passes during the test.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hark.config import Settings
from hark.engines.llm import Finished, GenerationRequest, LlmEvent
from hark.engines.registry import Engines, build_engines
from hark.server.app import SESSION_LIMIT, STATE, create_app, make_runner
from hark.session.core import SESSION_LIMIT_S

from .conftest import API_KEY, bearer

KEYED = Settings(api_keys=(API_KEY,), rtc_port=0)
# Long enough for a loaded machine to connect and start a response before it passes.
SHORT_LIMIT_S = 2.0

StartApp = Callable[..., Awaitable[tuple[web.Application, str]]]


class HangingLlm:
    """An LLM that starts a reply and never finishes it, recording its cancellation."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        """Wait until cancelled."""
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        yield Finished(reason="stop")  # unreachable; makes this an async generator

    async def prefill(self, request: GenerationRequest) -> None:
        """Nothing to read ahead."""

    async def warmup(self) -> None:
        """Nothing to load."""


@pytest.fixture
async def engines() -> AsyncIterator[Engines]:
    built = build_engines(Settings(engines="fake"))
    yield built
    await built.aclose()


@pytest.fixture
async def start_app() -> AsyncIterator[StartApp]:
    """``create_app(KEYED, engines, **kwargs)`` on a free loopback port: (app, ws url)."""
    runners: list[web.AppRunner] = []

    async def start(engines: Engines, **kwargs: Any) -> tuple[web.Application, str]:
        app = create_app(KEYED, engines, **kwargs)
        runner = make_runner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return app, f"ws://{host}:{port}/v1/realtime"

    yield start
    for runner in runners:
        await runner.cleanup()


async def next_message(ws: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
    return await asyncio.wait_for(ws.receive(), timeout=30)


async def test_the_default_limit_is_sixty_minutes(
    start_app: StartApp, engines: Engines, http: aiohttp.ClientSession
) -> None:
    assert SESSION_LIMIT_S == 60 * 60
    app, url = await start_app(engines)
    assert app[SESSION_LIMIT] == SESSION_LIMIT_S
    before = int(time.time())
    async with http.ws_connect(url, headers=bearer(API_KEY)) as ws:
        created = json.loads((await next_message(ws)).data)
        after = int(time.time()) + 1
    assert before + 3600 <= created["session"]["expires_at"] <= after + 3600


async def test_the_limit_cancels_the_response_tells_the_client_and_closes_the_socket(
    start_app: StartApp, engines: Engines, http: aiohttp.ClientSession
) -> None:
    llm = engines.llm = HangingLlm()
    app, url = await start_app(engines, session_limit_s=SHORT_LIMIT_S)
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

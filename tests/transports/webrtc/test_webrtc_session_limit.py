"""The session limit ends a WebRTC call: the client hears why, then the peer is closed.

OpenAI's limit is 60 minutes; ``create_app(session_limit_s=…)`` shortens it here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from hark.config import Settings
from hark.engines.registry import build_engines
from hark.server.app import CALLS
from tests.server.conftest import RunningServer, serving
from tests.transports.conftest import API_KEY, until

MakeClient = Callable[..., CallClient]
# Long enough for a loaded machine to set up the call (ICE, DTLS, SCTP) before it passes.
LIMIT_S = 5.0


@pytest.fixture
async def short_server() -> AsyncIterator[RunningServer]:
    """A server on the fake engines whose sessions last ``LIMIT_S``."""
    settings = Settings(engines="fake", rtc_port=0, api_keys=(API_KEY,))
    async with serving() as serve:
        yield await serve(settings, build_engines(settings), session_limit_s=LIMIT_S)


async def test_the_limit_ends_the_call(
    short_server: RunningServer,
    http: aiohttp.ClientSession,
    clients: MakeClient,
) -> None:
    app, url = short_server.app, short_server.url
    client = clients()
    closed = asyncio.Event()
    client.channel.on("close", closed.set)
    await client.connect(http, url, api_key=API_KEY)
    assert client.call_id is not None
    call = app[CALLS].get(client.call_id)
    assert call is not None
    created = await client.next_event("session.created")
    assert created["session"]["expires_at"] - call.runner.session.created_at <= LIMIT_S

    error = await client.next_event("error", limit_s=30)
    assert error["error"]["code"] == "session_expired"
    assert error["error"]["type"] == "invalid_request_error"
    # The server ended the call, and the client's peer saw it end.
    await asyncio.wait_for(call.closed.wait(), timeout=30)
    assert call.close_reason == "session ended"
    assert app[CALLS].get(client.call_id) is None
    await asyncio.wait_for(closed.wait(), timeout=30)
    assert client.channel.readyState == "closed"
    await until(lambda: client.pc.connectionState in ("closed", "failed"), limit_s=30)

"""A worker's abuse limits, on by default: sessions at once, open connections, how long a
connection may idle or dawdle over its headers, and the parts of a multipart form."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from hark.audio.files import wav_header
from hark.config import Settings
from hark.engines.registry import Engines
from hark.server.routes.transcriptions import MAX_PARTS
from tests.helpers.net import bearer

from .conftest import API_KEY, RunningServer, StartServer, wait_ready


async def open_session(
    http: aiohttp.ClientSession, server: RunningServer
) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(server.ws_url, headers=bearer(API_KEY))
    assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.created"
    return ws


async def test_a_worker_runs_at_most_max_sessions(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    settings = Settings(engines="fake", api_keys=(API_KEY,), max_sessions=1)
    server = await start_server(settings, fake_engines)
    await wait_ready(http, server)
    first = await open_session(http, server)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(server.ws_url, headers=bearer(API_KEY))
    assert refused.value.status == 503
    # A WebRTC offer counts against the same cap (refused before its SDP is looked at).
    async with http.post(
        server.url + "/v1/realtime/calls",
        data="v=0\r\n",
        headers={"Content-Type": "application/sdp", **bearer(API_KEY)},
    ) as response:
        assert response.status == 503
        assert (await response.json())["error"]["code"] == "server_at_capacity"
    await first.close()
    # Once the first session has ended, its place is free again.
    async with asyncio.timeout(30):
        while True:
            try:
                second = await open_session(http, server)
                break
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 503
                await asyncio.sleep(0.05)
    await second.close()


async def test_a_form_with_too_many_parts_is_refused(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    server = await start_server(Settings(engines="fake", api_keys=(API_KEY,)), fake_engines)
    pcm = bytes(3200)
    form = aiohttp.FormData()
    form.add_field("model", "whisper-1")
    for index in range(MAX_PARTS):
        form.add_field(f"x{index}", "")
    form.add_field("file", wav_header(16000, frames=1600) + pcm, filename="a.wav")
    async with http.post(
        server.url + "/v1/audio/transcriptions", data=form, headers=bearer(API_KEY)
    ) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["code"] == "too_many_parts"


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (an EOF or a reset, not an answer)."""
    try:
        return await reader.read(1024) == b""
    except ConnectionResetError:
        return True


async def test_an_idle_or_slow_connection_is_closed(
    start_server: StartServer, fake_engines: Engines
) -> None:
    settings = Settings(engines="fake", api_keys=(API_KEY,), http_idle_timeout=1)
    server = await start_server(settings, fake_engines)
    host, port = server.url.removeprefix("http://").split(":")
    idle = await asyncio.open_connection(host, int(port))
    slow = await asyncio.open_connection(host, int(port))
    # A request whose headers never end (slowloris).
    slow[1].write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n")
    async with asyncio.timeout(60):
        assert await closed_by_server(idle[0])
        assert await closed_by_server(slow[0])
    for _, writer in (idle, slow):
        writer.close()


async def test_connections_past_the_cap_are_closed(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    settings = Settings(engines="fake", api_keys=(API_KEY,), max_connections=2)
    server = await start_server(settings, fake_engines)
    host, port = server.url.removeprefix("http://").split(":")
    held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    async with asyncio.timeout(30):
        assert await closed_by_server(reader)
    writer.close()
    for _, held_writer in held:
        held_writer.close()
    # With the held connections gone, requests are answered again.
    async with asyncio.timeout(30):
        while True:
            try:
                async with (
                    aiohttp.ClientSession() as fresh,
                    fresh.get(server.url + "/healthz") as r,
                ):
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)

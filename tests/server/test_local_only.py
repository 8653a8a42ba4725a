"""Open mode (no API keys, loopback only) answers loopback Host names and pages of its own
origin, so that neither a foreign web page nor DNS rebinding can drive it; real requests
and a real WebSocket against the app."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import aiohttp
import pytest

from hark.config import Settings
from hark.engines.registry import Engines
from tests.helpers.net import bearer

from .conftest import API_KEY, RunningServer, StartServer

FOREIGN = "http://evil.example"


def port_of(server: RunningServer) -> int:
    port = urlsplit(server.url).port
    assert port is not None
    return port


async def error_of(response: aiohttp.ClientResponse) -> dict[str, str]:
    assert response.status == 403, await response.text()
    error: dict[str, str] = (await response.json())["error"]
    assert error["type"] == "invalid_request_error"
    return error


async def test_a_foreign_host_is_refused(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    server = await start_server(Settings(engines="fake"), fake_engines)
    port = port_of(server)
    models = server.url + "/v1/models"
    # A page of evil.example whose name now points at 127.0.0.1 (DNS rebinding) sends its
    # own name as Host.
    for host in (f"evil.example:{port}", "evil.example", "10.0.0.5", "[fe80::1]:80"):
        async with http.get(models, headers={"Host": host, **bearer("any")}) as response:
            error = await error_of(response)
        assert error["code"] == "forbidden_host", host
        assert "HARK_API_KEYS" in error["message"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.2"):
        async with http.get(models, headers={"Host": host, **bearer("any")}) as response:
            assert response.status == 200, host
    # The WebSocket upgrade and the WebRTC offer are refused before anything runs.
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(
            server.ws_url, headers={"Host": f"evil.example:{port}", **bearer("any")}
        )
    assert refused.value.status == 403
    async with http.post(
        server.url + "/v1/realtime/calls",
        data="v=0\r\n",
        headers={"Host": f"evil.example:{port}", "Content-Type": "application/sdp"},
    ) as response:
        assert (await error_of(response))["code"] == "forbidden_host"


async def test_a_foreign_origin_is_refused(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    server = await start_server(Settings(engines="fake"), fake_engines)
    for origin in (FOREIGN, "null", f"http://127.0.0.1:{port_of(server) + 1}"):
        headers = {"Origin": origin, **bearer("any")}
        async with http.get(server.url + "/v1/models", headers=headers) as response:
            assert (await error_of(response))["code"] == "forbidden_origin", origin
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(server.ws_url, headers=headers)
        assert refused.value.status == 403
        # The browser's preflight of an offer fails, and so does the offer itself.
        async with http.options(
            server.url + "/v1/realtime/calls",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        ) as response:
            await error_of(response)
        async with http.post(
            server.url + "/v1/realtime/calls",
            data="v=0\r\n",
            headers={"Content-Type": "application/sdp", **headers},
        ) as response:
            await error_of(response)
    # The server's own pages (the demo) and clients that send no Origin get through.
    async with http.ws_connect(server.ws_url, origin=server.url, headers=bearer("any")) as ws:
        assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.created"
    async with http.ws_connect(server.ws_url, headers=bearer("any")) as ws:
        assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.created"


async def test_the_operator_allows_more_hosts_and_origins(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    settings = Settings(
        engines="fake",
        allowed_hosts=("voice.lan",),
        allowed_origins=("http://app.lan:3000",),
    )
    server = await start_server(settings, fake_engines)
    port = port_of(server)
    for headers in (
        {"Host": f"voice.lan:{port}"},
        {"Origin": "http://app.lan:3000"},
        {"Host": f"voice.lan:{port}", "Origin": f"http://voice.lan:{port}"},
    ):
        async with http.get(
            server.url + "/v1/models", headers={**headers, **bearer("any")}
        ) as response:
            assert response.status == 200, headers
    async with http.get(
        server.url + "/v1/models", headers={"Origin": "http://app.lan:3001", **bearer("any")}
    ) as response:
        await error_of(response)


async def test_a_server_with_keys_serves_any_host_and_origin(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    # There the key is what keeps strangers out (pages call it cross-origin, as OpenAI).
    server = await start_server(Settings(engines="fake", api_keys=(API_KEY,)), fake_engines)
    headers = {"Host": "voice.example.org", "Origin": FOREIGN, **bearer(API_KEY)}
    async with http.get(server.url + "/v1/models", headers=headers) as response:
        assert response.status == 200

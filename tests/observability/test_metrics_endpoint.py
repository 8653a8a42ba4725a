"""GET /metrics: a Prometheus scrape, with an API key (loopback peers too: a reverse proxy or
a sidecar is one); a server without keys asks for none."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from hark.config import Settings
from hark.server.access import authentication
from hark.server.app import AUTHENTICATOR, METRICS, create_app, make_runner
from tests.conftest import engines_sharing_turn

API_KEY = "sk-test-metrics-0123456789"


@pytest.fixture
async def server() -> AsyncIterator[tuple[web.Application, str]]:
    engines = engines_sharing_turn(Settings(engines="fake", rtc_port=0))
    app = create_app(Settings(engines="fake", api_keys=(API_KEY,), rtc_port=0), engines)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield app, f"http://{host}:{port}"
    await runner.cleanup()
    await engines.aclose()


async def wait_ready(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(600):
        async with http.get(url + "/readyz") as response:
            if response.status == 200:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("the server never became ready")


async def test_a_loopback_scrape_needs_a_key_too(server: tuple[web.Application, str]) -> None:
    _, url = server
    async with aiohttp.ClientSession() as http:
        await wait_ready(http, url)
        async with http.get(url + "/metrics") as response:
            assert response.status == 401
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with http.get(url + "/metrics", headers=headers) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=")
            body = await response.text()
    assert "# TYPE hark_sessions_active gauge" in body
    # The VAD's warm-up went through its batcher, which reports to the app's metrics.
    assert 'hark_batcher_batch_size_count{model="vad"} 1.0' in body
    assert "hark_process_open_fds " in body


def remote_request(app: web.Application, headers: dict[str, str] | None = None) -> Any:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        ("203.0.113.9", 40000) if name == "peername" else default
    )
    return make_mocked_request("GET", "/metrics", headers=headers, app=app, transport=transport)


async def scrape_as_remote(app: web.Application, headers: dict[str, str] | None = None) -> int:
    request = remote_request(app, headers)
    assert request.remote == "203.0.113.9"
    match = await app.router.resolve(request)
    match.add_app(app)
    # What aiohttp does for a real request: the middleware reads the route's access from it.
    request._match_info = match
    response = await authentication(request, match.handler)
    assert isinstance(response, web.Response)
    return response.status


async def test_a_remote_scrape_needs_an_api_key(server: tuple[web.Application, str]) -> None:
    app, _ = server
    assert await scrape_as_remote(app) == 401
    assert await scrape_as_remote(app, {"Authorization": "Bearer sk-wrong"}) == 401
    assert await scrape_as_remote(app, {"Authorization": f"Bearer {API_KEY}"}) == 200


async def test_an_ephemeral_key_cannot_scrape(server: tuple[web.Application, str]) -> None:
    from hark.protocol.session_config import parse_session_config

    app, _ = server
    authenticator = app[AUTHENTICATOR]
    owner = await authenticator.authenticate(API_KEY)
    assert owner is not None
    ephemeral, _ = await authenticator.mint(owner, parse_session_config({}), "sess_x", 60)
    assert await scrape_as_remote(app, {"Authorization": f"Bearer {ephemeral}"}) == 403


async def test_the_app_exposes_its_metrics_object(server: tuple[web.Application, str]) -> None:
    app, _ = server
    session = app[METRICS].session("websocket")
    session.started()
    assert b'hark_sessions_active{transport="websocket"} 1.0' in app[METRICS].exposition()
    session.ended("client_closed")


async def test_a_server_without_keys_asks_for_none() -> None:
    engines = engines_sharing_turn(Settings(engines="fake", rtc_port=0))
    app = create_app(Settings(engines="fake", rtc_port=0), engines)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{host}:{port}/metrics") as response,
        ):
            assert response.status == 200
    finally:
        await runner.cleanup()
        await engines.aclose()

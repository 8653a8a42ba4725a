"""The authentication middleware: each route's declared access, enforced before it runs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from hark.cluster import open_store
from hark.config import Settings
from hark.engines.registry import Engines
from hark.protocol.session_config import parse_session_config
from hark.server.access import (
    KEY,
    PUBLIC,
    WEBSOCKET_KEY,
    Access,
    api_key_only,
    authentication,
    principal,
    requires,
)
from hark.server.app import create_app
from hark.server.auth import Authenticator
from hark.server.state import AUTHENTICATOR
from tests.helpers.net import bearer

from .conftest import API_KEY

REFUSAL = "Ephemeral keys cannot do this."
Handler = Callable[[web.Request], Awaitable[web.Response]]


def whoami() -> Handler:
    """A new handler each time: a declaration marks the function it is made on."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"owner": principal(request).owner})

    return handler


@requires(PUBLIC)
async def anyone(request: web.Request) -> web.Response:
    return web.json_response({"public": True})


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, Authenticator]]:
    """A bare app with the middleware and one route per kind of access."""
    store = open_store(None, tmp_path)
    await store.start()
    app = web.Application(middlewares=[authentication])
    app[AUTHENTICATOR] = Authenticator([API_KEY], store)

    app.add_routes(
        [
            web.get("/public", anyone),
            web.get("/undeclared", whoami()),
            web.get("/key", requires(KEY)(whoami())),
            web.get("/websocket", requires(WEBSOCKET_KEY)(whoami())),
            web.get("/api-key", requires(api_key_only(REFUSAL))(whoami())),
        ]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}", app[AUTHENTICATOR]
    await runner.cleanup()
    await store.aclose()


async def status(http: aiohttp.ClientSession, url: str, **options: object) -> int:
    async with http.get(url, **options) as response:  # type: ignore[arg-type]
        await response.read()
        return response.status


async def test_each_route_gets_the_access_it_declares(
    served: tuple[str, Authenticator], http: aiohttp.ClientSession
) -> None:
    url, authenticator = served
    owner = await authenticator.authenticate(API_KEY)
    assert owner is not None
    ephemeral, _ = await authenticator.mint(owner, parse_session_config({}), "sess_a", 60)
    subprotocol = {"Sec-WebSocket-Protocol": f"realtime, openai-insecure-api-key.{API_KEY}"}

    assert await status(http, url + "/public") == 200
    # A route that declares nothing needs a key, like one that declares KEY.
    for path in ("/undeclared", "/key"):
        assert await status(http, url + path) == 401
        assert await status(http, url + path, headers=bearer("sk-wrong")) == 401
        assert await status(http, url + path, headers=bearer(API_KEY)) == 200
        assert await status(http, url + path, headers=bearer(ephemeral)) == 200
        assert await status(http, url + path, headers=subprotocol) == 401
    assert await status(http, url + "/websocket", headers=subprotocol) == 200
    assert await status(http, url + "/api-key", headers=bearer(API_KEY)) == 200
    async with http.get(url + "/api-key", headers=bearer(ephemeral)) as response:
        assert response.status == 403
        error = (await response.json())["error"]
    assert error["message"] == REFUSAL and error["code"] == "insufficient_permissions"
    # What matches no route gets aiohttp's own answer, not a demand for a key.
    assert await status(http, url + "/nowhere") == 404
    async with http.post(url + "/public") as response:
        assert response.status == 405


async def test_the_principal_is_the_callers(
    served: tuple[str, Authenticator], http: aiohttp.ClientSession
) -> None:
    url, authenticator = served
    async with http.get(url + "/key", headers=bearer(API_KEY)) as response:
        body = await response.json()
    expected = await authenticator.authenticate(API_KEY)
    assert expected is not None and body == {"owner": expected.owner}


def test_every_route_of_the_app_declares_its_access(fake_engines: Engines) -> None:
    app = create_app(Settings(rtc_port=0), fake_engines)
    undeclared = [
        f"{route.method} {route.resource.canonical}"
        for route in app.router.routes()
        if route.resource is not None
        and route.method != "HEAD"
        and not isinstance(getattr(route.handler, "hark_access", None), Access)
    ]
    assert undeclared == []

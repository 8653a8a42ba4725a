"""The demo's routes and who may use them, CORS for browser calls, and the --demo option."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hark.cli import build_parser
from hark.config import ConfigError, Settings, load_settings
from hark.server.app import create_app
from hark.server.demo import DEMO_KEY_SECONDS, MAX_KEYS_PER_MINUTE, demo_enabled
from tests.conftest import engines_sharing_turn
from tests.helpers.net import bearer

API_KEY = "sk-test-demo-routes-key"
MakeClient = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
async def make_client() -> AsyncIterator[MakeClient]:
    """A factory: the app with fake engines (WebRTC on a free port), and a client for it."""
    clients: list[TestClient[Any, Any]] = []
    engines = engines_sharing_turn(Settings(engines="fake"))

    async def make(**settings: Any) -> TestClient[Any, Any]:
        app = create_app(Settings(engines="fake", rtc_port=0, **settings), engines)
        client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()
    await engines.aclose()


@pytest.mark.parametrize(
    ("host", "api_keys", "demo", "enabled"),
    [
        ("127.0.0.1", (), None, True),
        ("localhost", (), None, True),
        ("127.0.0.1", (API_KEY,), None, False),
        ("0.0.0.0", (API_KEY,), None, False),
        ("0.0.0.0", (API_KEY,), True, True),
        ("127.0.0.1", (), False, False),
    ],
)
def test_the_demo_is_on_by_default_only_where_keys_grant_nothing_new(
    host: str, api_keys: tuple[str, ...], demo: bool | None, enabled: bool
) -> None:
    settings = Settings(host=host, api_keys=api_keys, demo=demo)
    assert demo_enabled(settings) is enabled


async def test_the_page_and_its_assets(make_client: MakeClient) -> None:
    client = await make_client()
    page = await client.get("/")
    assert page.status == 200
    assert page.content_type == "text/html"
    html = await page.text()
    assert 'id="talk"' in html and "/demo/app.js" in html
    # The page loads nothing from elsewhere.
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert "http://" not in html and "https://" not in html
    script = await client.get("/demo/app.js")
    assert script.status == 200 and script.content_type == "text/javascript"
    body = await script.text()
    assert 'createDataChannel("oai-events")' in body and "/v1/realtime/calls" in body
    style = await client.get("/demo/style.css")
    assert style.status == 200 and style.content_type == "text/css"
    for missing in ("/demo/index.html", "/demo/__init__.py", "/demo/..%2Fauth.py"):
        assert (await client.get(missing)).status == 404, missing


async def test_a_disabled_demo_says_how_to_turn_it_on(make_client: MakeClient) -> None:
    client = await make_client(api_keys=(API_KEY,))
    page = await client.get("/")
    assert page.status == 200
    assert "--demo" in await page.text()
    assert (await client.get("/demo/app.js")).status == 404
    refused = await client.post("/demo/client_secret")
    assert refused.status == 403
    assert (await refused.json())["error"]["code"] == "demo_off"


async def test_the_page_gets_a_short_lived_key_for_its_session(make_client: MakeClient) -> None:
    client = await make_client(api_keys=(API_KEY,), demo=True)
    response = await client.post("/demo/client_secret")
    assert response.status == 200
    secret = await response.json()
    assert secret["value"].startswith("ek_")
    assert 0 < secret["expires_at"] - time.time() <= DEMO_KEY_SECONDS + 1
    session = secret["session"]
    assert session["include"] == ["hark.turn_timings"]
    assert session["audio"]["input"]["transcription"]["model"] == "whisper-1"
    # The key opens the API like any ephemeral key, and like one it cannot mint more.
    models = await client.get("/v1/models", headers=bearer(secret["value"]))
    assert models.status == 200
    minted = await client.post("/v1/realtime/client_secrets", headers=bearer(secret["value"]))
    assert minted.status == 403


async def test_keys_are_only_for_the_page_this_server_serves(make_client: MakeClient) -> None:
    client = await make_client()
    own = f"http://{client.host}:{client.port}"
    assert (await client.post("/demo/client_secret", headers={"Origin": own})).status == 200
    foreign = await client.post("/demo/client_secret", headers={"Origin": "http://evil.example"})
    assert foreign.status == 403
    assert (await foreign.json())["error"]["code"] == "forbidden_origin"
    # DNS rebinding: a foreign name pointed at the loopback server.
    rebound = f"evil.example:{client.port}"
    headers = {"Host": rebound, "Origin": f"http://{rebound}"}
    assert (await client.post("/demo/client_secret", headers=headers)).status == 403


async def test_an_explicit_demo_serves_any_host_name(make_client: MakeClient) -> None:
    # Behind a reverse proxy the page is loaded by a public name.
    client = await make_client(api_keys=(API_KEY,), demo=True)
    headers = {"Host": "voice.example.org", "Origin": "https://voice.example.org"}
    assert (await client.post("/demo/client_secret", headers=headers)).status == 200


async def test_key_requests_are_rate_limited(make_client: MakeClient) -> None:
    client = await make_client()
    for _ in range(MAX_KEYS_PER_MINUTE):
        assert (await client.post("/demo/client_secret")).status == 200
    limited = await client.post("/demo/client_secret")
    assert limited.status == 429


@pytest.mark.parametrize(
    "path", ["/v1/realtime/calls", "/v1/realtime", "/v1/realtime/calls/rtc_x/hangup"]
)
async def test_browsers_may_post_offers_from_any_origin(make_client: MakeClient, path: str) -> None:
    client = await make_client(api_keys=(API_KEY,))
    preflight = await client.options(
        path,
        headers={
            "Origin": "http://127.0.0.1:1234",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,openai-beta",
        },
    )
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert preflight.headers["Access-Control-Allow-Headers"] == (
        "authorization,content-type,openai-beta"
    )
    # Errors are readable too, and the call's Location is exposed.
    response = await client.post(path, headers={"Origin": "http://127.0.0.1:1234"})
    assert response.status == 401
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    assert response.headers["Access-Control-Expose-Headers"] == "Location"


async def test_a_malformed_preflight_gets_the_plain_headers(make_client: MakeClient) -> None:
    client = await make_client(api_keys=(API_KEY,))
    preflight = await client.options(
        "/v1/realtime/calls",
        headers={
            "Origin": "http://a.example",
            "Access-Control-Request-Headers": "x-good, bad name:",
        },
    )
    assert preflight.headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type"


async def test_minting_and_other_endpoints_stay_same_origin(make_client: MakeClient) -> None:
    client = await make_client(api_keys=(API_KEY,))
    origin = {"Origin": "http://a.example"}
    for method, path in (
        ("POST", "/v1/realtime/client_secrets"),
        ("GET", "/v1/models"),
        ("POST", "/demo/client_secret"),
    ):
        response = await client.request(method, path, headers={**origin, **bearer(API_KEY)})
        assert "Access-Control-Allow-Origin" not in response.headers, path
    preflight = await client.options("/v1/realtime/client_secrets", headers=origin)
    assert "Access-Control-Allow-Origin" not in preflight.headers


def test_the_demo_option_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    parse = build_parser().parse_args
    assert parse(["serve", "--demo"]).demo is True
    assert parse(["serve", "--no-demo"]).demo is False
    assert parse(["serve"]).demo is None
    assert load_settings({"demo": False}, env={"HARK_DEMO": "true"}).demo is False
    assert load_settings({}, env={"HARK_DEMO": "yes"}).demo is True
    assert load_settings({}, env={"HARK_DEMO": "0"}).demo is False
    assert load_settings({}, env={}).demo is None
    with pytest.raises(ConfigError, match="demo"):
        load_settings({}, env={"HARK_DEMO": "maybe"})

"""The HTTP and WebSocket API of a real server on a loopback port, with --engines fake."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
import pytest

from hark.config import Settings
from hark.engines.registry import Engines
from hark.server.app import AUTHENTICATOR, create_app
from hark.server.auth import InsecureBindError, owner_of
from tests.helpers.net import bearer

from .conftest import API_KEY, OTHER_KEY, StartServer, gated_engines, wait_ready

KEYED = Settings(api_keys=(API_KEY, OTHER_KEY))


async def receive_event(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), timeout=30)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    event: dict[str, Any] = json.loads(msg.data)
    return event


async def mint(
    http: aiohttp.ClientSession, url: str, body: object, key: str = API_KEY
) -> aiohttp.ClientResponse:
    response = await http.post(url + "/v1/realtime/client_secrets", json=body, headers=bearer(key))
    await response.read()
    return response


def test_refuses_an_open_server_off_loopback(fake_engines: Engines) -> None:
    with pytest.raises(InsecureBindError):
        create_app(Settings(host="0.0.0.0"), fake_engines)


async def test_health_and_readiness_follow_the_warmup(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    gate = asyncio.Event()
    server = await start_server(KEYED, gated_engines(gate))
    async with http.get(server.url + "/healthz") as response:
        assert response.status == 200
        assert await response.json() == {"status": "ok"}
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    async with http.get(server.url + "/readyz") as response:
        assert response.status == 503
        assert (await response.json())["status"] == "starting"
    gate.set()
    await wait_ready(http, server)
    async with http.get(server.url + "/healthz") as response:
        assert response.status == 200


async def test_failed_warmup_stays_unready_and_refuses_sessions(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    gate = asyncio.Event()
    gate.set()
    server = await start_server(KEYED, gated_engines(gate, RuntimeError("no model")))
    # However long the warm-up takes to fail on a busy machine.
    async with asyncio.timeout(30):
        while True:
            async with http.get(server.url + "/readyz") as response:
                body = await response.json()
            if body["status"] != "starting":
                break
            await asyncio.sleep(0.01)
    assert response.status == 503 and body == {"status": "failed"}
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await http.ws_connect(server.ws_url + "?model=gpt-realtime", headers=bearer(API_KEY))
    assert caught.value.status == 503


async def test_models_needs_a_key(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.get(server.url + "/v1/models") as response:
        assert response.status == 401
        error = (await response.json())["error"]
        assert error["type"] == "invalid_request_error"
        assert set(error) == {"message", "type", "param", "code"}
    async with http.get(server.url + "/v1/models", headers=bearer("sk-wrong")) as response:
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "invalid_api_key"
    async with http.get(server.url + "/v1/models", headers=bearer(OTHER_KEY)) as response:
        assert response.status == 200
        body = await response.json()
    assert body["object"] == "list"
    ids = [m["id"] for m in body["data"]]
    assert ids == ["gpt-realtime", "smollm2-135m"]
    assert all(m["object"] == "model" and m["owned_by"] == "hark" for m in body["data"])


async def test_wrong_or_missing_key_is_refused_before_the_upgrade(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    attempts: list[dict[str, Any]] = [
        {},
        {"headers": bearer("sk-wrong")},
        {"protocols": ("realtime", "openai-insecure-api-key.sk-wrong")},
        {"headers": bearer("ek_unknown")},
    ]
    for attempt in attempts:
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
            await http.ws_connect(server.ws_url + "?model=gpt-realtime", **attempt)
        assert caught.value.status == 401
    # The refusal is a plain HTTP answer with OpenAI's error body.
    async with http.get(
        server.url + "/v1/realtime?model=gpt-realtime",
        headers={"Connection": "Upgrade", "Upgrade": "websocket", **bearer("sk-wrong")},
    ) as response:
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "invalid_api_key"


async def test_bearer_key_opens_a_session_echoing_the_model(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(
        server.ws_url + "?model=my-own-model", headers=bearer(API_KEY)
    ) as ws:
        event = await receive_event(ws)
        assert event["type"] == "session.created"
        assert event["session"]["model"] == "my-own-model"
        assert event["session"]["id"].startswith("sess_")


async def test_subprotocol_key_opens_a_session_and_selects_realtime(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(
        server.ws_url + "?model=gpt-realtime",
        protocols=("realtime", f"openai-insecure-api-key.{OTHER_KEY}"),
    ) as ws:
        assert ws.protocol == "realtime"
        assert (await receive_event(ws))["type"] == "session.created"


async def test_any_key_on_loopback_without_configured_keys(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(Settings(), fake_engines)
    async with http.ws_connect(
        server.ws_url + "?model=gpt-realtime", headers=bearer("whatever")
    ) as ws:
        assert (await receive_event(ws))["type"] == "session.created"
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await http.ws_connect(server.ws_url + "?model=gpt-realtime")
    assert caught.value.status == 401


async def test_unsupported_query_parameters_are_refused(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await http.ws_connect(
            server.ws_url + "?model=gpt-realtime&intent=translation", headers=bearer(API_KEY)
        )
    assert caught.value.status == 400
    # A sideband connection to a call that does not exist (tests/transports has the rest).
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await http.ws_connect(server.ws_url + "?call_id=rtc_123", headers=bearer(API_KEY))
    assert caught.value.status == 404


async def test_transcription_intent_opens_a_transcription_session(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(
        server.ws_url + "?intent=transcription", headers=bearer(API_KEY)
    ) as ws:
        event = await receive_event(ws)
        assert event["type"] == "session.created"
        assert event["session"]["type"] == "transcription"


async def test_minted_key_opens_a_session_with_its_config(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    body = {
        "expires_after": {"anchor": "created_at", "seconds": 120},
        "session": {"type": "realtime", "instructions": "Speak like a pirate."},
    }
    response = await mint(http, server.url, body)
    assert response.status == 200
    secret = await response.json()
    assert secret["value"].startswith("ek_")
    assert secret["session"]["instructions"] == "Speak like a pirate."
    assert secret["session"]["id"].startswith("sess_")
    assert secret["session"]["object"] == "realtime.session"
    assert abs(secret["expires_at"] - (time.time() + 120)) < 60
    assert secret["session"]["expires_at"] == secret["expires_at"]
    minted = await server.app[AUTHENTICATOR].authenticate(secret["value"])
    assert minted is not None and minted.owner == owner_of(API_KEY)

    async with http.ws_connect(
        server.ws_url + "?model=gpt-realtime", headers=bearer(secret["value"])
    ) as ws:
        event = await receive_event(ws)
        assert event["type"] == "session.created"
        assert event["session"]["instructions"] == "Speak like a pirate."

    # Browsers send the ephemeral key as a subprotocol.
    async with http.ws_connect(
        server.ws_url, protocols=("realtime", f"openai-insecure-api-key.{secret['value']}")
    ) as ws:
        event = await receive_event(ws)
        assert event["session"]["instructions"] == "Speak like a pirate."


async def test_empty_body_mints_a_default_key(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.post(
        server.url + "/v1/realtime/client_secrets", headers=bearer(API_KEY)
    ) as response:
        assert response.status == 200
        secret = await response.json()
    assert secret["session"]["type"] == "realtime"
    assert response.headers["Cache-Control"] == "no-store"


async def test_expired_and_unknown_ephemeral_keys_are_refused(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = await start_server(KEYED, fake_engines)
    authenticator = server.app[AUTHENTICATOR]
    now = 1_800_000_000.0
    monkeypatch.setattr(authenticator, "clock", lambda: now)
    response = await mint(http, server.url, {"expires_after": {"seconds": 10}})
    secret = await response.json()
    assert secret["expires_at"] == int(now) + 10

    monkeypatch.setattr(authenticator, "clock", lambda: now + 10)
    altered = secret["value"][:-1] + ("A" if secret["value"][-1] != "A" else "B")
    for key in (secret["value"], altered, "ek_" + "x" * 43):
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
            await http.ws_connect(server.ws_url + "?model=gpt-realtime", headers=bearer(key))
        assert caught.value.status == 401
        response = await mint(http, server.url, {}, key=key)
        assert response.status == 401


async def test_ephemeral_key_cannot_mint(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(Settings(), fake_engines)
    secret = await (await mint(http, server.url, {}, key="anything")).json()
    response = await mint(http, server.url, {}, key=secret["value"])
    assert response.status == 403
    error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"expires_after": {"seconds": 9}}, "expires_after.seconds", "integer_below_min_value"),
        ({"expires_after": {"seconds": 7201}}, "expires_after.seconds", "integer_above_max_value"),
        ({"expires_after": {"seconds": "60"}}, "expires_after.seconds", "invalid_type"),
        ({"expires_after": {"seconds": True}}, "expires_after.seconds", "invalid_type"),
        ({"expires_after": {"anchor": "now"}}, "expires_after.anchor", "invalid_value"),
        ({"expires_after": 60}, "expires_after", "invalid_type"),
        ({"expires_after": {"secs": 60}}, "expires_after.secs", "unknown_parameter"),
        ({"model": "gpt-realtime"}, "model", "unknown_parameter"),
        ({"session": {"audio": {"output": {"speed": 9}}}}, "session.audio.output.speed", None),
        ({"session": {"colour": "blue"}}, "session.colour", "unknown_parameter"),
        ({"session": "realtime"}, "session", "invalid_type"),
        ([], None, "invalid_type"),
    ],
)
async def test_invalid_client_secret_requests(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    body: object,
    param: str | None,
    code: str | None,
) -> None:
    server = await start_server(KEYED, fake_engines)
    response = await mint(http, server.url, body)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert server.app[AUTHENTICATOR].minted == 0


async def test_unparsable_client_secret_body(
    start_server: StartServer, http: aiohttp.ClientSession, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.post(
        server.url + "/v1/realtime/client_secrets", data=b"{not json", headers=bearer(API_KEY)
    ) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "invalid_json"


async def test_keys_never_reach_the_logs(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await start_server(KEYED, fake_engines)
    wrong = "sk-wrong-but-secret-0123456789"
    async with http.get(server.url + "/v1/models", headers=bearer(wrong)) as response:
        assert response.status == 401
    async with http.get(server.url + "/v1/models", headers=bearer(API_KEY)) as response:
        assert response.status == 200
    secret = await (await mint(http, server.url, {})).json()
    for attempt in (
        {"headers": bearer(wrong)},
        {"protocols": ("realtime", f"openai-insecure-api-key.{wrong}")},
    ):
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await http.ws_connect(server.ws_url + "?model=gpt-realtime", **attempt)
    async with http.ws_connect(
        server.ws_url + "?model=gpt-realtime",
        protocols=("realtime", f"openai-insecure-api-key.{secret['value']}"),
    ) as ws:
        await receive_event(ws)
    await wait_ready(http, server)

    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "/v1/models" in logged  # the access log did record the requests
    for key in (wrong, API_KEY, secret["value"]):
        assert key not in logged
        assert key[:10] not in logged
        assert key[-10:] not in logged

"""Metrics keys: an API keys entry ``metrics:KEY`` lets KEY read ``/metrics`` and nothing else."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from hark.cluster import open_store
from hark.config import Settings, load_settings
from hark.engines.registry import Engines
from hark.server.auth import Authenticator, InsecureBindError, check_bind_policy, split_keys
from tests.helpers.net import bearer

from .conftest import API_KEY, StartServer

METRICS_KEY = "sk-prometheus-scrapes-only-0123456789"
KEYED = Settings(api_keys=(API_KEY, f"metrics:{METRICS_KEY}"))


def test_metrics_entries_are_told_apart_from_api_keys() -> None:
    entries = ("sk-a", f"metrics:{METRICS_KEY}", "sk-b", "metrics:")
    assert split_keys(entries) == (("sk-a", "sk-b"), (METRICS_KEY,))
    # As HARK_API_KEYS gives them.
    settings = load_settings(env={"HARK_API_KEYS": f"{API_KEY},metrics:{METRICS_KEY}"})
    assert split_keys(settings.api_keys) == ((API_KEY,), (METRICS_KEY,))


def test_metrics_keys_alone_do_not_let_a_server_off_loopback() -> None:
    with pytest.raises(InsecureBindError):
        check_bind_policy("0.0.0.0", [f"metrics:{METRICS_KEY}"])
    check_bind_policy("0.0.0.0", [f"metrics:{METRICS_KEY}", API_KEY])


async def test_a_metrics_key_authenticates_as_metrics_only(tmp_path: Path) -> None:
    store = open_store(None, tmp_path)
    await store.start()
    try:
        auth = Authenticator(KEYED.api_keys, store)
        assert not auth.open
        full = await auth.authenticate(API_KEY)
        assert full is not None and not full.metrics_only
        scraper = await auth.authenticate(METRICS_KEY)
        assert scraper is not None and scraper.metrics_only
        assert scraper.owner != full.owner
        # The entry itself is not a key, and neither is anything else.
        assert await auth.authenticate(f"metrics:{METRICS_KEY}") is None
        assert await auth.authenticate("sk-stranger") is None
        # With metrics keys only, the server is as open as with none (loopback only).
        assert Authenticator([f"metrics:{METRICS_KEY}"], store).open
    finally:
        await store.aclose()


async def test_a_metrics_key_reads_metrics_and_nothing_else(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    server = await start_server(KEYED, fake_engines)
    scraper = bearer(METRICS_KEY)
    for key in (METRICS_KEY, API_KEY):
        async with http.get(server.url + "/metrics", headers=bearer(key)) as response:
            assert response.status == 200
            assert "hark_sessions_active" in await response.text()
    async with http.get(server.url + "/metrics") as response:
        assert response.status == 401
    refused = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/realtime/client_secrets", {"session": {"type": "realtime"}}),
        ("POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "voice": "alloy"}),
    ]
    for method, path, body in refused:
        async with http.request(method, server.url + path, headers=scraper, json=body) as response:
            assert response.status == 403, path
            error = (await response.json())["error"]
        assert error["code"] == "insufficient_permissions"
        assert "metrics key" in error["message"]
        # The same request with an API key is not refused for its key.
        async with http.request(
            method, server.url + path, headers=bearer(API_KEY), json=body
        ) as response:
            assert response.status not in (401, 403), path
    # A Realtime WebSocket, by header or by the browser's subprotocol, is refused too.
    with pytest.raises(aiohttp.WSServerHandshakeError) as refusal:
        await http.ws_connect(server.url + "/v1/realtime", headers=scraper)
    assert refusal.value.status == 403
    with pytest.raises(aiohttp.WSServerHandshakeError) as refusal:
        await http.ws_connect(
            server.url + "/v1/realtime",
            protocols=("realtime", f"openai-insecure-api-key.{METRICS_KEY}"),
        )
    assert refusal.value.status == 403

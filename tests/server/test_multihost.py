"""Two hosts, one service: `hark serve` in two network namespaces the test creates, joined
by a bridge, sharing a real Redis, reached from the test's own namespace by real HTTP,
WebSocket and WebRTC clients. Addresses are the test's own (10.231.N.0/24 inside its
namespaces); nothing else is contacted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from tests.helpers.net import bearer
from tests.netns import Lan, bridged_hosts
from tests.redis_server import redis_on
from tests.servers import HarkProcess

# real processes on real (virtual) hosts, in real time
pytestmark = [pytest.mark.slow, pytest.mark.realtime]

API_KEY = "sk-multihost-owner-0123456789"
FLEET_SECRET = "fleet-secret-of-the-multihost-test-0123"
WORKER = "X-Hark-Worker"
VIA = "X-Hark-Via"


@pytest.fixture(scope="module")
def lan() -> Iterator[Lan]:
    """Hosts h1 and h2 (namespaces) on a bridge with the test's own namespace, in 10.231.N.0/24."""
    with bridged_hosts("hk", "10.231", ("h1", "h2")) as lan:
        yield lan


@pytest.fixture(scope="module")
def redis_on_lan(lan: Lan, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server listening on the test namespace's bridge address."""
    with redis_on(lan.gateway, tmp_path_factory.mktemp("redis-lan")) as url:
        yield url


async def test_two_hosts_are_one_service(
    lan: Lan, redis_on_lan: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    args = ["--engines", "fake", "--no-sip", "--drain-timeout", "3"]
    env = {
        "HARK_API_KEYS": API_KEY,
        "HARK_REDIS_URL": redis_on_lan,
        "HARK_FLEET_SECRET": FLEET_SECRET,
    }
    (ns1, ip1), (ns2, ip2) = lan.hosts
    one = HarkProcess(args, tmp_path / "h1.log", env=env, host=ip1, netns=ns1, port=8000)
    two = HarkProcess(args, tmp_path / "h2.log", env=env, host=ip2, netns=ns2, port=8000)
    client = CallClient()
    try:
        with one, two:
            # A key minted on one host opens sessions on the other.
            async with http.post(
                one.url + "/v1/realtime/client_secrets", json={}, headers=bearer(API_KEY)
            ) as response:
                assert response.status == 200, await response.text()
                key = (await response.json())["value"]
                first = response.headers[WORKER]
            async with http.get(two.url + "/v1/models", headers=bearer(key)) as response:
                assert response.status == 200
                assert response.headers[WORKER] != first

            # A WebRTC call through host one, with its media on whichever host placement
            # chose; its sideband and hangup through the other host.
            await client.connect(
                http,
                one.url,
                api_key=API_KEY,
                session={"type": "realtime", "output_modalities": ["text"]},
            )
            await asyncio.wait_for(client.opened.wait(), 30)
            owner = client.worker
            owner_url, other_url = (one.url, two.url) if owner == first else (two.url, one.url)
            assert client.answer is not None
            candidate = next(
                line for line in client.answer.splitlines() if line.startswith("a=candidate")
            )
            assert (ip1 if owner_url == one.url else ip2) in candidate
            async with http.ws_connect(
                other_url.replace("http", "ws") + f"/v1/realtime?call_id={client.call_id}",
                headers=bearer(API_KEY),
            ) as ws:
                await ws.send_json(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_text", "text": "Across hosts?"}],
                        },
                    }
                )
                await ws.send_json({"type": "response.create"})
                async with asyncio.timeout(30):
                    while True:
                        event: dict[str, Any] = json.loads((await ws.receive()).data)
                        if event["type"] == "response.done":
                            break
                assert event["response"]["status"] == "completed"
                on_channel = await client.next_event("response.done")
                assert on_channel["response"]["id"] == event["response"]["id"]
            async with http.post(
                other_url + f"/v1/realtime/calls/{client.call_id}/hangup",
                headers=bearer(API_KEY),
            ) as response:
                assert response.status == 200
                assert response.headers[WORKER] == owner
                assert response.headers[VIA] != owner
    finally:
        await client.close()
    # The store's password and the API key never reach the logs.
    password = redis_on_lan.split("@")[0].rsplit(":", 1)[-1]
    for log in (tmp_path / "h1.log", tmp_path / "h2.log"):
        text = log.read_text()
        assert "worker wrk_" in text
        assert password not in text and API_KEY not in text and FLEET_SECRET not in text

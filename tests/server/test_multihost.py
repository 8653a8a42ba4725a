"""Two hosts, one service: `hark serve` in two network namespaces the test creates, joined
by a bridge, sharing a real Redis, reached from the test's own namespace by real HTTP,
WebSocket and WebRTC clients. Addresses are the test's own (10.231.N.0/24 inside its
namespaces); nothing else is contacted."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from tests.servers import HarkProcess

pytestmark = pytest.mark.slow  # real processes on real (virtual) hosts, in real time

API_KEY = "sk-multihost-owner-0123456789"
WORKER = "X-Hark-Worker"
VIA = "X-Hark-Via"


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


@dataclass
class Lan:
    """Two hosts (namespaces) and the test's own namespace on one bridge."""

    subnet: str
    hosts: dict[str, str]
    gateway: str
    namespaces: list[str]
    root_link: str


def _teardown(namespaces: list[str], root_link: str) -> None:
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "link", "del", root_link], capture_output=True)


@pytest.fixture(scope="module")
def lan() -> Iterator[Lan]:
    """Namespaces h1 and h2 and a bridge namespace, with veth pairs and addresses of the
    test's own; skipped with a clear message only where namespaces are not permitted."""
    if shutil.which("ip") is None:
        pytest.fail("the ip command (iproute2) is missing; scripts/test installs it")
    tag = secrets.token_hex(2)
    octet = 100 + secrets.randbelow(100)
    subnet = f"10.231.{octet}"
    bridge_ns, h1, h2 = f"hk-lan-{tag}", f"hk-h1-{tag}", f"hk-h2-{tag}"
    root_link = f"hkr{tag}"
    try:
        _ip("netns", "add", bridge_ns)
    except subprocess.CalledProcessError as exc:
        reason = f"network namespaces are not permitted here: {exc.stderr.strip()}"
        # CI runs as root, where they are: there a refusal is a failure, never a skip.
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    namespaces = [bridge_ns]
    try:
        _ip("link", "add", "br0", "type", "bridge", netns=bridge_ns)
        _ip("link", "set", "br0", "up", netns=bridge_ns)
        hosts = {}
        for index, ns in enumerate((h1, h2), start=1):
            _ip("netns", "add", ns)
            namespaces.append(ns)
            near, far = f"hk{index}{tag}", f"hk{index}{tag}b"
            _ip("link", "add", near, "type", "veth", "peer", "name", far)
            _ip("link", "set", near, "netns", ns)
            _ip("link", "set", far, "netns", bridge_ns)
            _ip("link", "set", far, "master", "br0", netns=bridge_ns)
            _ip("link", "set", far, "up", netns=bridge_ns)
            address = f"{subnet}.{10 + index}"
            _ip("addr", "add", f"{address}/24", "dev", near, netns=ns)
            _ip("link", "set", near, "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)
            hosts[ns] = address
        far = f"{root_link}b"
        _ip("link", "add", root_link, "type", "veth", "peer", "name", far)
        _ip("link", "set", far, "netns", bridge_ns)
        _ip("link", "set", far, "master", "br0", netns=bridge_ns)
        _ip("link", "set", far, "up", netns=bridge_ns)
        _ip("addr", "add", f"{subnet}.1/24", "dev", root_link)
        _ip("link", "set", root_link, "up")
        yield Lan(subnet, hosts, f"{subnet}.1", namespaces, root_link)
    finally:
        _teardown(namespaces, root_link)


@pytest.fixture(scope="module")
def redis_on_lan(lan: Lan, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server listening on the test namespace's bridge address."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is missing; scripts/test installs it")
    workdir = tmp_path_factory.mktemp("redis-lan")
    port = 16379 + secrets.randbelow(1000)
    # Off loopback Redis wants a password (its protected mode), as it should.
    password = secrets.token_hex(8)
    proc = subprocess.Popen(
        [
            *(binary, "--bind", lan.gateway, "--port", str(port), "--save", ""),
            *("--dir", str(workdir), "--requirepass", password),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import socket

        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((lan.gateway, port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server on the test LAN never listened") from None
                time.sleep(0.05)
        yield f"redis://:{password}@{lan.gateway}:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session."""
    async with aiohttp.ClientSession() as session:
        yield session


def bearer(key: str) -> dict[str, str]:
    """An Authorization header."""
    return {"Authorization": f"Bearer {key}"}


async def test_two_hosts_are_one_service(
    lan: Lan, redis_on_lan: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    args = ["--engines", "fake", "--drain-timeout", "3"]
    env = {"HARK_API_KEYS": API_KEY, "HARK_REDIS_URL": redis_on_lan}
    (ns1, ip1), (ns2, ip2) = lan.hosts.items()
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
        assert password not in text and API_KEY not in text

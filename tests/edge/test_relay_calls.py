"""Calls through `hark relay`, with real peers on hosts the test makes: network namespaces
for the relay and two workers (`hark serve --relay-address`), joined by a bridge to the
test's own namespace, where the aiortc clients and a real Redis run. Addresses are the
test's own (10.234.N.0/24); nothing else is contacted."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aioice import stun
from playwright.async_api import async_playwright

from hark.bench.webrtc import CallClient
from tests.netns import bridged_hosts
from tests.redis_server import redis_on
from tests.servers import HarkProcess

# real processes on real (virtual) hosts, in real time
pytestmark = [pytest.mark.slow, pytest.mark.realtime]

API_KEY = "sk-edge-owner-0123456789abcdef"
SECRET = "fleet-secret-of-the-edge-test-0123456789"
RELAY_PORT = 3478
METRICS_PORT = 9478
TEXT_AND_AUDIO = {"type": "realtime", "output_modalities": ["audio"]}


@dataclass
class Hosts:
    """The namespaces (relay, w1, w2) with their addresses, and the test's own address."""

    relay: tuple[str, str]
    workers: list[tuple[str, str]]
    gateway: str


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """A bridge and three hosts on it, in 10.234.N.0/24."""
    with bridged_hosts("he", "10.234", ("relay", "w1", "w2")) as lan:
        yield Hosts(relay=lan.hosts[0], workers=lan.hosts[1:], gateway=lan.gateway)


@pytest.fixture(scope="module")
def redis_url(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on the test's bridge address, with a password."""
    with redis_on(hosts.gateway, tmp_path_factory.mktemp("redis-edge")) as url:
        yield url


class RelayProcess:
    """`hark relay` in the relay's namespace; killed and started again by the tests."""

    def __init__(self, hosts: Hosts, redis_url: str, log: Path) -> None:
        self.ns, self.ip = hosts.relay
        self.redis_url = redis_url
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> tuple[str, int]:
        return self.ip, RELAY_PORT

    def start(self) -> None:
        command = [
            *("ip", "netns", "exec", self.ns, sys.executable, "-m", "hark.cli", "relay"),
            *("--listen", f"{self.ip}:{RELAY_PORT}"),
            *("--metrics-listen", f"{self.ip}:{METRICS_PORT}"),
            # Two forwarding processes on the one port: the kernel spreads the clients.
            *("--workers", "2"),
        ]
        env = {**os.environ, "HARK_FLEET_SECRET": SECRET, "HARK_REDIS_URL": self.redis_url}
        self.starts += 1
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while self.log.read_text().count("relay on UDP") < 2 * self.starts or not self.metrics():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"hark relay did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def metrics(self) -> dict[str, float] | None:
        """The relay's samples by name with labels, or None when it does not answer."""
        try:
            url = f"http://{self.ip}:{METRICS_PORT}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return None
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        # Its forwarding process follows its parent (PR_SET_PDEATHSIG) and frees the port.
        deadline = time.monotonic() + 10
        while "relay on UDP" in _processes_of(self.ns):
            if time.monotonic() > deadline:
                raise RuntimeError("the relay's forwarding process outlived its parent")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _processes_of(ns: str) -> str:
    listing = subprocess.run(
        ["ip", "netns", "pids", ns], capture_output=True, text=True, check=False
    ).stdout
    return "relay on UDP" if listing.strip() else ""


@dataclass
class Fleet:
    relay: RelayProcess
    workers: list[HarkProcess]


@pytest.fixture(scope="module")
def fleet(
    hosts: Hosts, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """The relay and two workers behind it, sharing the Redis."""
    logs = tmp_path_factory.mktemp("edge-logs")
    relay = RelayProcess(hosts, redis_url, logs / "relay.log")
    relay.start()
    args = ["--engines", "fake", "--no-sip", "--relay-address", f"{relay.ip}:{RELAY_PORT}"]
    env = {"HARK_API_KEYS": API_KEY, "HARK_REDIS_URL": redis_url, "HARK_FLEET_SECRET": SECRET}
    workers = [
        HarkProcess(args, logs / f"{ns}.log", env=env, host=ip, netns=ns, port=8000)
        for ns, ip in hosts.workers
    ]
    try:
        for worker in workers:
            worker.start()
        yield Fleet(relay, workers)
    finally:
        for worker in workers:
            worker.stop()
        relay.stop()
    for log in [relay.log, *(w.log for w in workers)]:
        text = log.read_text()
        assert SECRET not in text and API_KEY not in text


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(http: aiohttp.ClientSession, fleet: Fleet, entry: int = 0) -> CallClient:
    """A connected call, offered to worker ``entry`` (placement picks where it runs)."""
    client = CallClient()
    await client.connect(http, fleet.workers[entry].url, api_key=API_KEY, session=TEXT_AND_AUDIO)
    await asyncio.wait_for(client.opened.wait(), 30)
    return client


async def hears_a_reply(client: CallClient) -> None:
    """Ask for a response and wait until its audio is heard and it is done."""
    client.first_audio.clear()
    client.first_audio_at = None
    client.send({"type": "response.create"})
    done = await client.next_event("response.done", limit_s=30)
    assert done["response"]["status"] == "completed"
    await asyncio.wait_for(client.first_audio.wait(), 10)


def candidates(answer: str | None) -> list[str]:
    assert answer is not None
    return [line for line in answer.splitlines() if line.startswith("a=candidate")]


async def test_calls_reach_both_workers_through_the_one_relay_port(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    before = fleet.relay.metrics()
    assert before is not None
    clients = []
    try:
        for _ in range(4):
            clients.append(await call(http, fleet))
        # Placement spreads the calls; each is answered with the relay's address only.
        assert len({c.worker for c in clients}) == 2
        for client in clients:
            assert all(f" {fleet.relay.ip} {RELAY_PORT} " in c for c in candidates(client.answer))
        await asyncio.gather(*(hears_a_reply(client) for client in clients))
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    after = fleet.relay.metrics()
    assert after is not None
    assert after["hark_relay_flows_created_total"] >= before["hark_relay_flows_created_total"] + 4
    assert after['hark_relay_packets_total{direction="out"}'] > 0


async def test_a_call_survives_a_relay_restart(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    client = await call(http, fleet)
    try:
        await hears_a_reply(client)
        await asyncio.to_thread(fleet.relay.kill)
        await asyncio.sleep(0.5)  # the relay is gone: nothing arrives
        silent_from = len(client.frames)
        await asyncio.to_thread(fleet.relay.start)
        metrics = fleet.relay.metrics()
        assert metrics is not None and metrics["hark_relay_flows_restored_total"] >= 1
        # The server's track never stops (silence between replies): frames resume.
        async with asyncio.timeout(30):
            while True:
                if len(client.frames) > silent_from:
                    break
                await asyncio.sleep(0.01)
        # ... on the restored flow: the restarted relay made none, so the audio did not wait
        # for the client's next ICE consent check to bind it again.
        metrics = fleet.relay.metrics()
        assert metrics is not None and metrics["hark_relay_flows_created_total"] == 0
        await hears_a_reply(client)
    finally:
        await client.close()


async def test_spoofed_hints_are_dropped_and_a_junk_flood_disturbs_no_one(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    client = await call(http, fleet)
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        before = fleet.relay.metrics()
        assert before is not None
        request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
        # The hint of the call's own answer, rewritten to name another worker.
        assert client.answer is not None
        ufrag = next(
            line.split(":", 1)[1]
            for line in client.answer.splitlines()
            if line.startswith("a=ice-ufrag:")
        )
        token = bytearray(base64.b64decode(ufrag))
        token[8] ^= 1
        request.attributes["USERNAME"] = base64.b64encode(bytes(token)).decode() + ":x"
        attacker.sendto(bytes(request), fleet.relay.address)
        junk = b"\x80" + os.urandom(199)
        flood_until = time.monotonic() + 2.0

        async def flood() -> int:
            sent = 0
            while time.monotonic() < flood_until:
                for _ in range(200):
                    attacker.sendto(junk, fleet.relay.address)
                sent += 200
                await asyncio.sleep(0)
            return sent

        sent, _ = await asyncio.gather(flood(), hears_a_reply(client))
        after = fleet.relay.metrics()
        assert after is not None
        dropped = 'hark_relay_dropped_total{reason="%s"}'
        assert after[dropped % "bad_hint"] - before[dropped % "bad_hint"] == 1
        # How much of the flood the relay read before the kernel's socket buffer dropped the
        # rest is the machine's pace (a busy CI run read under half); that what it read was
        # dropped as unknown, and the call still heard its reply, is the relay's rule.
        junk_dropped = after[dropped % "unknown_flow"] - before[dropped % "unknown_flow"]
        assert 0 < junk_dropped <= sent
    finally:
        attacker.close()
        await client.close()


CHROMIUM = Path("/usr/bin/chromium")
PAGE = Path(__file__).with_name("relay_page.html")


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's Chromium; Playwright never downloads a browser here."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/test does)")
    return CHROMIUM


async def test_chromium_calls_through_the_relay(fleet: Fleet, chromium: Path) -> None:
    page_text = PAGE.read_text()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(chromium),
            args=["--autoplay-policy=no-user-gesture-required", "--disable-gpu"],
        )
        try:
            page = await browser.new_page()
            await page.set_content(page_text)
            await page.evaluate(
                "([base, key]) => start(base, key)", [fleet.workers[0].url, API_KEY]
            )
            async with asyncio.timeout(30):
                while True:
                    result = await page.evaluate("window.result")
                    if "response.done" in result["events"]:
                        break
                    await asyncio.sleep(0.2)
                while True:
                    path = await page.evaluate("mediaPath()")
                    if path["audioBytes"] > 0 and path["remote"]:
                        break
                    await asyncio.sleep(0.2)
            assert path["remote"] == f"{fleet.relay.ip}:{RELAY_PORT}"
        finally:
            await browser.close()


async def test_a_killed_worker_ends_only_its_own_flows(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    ids = {}
    for worker in fleet.workers:
        async with http.get(worker.url + "/healthz") as response:
            ids[response.headers["X-Hark-Worker"]] = worker
    clients: list[CallClient] = []
    try:
        while len({c.worker for c in clients}) < 2:
            clients.append(await call(http, fleet))
        doomed = next(c for c in clients if c.worker == clients[0].worker)
        survivor = next(c for c in clients if c.worker != doomed.worker)
        before = fleet.relay.metrics()
        assert before is not None
        assert doomed.worker is not None
        victim = ids[doomed.worker]
        assert victim.proc is not None
        victim.proc.kill()
        # Its heartbeat expires, the relays read the registry again and drop its flows.
        async with asyncio.timeout(30):
            while True:
                metrics = fleet.relay.metrics()
                gone = "hark_relay_flows_worker_gone_total"
                if metrics is not None and metrics[gone] > before[gone]:
                    break
                await asyncio.sleep(0.2)
        await hears_a_reply(survivor)
    finally:
        await asyncio.gather(*(client.close() for client in clients))

"""A fleet whose workers hop over TLS: two real `hark serve` processes on one real Redis,
each with a certificate from a CA made for the test, reached by a real WebRTC client."""

from __future__ import annotations

import re
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from tests.cluster.fleet_ca import FleetCa
from tests.helpers.net import bearer
from tests.redis_server import RedisServer
from tests.server.test_fleet import API_KEY, ENV, FAKE, VIA, WORKER, call, worker_at
from tests.servers import HarkProcess

# real processes, and real time
pytestmark = [pytest.mark.slow, pytest.mark.realtime]

_HOP = re.compile(r"worker hops over TLS at (https://\S+)")
_ID = re.compile(r"worker (wrk_\w+) in the cluster")


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port."""
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client that opens a new connection per request."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        yield s


def announced(log: Path) -> tuple[str, str]:
    """The worker id and the hop URL a server's log announced."""
    text = log.read_text()
    worker, hop = _ID.search(text), _HOP.search(text)
    assert worker and hop, text[-3000:]
    return worker.group(1), hop.group(1)


async def test_a_fleet_with_a_hop_ca_forwards_over_tls_to_listeners_only_it_opens(
    tmp_path: Path, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    ca = FleetCa(tmp_path / "ca")

    def worker(name: str) -> list[str]:
        cert, key = ca.issue(name)
        hop = ["--hop-tls-cert", str(cert), "--hop-tls-key", str(key), "--hop-tls-ca", str(ca.cert)]
        return [*FAKE, "--redis-url", redis.url, *hop]

    clients: list[CallClient] = []
    try:
        with (
            HarkProcess(worker("a"), tmp_path / "a.log", env=ENV) as a,
            HarkProcess(worker("b"), tmp_path / "b.log", env=ENV) as b,
        ):
            hops = dict(announced(server.log) for server in (a, b))
            assert all(url.startswith("https://127.0.0.1:") for url in hops.values())
            client = await call(http, clients, a.url)
            owner = client.worker
            assert owner in hops
            other_url = b.url if await worker_at(http, a.url) == owner else a.url
            # The hangup reaches the owner through the other worker, over the TLS hop.
            async with http.post(
                other_url + f"/v1/realtime/calls/{client.call_id}/hangup",
                headers=bearer(API_KEY),
            ) as response:
                assert response.status == 200, await response.text()
                assert response.headers[WORKER] == owner
                assert response.headers[VIA] == await worker_at(http, other_url)
            async with http.get(other_url + "/metrics", headers=bearer(API_KEY)) as response:
                exposition = await response.text()
            assert 'hark_forwarded_requests_total{kind="hangup",outcome="ok"} 1.0' in exposition
            # The owner's hop listener speaks only TLS, and only to a certificate of the CA.
            hop = hops[owner]
            with pytest.raises(aiohttp.ClientError):
                async with http.get(hop.replace("https", "http") + "/healthz") as response:
                    await response.read()
            uncertified = ssl.create_default_context(cafile=str(ca.cert))
            uncertified.check_hostname = False
            with pytest.raises(aiohttp.ClientError):
                async with http.get(hop + "/healthz", ssl=uncertified) as response:
                    await response.read()
            certified = ssl.create_default_context(cafile=str(ca.cert))
            certified.check_hostname = False
            certified.load_cert_chain(*ca.issue("probe"))
            async with http.get(hop + "/healthz", ssl=certified) as response:
                assert response.status == 200
                assert response.headers[WORKER] == owner
    finally:
        for made in clients:
            await made.close()

"""Two `hark serve` workers on Redis behind real Sentinels, with calls running, through a
failover Sentinel is asked for and through a killed master: keys minted before are valid
after, running calls go on, calls are reached through the other worker, and placement reads
the registry from the new master. While Sentinel promotes the replica, what needs the store
answers 503 ``cluster_unavailable`` and nothing else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from tests.redis_server import RedisWithSentinels
from tests.server.test_fleet import (
    API_KEY,
    ENV,
    FAKE,
    VIA,
    WORKER,
    bearer,
    call,
    mint,
    receiver,
    text_turn,
    worker_at,
)
from tests.servers import HarkProcess

# real processes, and real time: Sentinel calls a master down after a second
pytestmark = [pytest.mark.slow, pytest.mark.realtime]

PASSWORD = "sentinel-fleet-Pa55/word"
# Bounds on a hang, not measures.
RECOVERY_S = 120.0


@pytest.fixture
async def clients() -> AsyncIterator[list[CallClient]]:
    """WebRTC clients, all closed at the end."""
    made: list[CallClient] = []
    yield made
    await asyncio.gather(*(c.close() for c in made), return_exceptions=True)


async def until_the_store_answers(http: aiohttp.ClientSession, *urls: str) -> None:
    """Mint keys at each of ``urls`` until all of them can: every answer until then is 200
    or the documented 503 ``cluster_unavailable``."""
    deadline = time.monotonic() + RECOVERY_S
    for url in urls:
        while True:
            async with http.post(
                url + "/v1/realtime/client_secrets",
                json={"session": {"type": "realtime"}},
                headers=bearer(API_KEY),
            ) as response:
                if response.status == 200:
                    break
                assert response.status == 503, await response.text()
                assert (await response.json())["error"]["code"] == "cluster_unavailable"
            assert time.monotonic() < deadline, f"{url} never reached the store again"
            await asyncio.sleep(0.2)


async def until_relearned(sentinels: RedisWithSentinels, *keys: str) -> None:
    """Until the master Sentinel names holds ``keys``: the workers' registry entries and the
    calls they write back once the store answers (a promoted replica may have let the
    heartbeats expire while no master was named)."""
    deadline = time.monotonic() + RECOVERY_S
    while not await asyncio.to_thread(sentinels.master_holds, *keys):
        assert time.monotonic() < deadline, f"the new master never held {keys}"
        await asyncio.sleep(0.2)


async def models_status(http: aiohttp.ClientSession, url: str, key: str) -> int:
    """``GET /v1/models`` with ``key`` at ``url``."""
    async with http.get(url + "/v1/models", headers=bearer(key)) as response:
        await response.read()
        return response.status


async def still_talks(client: CallClient, words: str) -> None:
    """A text turn on the call's own data channel completes."""
    client.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": words}],
            },
        }
    )
    client.send({"type": "response.create"})
    done = await client.next_event("response.done")
    assert done["response"]["status"] == "completed"


async def sideband_turn(http: aiohttp.ClientSession, url: str, call_id: str, words: str) -> None:
    """A sideband turn on ``call_id`` through ``url``."""
    async with http.ws_connect(
        url.replace("http", "ws") + f"/v1/realtime?call_id={call_id}", headers=bearer(API_KEY)
    ) as ws:
        done = await text_turn(ws.send_json, receiver(ws), words)
        assert done["response"]["status"] == "completed"


async def test_a_fleet_on_sentinel_keeps_keys_calls_and_placement_through_failovers(
    tmp_path: Path, http: aiohttp.ClientSession, clients: list[CallClient]
) -> None:
    with RedisWithSentinels(tmp_path / "redis", PASSWORD) as sentinels:
        # The URL names the Sentinels; the password comes apart, as from a Secret.
        url = sentinels.url.replace(f":{PASSWORD}@", "")
        env = {**ENV, "HARK_REDIS_URL": url, "HARK_REDIS_PASSWORD": PASSWORD}
        with (
            HarkProcess(FAKE, tmp_path / "a.log", env=env) as a,
            HarkProcess(FAKE, tmp_path / "b.log", env=env) as b,
        ):
            workers = {await worker_at(http, a.url): a.url, await worker_at(http, b.url): b.url}
            # Keys minted on A, each shown to B only after one of the failovers: B finds
            # them in the store, on the new master.
            key_1, _ = await mint(http, a.url)
            key_2, _ = await mint(http, a.url)
            first = await call(http, clients, a.url)
            assert first.worker is not None and first.call_id is not None
            owner = first.worker
            (other,) = set(workers) - {owner}
            registry = [f"hark:worker:{w}" for w in workers]

            # ---- a failover Sentinel is asked for
            await asyncio.to_thread(sentinels.wait_settled)
            await asyncio.to_thread(sentinels.failover)
            await until_the_store_answers(http, a.url, b.url)
            await until_relearned(sentinels, *registry, f"hark:call:{first.call_id}")
            assert await models_status(http, b.url, key_1) == 200
            await still_talks(first, "Still there after the failover?")
            # The call is reached through the other worker, which reads where it lives.
            await sideband_turn(http, workers[other], first.call_id, "Through the other one")
            # Placement: asked at the call's worker, the new call goes to the idle one.
            second = await call(http, clients, workers[owner])
            assert second.worker == other

            # ---- the master is killed
            await asyncio.to_thread(sentinels.wait_settled)
            await asyncio.to_thread(sentinels.kill_master)
            await until_the_store_answers(http, a.url, b.url)
            calls = [f"hark:call:{c.call_id}" for c in (first, second)]
            await until_relearned(sentinels, *registry, *calls)
            assert await models_status(http, b.url, key_2) == 200
            await still_talks(first, "And after the kill?")
            await still_talks(second, "And the second call?")
            # One call each: asked at ``other``, a tie stays there; the next goes to the
            # owner, which has one call fewer by the registry on the new master.
            third = await call(http, clients, workers[other])
            fourth = await call(http, clients, workers[other])
            assert (third.worker, fourth.worker) == (other, owner)
            # A hangup through the other worker ends the first call on its owner.
            async with http.post(
                workers[other] + f"/v1/realtime/calls/{first.call_id}/hangup",
                headers=bearer(API_KEY),
            ) as response:
                assert response.status == 200
                assert (response.headers[WORKER], response.headers[VIA]) == (owner, other)

"""hark as one service over several processes: real `hark serve` processes sharing an
embedded store (``--workers 2``) or a real Redis, reached by real HTTP, WebSocket and WebRTC
clients. Bad keys and call ids are refused the same way on every worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from tests.helpers.net import bearer
from tests.redis_server import RedisServer
from tests.servers import HarkProcess

# real processes, and real time: heartbeats expire, drains wait
pytestmark = [pytest.mark.slow, pytest.mark.realtime]

API_KEY = "sk-fleet-test-owner-0123456789"
OTHER_KEY = "sk-fleet-test-stranger-98765"
# The secret the fleet's records in Redis are sealed with (needed with --redis-url).
ENV = {
    "HARK_API_KEYS": f"{API_KEY},{OTHER_KEY}",
    "HARK_FLEET_SECRET": "fleet-secret-of-the-fleet-tests-0123",
}
FAKE = ["--engines", "fake", "--drain-timeout", "3", "--log-level", "info"]
WORKER = "X-Hark-Worker"
VIA = "X-Hark-Via"
# Fresh connections to ``--workers 2`` until the kernel hands one to a given worker: a bound
# on a hang, not a number of tries, since a worker still starting, or busy, takes none.
ANOTHER_WORKER_S = 60.0


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, for this module's servers."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client that opens a new connection per request (so `--workers` spreads them)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        yield s


@pytest.fixture
async def clients() -> AsyncIterator[list[CallClient]]:
    """WebRTC clients, all closed at the end."""
    made: list[CallClient] = []
    yield made
    await asyncio.gather(*(c.close() for c in made), return_exceptions=True)


async def mint(http: aiohttp.ClientSession, url: str, key: str = API_KEY) -> tuple[str, str]:
    """An ephemeral key minted at ``url``, and the worker that minted it."""
    async with http.post(
        url + "/v1/realtime/client_secrets",
        json={"session": {"type": "realtime"}},
        headers=bearer(key),
    ) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["value"], response.headers[WORKER]


async def models_on(
    http: aiohttp.ClientSession, url: str, key: str, worker: str | None
) -> tuple[int, str]:
    """``GET /v1/models`` with ``key``, retried on fresh connections until ``worker``
    answers (any worker when None); the status and the worker."""
    try:
        async with asyncio.timeout(ANOTHER_WORKER_S):
            while True:
                async with http.get(url + "/v1/models", headers=bearer(key)) as response:
                    await response.read()
                    if worker is None or response.headers[WORKER] == worker:
                        return response.status, response.headers[WORKER]
    except TimeoutError:
        raise AssertionError(f"worker {worker} never answered in {ANOTHER_WORKER_S:g} s") from None


@contextlib.asynccontextmanager
async def connected_to_another(url: str, worker: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A client whose one kept-alive connection reached a worker other than ``worker``."""

    async def reached() -> aiohttp.ClientSession:
        while True:
            client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            async with client.get(url + "/healthz") as response:
                await response.read()
                answered = response.headers[WORKER]
            if answered != worker:
                return client
            await client.close()

    try:
        async with asyncio.timeout(ANOTHER_WORKER_S):
            client = await reached()
    except TimeoutError:
        raise AssertionError("no connection reached another worker") from None
    try:
        yield client
    finally:
        await client.close()


async def worker_at(http: aiohttp.ClientSession, url: str) -> str:
    """The id of the worker serving ``url`` (one process)."""
    async with http.get(url + "/healthz") as response:
        return response.headers[WORKER]


async def call(
    http: aiohttp.ClientSession, clients: list[CallClient], url: str, key: str = API_KEY
) -> CallClient:
    """A connected WebRTC call placed through ``url`` (text replies)."""
    client = CallClient()
    clients.append(client)
    await client.connect(
        http,
        url,
        api_key=key,
        session={"type": "realtime", "output_modalities": ["text"]},
    )
    await asyncio.wait_for(client.opened.wait(), 30)
    return client


def receiver(ws: aiohttp.ClientWebSocketResponse) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A function that reads ``ws``'s next event (and fails on anything but a text frame)."""

    async def receive() -> dict[str, Any]:
        message = await ws.receive()
        assert message.type == aiohttp.WSMsgType.TEXT, message
        event: dict[str, Any] = json.loads(message.data)
        return event

    return receive


async def text_turn(send: Any, receive: Any, words: str) -> dict[str, Any]:
    """A user message and a response; the ``response.done`` event."""
    await send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": words}],
            },
        }
    )
    await send({"type": "response.create"})
    async with asyncio.timeout(30):
        while True:
            event = await receive()
            if event["type"] == "response.done":
                return event


# ---------------------------------------------------------------------- --workers 2


async def test_keys_minted_on_one_worker_work_on_the_other(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    with HarkProcess([*FAKE, "--workers", "2"], tmp_path / "hark.log", env=ENV) as hark:
        minted: dict[str, str] = {}
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ANOTHER_WORKER_S):
                while len(minted) < 2:
                    value, worker = await mint(http, hark.url)
                    minted.setdefault(worker, value)
        assert len(minted) == 2, "the kernel never handed a connection to the second worker"
        (first, key_of_first), (second, key_of_second) = minted.items()
        assert await models_on(http, hark.url, key_of_first, second) == (200, second)
        assert await models_on(http, hark.url, key_of_second, first) == (200, first)
        # Forged keys are refused the same way by both workers.
        for worker in (first, second):
            status, _ = await models_on(http, hark.url, "ek_forged-key-0000", worker)
            assert status == 401


async def test_sideband_and_hangup_reach_the_call_through_the_other_worker(
    tmp_path: Path, http: aiohttp.ClientSession, clients: list[CallClient]
) -> None:
    with HarkProcess([*FAKE, "--workers", "2"], tmp_path / "hark.log", env=ENV) as hark:
        client = await call(http, clients, hark.url)
        owner = client.worker
        assert owner is not None
        # A sideband socket through whichever worker the kernel picks; keep the first one
        # that another worker took in (it says so in its handshake's X-Hark-Worker).
        try:
            async with asyncio.timeout(ANOTHER_WORKER_S):
                while True:
                    ws = await http.ws_connect(
                        hark.url.replace("http", "ws") + f"/v1/realtime?call_id={client.call_id}",
                        headers=bearer(API_KEY),
                    )
                    if ws._response.headers[WORKER] != owner:
                        break
                    await ws.close()
        except TimeoutError:
            raise AssertionError("no sideband connection reached the other worker") from None

        receive = receiver(ws)

        done = await text_turn(ws.send_json, receive, "Hello from the sideband")
        assert done["response"]["status"] == "completed"
        # The call's own data channel saw the same response.
        on_channel = await client.next_event("response.done")
        assert on_channel["response"]["id"] == done["response"]["id"]

        # A hangup through the other worker ends the call on its owner.
        async with (
            connected_to_another(hark.url, owner) as other,
            other.post(
                hark.url + f"/v1/realtime/calls/{client.call_id}/hangup", headers=bearer(API_KEY)
            ) as response,
        ):
            assert response.status == 200
            assert response.headers[WORKER] == owner
            assert response.headers[VIA] != owner
        closed = await ws.receive()
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await ws.close()


# ---------------------------------------------------------------------- two servers, one Redis


def fleet_args(redis: RedisServer, zone: str = "") -> list[str]:
    """A worker of the Redis fleet."""
    return [*FAKE, "--redis-url", redis.url, *(["--zone", zone] if zone else [])]


async def test_a_call_on_one_server_is_reached_through_another(
    tmp_path: Path, redis: RedisServer, http: aiohttp.ClientSession, clients: list[CallClient]
) -> None:
    with (
        HarkProcess(fleet_args(redis), tmp_path / "a.log", env=ENV) as a,
        HarkProcess(fleet_args(redis), tmp_path / "b.log", env=ENV) as b,
    ):
        key, minted_by = await mint(http, a.url)
        status, answered_by = await models_on(http, b.url, key, None)
        assert (status, answered_by != minted_by) == (200, True)

        client = await call(http, clients, a.url)
        owner = client.worker
        # Placement chose the call's server; the other one is the way in to test.
        owner_url, other_url = (
            (a.url, b.url) if await worker_at(http, a.url) == owner else (b.url, a.url)
        )
        assert await worker_at(http, owner_url) == owner
        # The sideband through the other server is piped to the call's worker.
        async with http.ws_connect(
            other_url.replace("http", "ws") + f"/v1/realtime?call_id={client.call_id}",
            headers=bearer(API_KEY),
        ) as ws:
            receive = receiver(ws)

            done = await text_turn(ws.send_json, receive, "Through the other server")
            assert done["response"]["status"] == "completed"
        # Another key's call, and a call that does not exist, are refused alike by both.
        for server in (a, b):
            async with http.post(
                server.url + f"/v1/realtime/calls/{client.call_id}/hangup",
                headers=bearer(OTHER_KEY),
            ) as response:
                assert response.status == 403
                assert (await response.json())["error"]["code"] == "insufficient_permissions"
            async with http.post(
                server.url + "/v1/realtime/calls/rtc_no_such_call/hangup", headers=bearer(API_KEY)
            ) as response:
                assert response.status == 404
                assert (await response.json())["error"]["code"] == "not_found"
        async with http.post(
            other_url + f"/v1/realtime/calls/{client.call_id}/hangup", headers=bearer(API_KEY)
        ) as response:
            assert response.status == 200
            assert response.headers[WORKER] == owner
            assert response.headers[VIA] == await worker_at(http, other_url)
        # The other server counted what it passed on.
        async with http.get(other_url + "/metrics", headers=bearer(API_KEY)) as response:
            exposition = await response.text()
        for kind in ("sideband", "hangup"):
            assert f'hark_forwarded_requests_total{{kind="{kind}",outcome="ok"}} 1.0' in exposition


async def test_new_calls_go_to_the_least_loaded_worker(
    tmp_path: Path, redis: RedisServer, http: aiohttp.ClientSession, clients: list[CallClient]
) -> None:
    with (
        HarkProcess(fleet_args(redis), tmp_path / "a.log", env=ENV) as a,
        HarkProcess(fleet_args(redis), tmp_path / "b.log", env=ENV) as b,
    ):
        # Every offer goes to A; placement spreads them over both servers' load. Each call
        # is open before the next is offered, so the rule (fewest sessions, a tie stays
        # here) gives 3 and 3 whatever CPU either process samples.
        placed = [(await call(http, clients, a.url)).worker for _ in range(6)]
        counts = {worker: placed.count(worker) for worker in set(placed)}
        assert len(counts) == 2, placed
        assert sorted(counts.values()) == [3, 3], placed
        del b


async def test_a_killed_worker_leaves_the_fleet_and_only_its_calls_end(
    tmp_path: Path, redis: RedisServer, http: aiohttp.ClientSession, clients: list[CallClient]
) -> None:
    a = HarkProcess(fleet_args(redis), tmp_path / "a.log", env=ENV)
    b = HarkProcess(fleet_args(redis), tmp_path / "b.log", env=ENV)
    with a, b:
        a_worker, b_worker = await worker_at(http, a.url), await worker_at(http, b.url)
        # Two calls: the second goes to the server the first did not (least loaded).
        first, second = await call(http, clients, a.url), await call(http, clients, a.url)
        assert {first.worker, second.worker} == {a_worker, b_worker}
        on_a, placed_on_b = (first, second) if first.worker == a_worker else (second, first)
        b.signal(signal.SIGKILL)
        b.wait(timeout=10)
        # Within a few seconds A no longer places calls on B, and B's call is gone.
        async with asyncio.timeout(20):
            while True:
                async with http.post(
                    a.url + f"/v1/realtime/calls/{placed_on_b.call_id}/hangup",
                    headers=bearer(API_KEY),
                ) as response:
                    if response.status == 404:
                        break
                await asyncio.sleep(0.5)
        fresh = [await call(http, clients, a.url) for _ in range(3)]
        assert [c.worker for c in fresh] == [a_worker] * 3
        # A's own call never noticed.
        on_a.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Still there?"}],
                },
            }
        )
        on_a.send({"type": "response.create"})
        done = await on_a.next_event("response.done")
        assert done["response"]["status"] == "completed"


async def test_running_sessions_survive_a_redis_restart(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        HarkProcess(fleet_args(redis), tmp_path / "a.log", env=ENV) as a,
    ):
        key, _ = await mint(http, a.url)
        async with http.ws_connect(
            a.url.replace("http", "ws") + "/v1/realtime", headers=bearer(key)
        ) as ws:
            receive = receiver(ws)

            assert (await receive())["type"] == "session.created"
            redis.stop()
            # What needs the store fails clearly; the running session goes on.
            async with http.post(
                a.url + "/v1/realtime/client_secrets", json={}, headers=bearer(API_KEY)
            ) as response:
                assert response.status == 503
                assert (await response.json())["error"]["code"] == "cluster_unavailable"
            done = await text_turn(ws.send_json, receive, "Is the store down?")
            assert done["response"]["status"] == "completed"
            redis.start()
            async with asyncio.timeout(20):
                while True:
                    async with http.post(
                        a.url + "/v1/realtime/client_secrets", json={}, headers=bearer(API_KEY)
                    ) as response:
                        if response.status == 200:
                            break
                    await asyncio.sleep(0.25)
            done = await text_turn(ws.send_json, receive, "And now?")
            assert done["response"]["status"] == "completed"


async def test_drain_lets_sessions_finish_then_ends_the_rest_with_an_error(
    tmp_path: Path, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    hark = HarkProcess(fleet_args(redis), tmp_path / "a.log", env=ENV)
    with hark:
        async with http.ws_connect(
            hark.url.replace("http", "ws") + "/v1/realtime", headers=bearer(API_KEY)
        ) as ws:
            receive = receiver(ws)

            assert (await receive())["type"] == "session.created"
            hark.signal(signal.SIGTERM)
            async with asyncio.timeout(10):
                while True:
                    async with http.get(hark.url + "/readyz") as response:
                        if response.status == 503:
                            assert (await response.json())["status"] == "draining"
                            break
            # Nothing new starts here...
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(
                    hark.url.replace("http", "ws") + "/v1/realtime", headers=bearer(API_KEY)
                )
            assert refused.value.status == 503
            # ...while the running session goes on until the drain timeout ends it, with a
            # word of why.
            done = await text_turn(ws.send_json, receive, "Still serving?")
            assert done["response"]["status"] == "completed"
            event = await asyncio.wait_for(receive(), 10)
            assert event["type"] == "error"
            assert event["error"]["code"] == "server_shutting_down"
            closed = await ws.receive()
            assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert hark.wait(timeout=20) == 0


async def test_per_key_limits_hold_across_the_fleet(
    tmp_path: Path, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    limits = ["--key-max-sessions", "2", "--key-tokens-per-minute", "1"]
    with (
        HarkProcess([*fleet_args(redis), *limits], tmp_path / "a.log", env=ENV) as a,
        HarkProcess([*fleet_args(redis), *limits], tmp_path / "b.log", env=ENV) as b,
    ):

        async def open_session(url: str, key: str = API_KEY) -> aiohttp.ClientWebSocketResponse:
            ws = await http.ws_connect(
                url.replace("http", "ws") + "/v1/realtime", headers=bearer(key)
            )
            assert json.loads((await ws.receive()).data)["type"] == "session.created"
            return ws

        async def refused(url: str, key: str = API_KEY) -> None:
            with pytest.raises(aiohttp.WSServerHandshakeError) as raised:
                await http.ws_connect(
                    url.replace("http", "ws") + "/v1/realtime", headers=bearer(key)
                )
            assert raised.value.status == 429
            # Only new sessions are refused: the key still works for everything else.
            async with http.get(url + "/v1/models", headers=bearer(key)) as response:
                assert response.status == 200

        first = await open_session(a.url)
        second = await open_session(b.url)
        # The third session of the key is refused on either server; another key is not.
        await refused(a.url)
        await refused(b.url)
        other = await open_session(a.url, OTHER_KEY)
        await first.close()
        # A closed session frees its place for the fleet (the release is asynchronous).
        async with asyncio.timeout(10):
            while True:
                try:
                    third = await open_session(b.url)
                    break
                except aiohttp.WSServerHandshakeError as exc:
                    assert exc.status == 429
                    await asyncio.sleep(0.1)

        # Tokens: one response spends more than the key's minute allows, and the key gets
        # no new session anywhere until the window turns.
        receive = receiver(other)

        done = await text_turn(other.send_json, receive, "Spend some tokens")
        assert done["response"]["usage"]["total_tokens"] > 1
        await other.close()
        async with asyncio.timeout(10):
            while True:
                try:
                    ws = await open_session(b.url, OTHER_KEY)
                    await ws.close()
                    await asyncio.sleep(0.1)
                except aiohttp.WSServerHandshakeError as exc:
                    assert exc.status == 429
                    break
        for ws in (second, third):
            await ws.close()

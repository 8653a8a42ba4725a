"""A write to Redis is not a key, nor a worker, nor a call: records written straight into
a real Redis by someone without the fleet secret are ignored, and what a key's session
holds is not readable there."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio

from hark.cluster.node import ClusterNode
from hark.cluster.redis import RedisStore
from hark.cluster.store import CallRecord, WorkerInfo
from hark.config import ConfigError, load_settings
from hark.edge.relay import Registry
from hark.protocol.session_config import parse_session_config
from hark.server.auth import Authenticator, Principal, owner_of
from tests.cluster.conftest import FLEET_SECRET
from tests.redis_server import RedisServer

API_KEY = "sk-sealed-records-owner"
MCP_SECRET = "Bearer mcp-token-only-the-mcp-server-may-see"


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    """A store of the fleet on the session's Redis, under a prefix of its own."""
    opened = RedisStore(redis_server.url, FLEET_SECRET, prefix=f"test-{secrets.token_hex(4)}:")
    await opened.start()
    yield opened
    await opened.aclose()


def raw(store: RedisStore) -> tuple[redis.asyncio.Redis, str]:
    """What someone who reaches Redis has: the client, and the fleet's key prefix."""
    return store.client, store._prefix


async def test_a_key_record_written_into_redis_is_no_key(
    store: RedisStore, redis_server: RedisServer
) -> None:
    client, prefix = raw(store)
    auth = Authenticator([API_KEY], store)
    forged = "ek_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(forged.encode()).hexdigest()
    expires_at = int(time.time()) + 600
    record = msgspec.json.encode(
        {
            "owner": owner_of(API_KEY),
            "session": {"type": "realtime"},
            "session_id": "sess_forged",
            "created_at": int(time.time()),
            "expires_at": expires_at,
        }
    )
    # Where and how a key was stored before records were sealed: under its plain digest.
    await client.hset(f"{prefix}key:{digest}", mapping={"r": record, "e": repr(expires_at)})
    assert await auth.authenticate(forged) is None
    # Under the name the fleet would use (were it known), but not sealed with its secret.
    name = store._seal.name(digest)
    await client.hset(f"{prefix}key:{name}", mapping={"r": record, "e": repr(expires_at)})
    assert await Authenticator([API_KEY], store).authenticate(forged) is None
    # Minted by a fleet with another secret, in the same Redis under the same prefix.
    other = RedisStore(redis_server.url, "another-fleets-secret-0123456789", prefix=prefix)
    try:
        session = parse_session_config({"instructions": "Be brief."})
        owner = Principal(owner=owner_of(API_KEY))
        foreign, _ = await Authenticator([API_KEY], other).mint(owner, session, "sess_2", 60)
    finally:
        await other.aclose()
    assert await Authenticator([API_KEY], store).authenticate(foreign) is None


async def test_a_genuine_key_record_cannot_be_stretched_and_hides_its_session(
    store: RedisStore,
) -> None:
    client, prefix = raw(store)
    auth = Authenticator([API_KEY], store)
    session = parse_session_config(
        {
            "tools": [
                {
                    "type": "mcp",
                    "server_label": "crm",
                    "server_url": "https://mcp.example.com/mcp",
                    "authorization": MCP_SECRET,
                }
            ]
        }
    )
    value, _ = await auth.mint(Principal(owner=owner_of(API_KEY)), session, "sess_1", 60)
    # Another worker (no cache) takes it.
    assert await Authenticator([API_KEY], store).authenticate(value) is not None
    [key] = [k async for k in client.scan_iter(match=f"{prefix}key:*")]
    stored = await client.hgetall(key)
    values = [v for v in stored.values() if isinstance(v, bytes)]
    assert len(values) == len(stored)
    assert MCP_SECRET.encode() not in b"".join(values)
    assert hashlib.sha256(value.encode()).hexdigest().encode() not in key
    # Its expiry pushed back by hand: the record no longer opens.
    await client.hset(key, "e", repr(time.time() + 3600))
    assert await Authenticator([API_KEY], store).authenticate(value) is None


async def test_a_worker_written_into_redis_gets_no_call_and_no_request(
    store: RedisStore,
) -> None:
    client, prefix = raw(store)
    genuine = ClusterNode(store, url="http://10.0.0.1:8000", media_address="10.0.0.1:8443")
    genuine.ready = True
    await genuine.beat()
    evil = WorkerInfo(
        id="wrk_0000000e0e0e",
        url="http://attacker.example:8000",
        media_address="203.0.113.66:3478",
        sessions=0,
        cpu=0.0,
    )
    await client.set(f"{prefix}worker:{evil.id}", msgspec.json.encode(evil), px=600_000)
    await client.sadd(f"{prefix}workers", evil.id)
    # Signed, but with the signature of another worker's entry.
    genuine_value = await client.get(f"{prefix}worker:{genuine.id}")
    assert isinstance(genuine_value, bytes)
    await client.set(
        f"{prefix}worker:wrk_0000000f0f0f",
        genuine_value[:32] + msgspec.json.encode(evil),
        px=600_000,
    )
    await client.sadd(f"{prefix}workers", "wrk_0000000f0f0f")

    assert [w.id for w in await store.workers(time.time())] == [genuine.id]
    # No call is placed on it, though it claims to be idle and the genuine one is not.
    assert [w.id for w in await genuine.place()] == [genuine.id]
    # A relay sends it no flow.
    registry = Registry(store)
    assert await registry.refresh()
    assert set(registry.workers) == {genuine.id}
    # A call pointed at it by hand is no call: no request is forwarded there.
    await store.put_call(CallRecord("rtc_1", owner_of(API_KEY), genuine.id, time.time()))
    assert await store.get_call("rtc_1") is not None
    await client.hset(f"{prefix}call:rtc_1", "worker_id", evil.id)
    assert await store.get_call("rtc_1") is None
    await client.hset(
        f"{prefix}call:rtc_2",
        mapping={"owner": "o", "worker_id": genuine.id, "created_at": "1.0"},
    )
    assert await store.get_call("rtc_2") is None


def test_a_fleet_on_redis_needs_a_fleet_secret() -> None:
    with pytest.raises(ConfigError, match="fleet_secret"):
        load_settings({"redis_url": "redis://127.0.0.1:6379/0"}, env={})
    settings = load_settings(
        {"redis_url": "redis://127.0.0.1:6379/0"}, env={"HARK_FLEET_SECRET": FLEET_SECRET}
    )
    assert settings.fleet_secret == FLEET_SECRET

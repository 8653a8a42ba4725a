"""The cluster store's contract, held by both backends (``backend`` runs each test twice:
the embedded SQLite store and a real redis-server)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets

from hark.cluster.store import CallRecord, ClusterStore, WorkerInfo
from tests.cluster.conftest import Backend

LONG_TTL_S = 600.0


def worker(worker_id: str, sessions: int = 0) -> WorkerInfo:
    return WorkerInfo(id=worker_id, url=f"http://{worker_id}.internal:8000", sessions=sessions)


def call(call_id: str, worker_id: str, owner: str = "owner-a") -> CallRecord:
    return CallRecord(id=call_id, owner=owner, worker_id=worker_id, created_at=1_700_000_000.5)


# ---------------------------------------------------------------------- ephemeral keys


async def test_a_key_is_valid_on_every_worker_until_it_expires(backend: Backend) -> None:
    minting, other = await backend.open(), await backend.open()
    now = backend.clock()
    await minting.put_key("ab" * 32, b'{"owner":"o"}', now + 60)

    for store in (minting, other):
        assert await store.get_key("ab" * 32, now) == b'{"owner":"o"}'
        assert await store.get_key("ab" * 32, now + 59.9) == b'{"owner":"o"}'
        assert await store.get_key("ab" * 32, now + 60) is None
        assert await store.get_key("cd" * 32, now) is None


async def test_keys_are_stored_under_their_digest_never_themselves(backend: Backend) -> None:
    store = await backend.open()
    key = "ek_" + secrets.token_urlsafe(24)
    digest = hashlib.sha256(key.encode()).hexdigest()
    await store.put_key(digest, b'{"owner":"o","model":"m"}', backend.clock() + 60)
    assert await store.get_key(digest, backend.clock()) is not None

    raw = await backend.raw()
    assert key.encode() not in raw
    assert key.split("_", 1)[1].encode() not in raw
    if backend.redis is None:
        assert digest.encode() in raw  # the inspection sees what the store wrote
    else:
        # In Redis neither the digest (against which guesses could be tried) nor the
        # record in the clear: a keyed hash, and the record encrypted.
        assert digest.encode() not in raw
        assert b'"model"' not in raw


# ---------------------------------------------------------------------- calls


async def test_calls_are_put_found_by_any_worker_and_deleted(backend: Backend) -> None:
    a, b = await backend.open(), await backend.open()
    await a.heartbeat(worker("w1"), LONG_TTL_S)
    await a.put_call(call("rtc_1", "w1"))

    assert await b.get_call("rtc_1") == call("rtc_1", "w1")
    assert await b.get_call("rtc_unknown") is None

    await b.delete_call("rtc_1")
    assert await a.get_call("rtc_1") is None
    await b.delete_call("rtc_1")  # unknown ids are ignored


async def test_a_call_put_again_moves_to_its_new_worker(backend: Backend) -> None:
    store = await backend.open()
    await store.heartbeat(worker("w1"), LONG_TTL_S)
    await store.heartbeat(worker("w2"), LONG_TTL_S)
    await store.put_call(call("rtc_1", "w1"))
    await store.put_call(call("rtc_1", "w2", owner="owner-b"))

    assert await store.get_call("rtc_1") == call("rtc_1", "w2", owner="owner-b")
    # The call is no longer w1's: taking w1 out leaves it alone.
    await store.remove_worker("w1")
    assert await store.get_call("rtc_1") == call("rtc_1", "w2", owner="owner-b")


async def test_a_call_of_a_worker_never_registered_is_not_found(backend: Backend) -> None:
    store = await backend.open()
    await store.put_call(call("rtc_1", "w-ghost"))
    assert await store.get_call("rtc_1") is None


# ---------------------------------------------------------------------- workers


async def test_the_registry_shows_what_each_worker_advertises(backend: Backend) -> None:
    a, b = await backend.open(), await backend.open()
    w1 = WorkerInfo(
        id="w1",
        url="http://10.0.0.1:8000",
        media_address="10.0.0.1:3478",
        zone="eu-1",
        sessions=3,
        cpu=0.75,
        queue_depth=2,
        draining=True,
        ready=False,
        started_at=1_700_000_000.25,
        heartbeat_at=1_700_000_100.5,
    )
    await a.heartbeat(w1, LONG_TTL_S)
    await b.heartbeat(worker("w2"), LONG_TTL_S)
    assert await b.workers(backend.clock()) == [w1, worker("w2")]

    # A heartbeat replaces what the worker said before.
    w1_later = worker("w1", sessions=4)
    await a.heartbeat(w1_later, LONG_TTL_S)
    assert await b.workers(backend.clock()) == [w1_later, worker("w2")]


async def test_a_worker_whose_heartbeat_expires_disappears_and_is_swept(
    backend: Backend,
) -> None:
    dying, living = await backend.open(), await backend.open()
    # A heartbeat says whether the worker was registered until then: not at its first.
    assert not await dying.heartbeat(worker("w-dying"), LONG_TTL_S)
    assert await dying.heartbeat(worker("w-dying"), backend.short_ttl)
    await living.heartbeat(worker("w-living"), LONG_TTL_S)
    await dying.put_call(call("rtc_dying", "w-dying"))
    await living.put_call(call("rtc_living", "w-living"))
    assert await dying.acquire_session("owner-a", "w-dying", None)
    assert await living.acquire_session("owner-a", "w-living", None)
    assert await living.get_call("rtc_dying") is not None
    assert await living.sessions_of("owner-a") == 2

    await backend.expire_heartbeats("w-dying")

    now = backend.clock()
    assert [w.id for w in await living.workers(now)] == ["w-living"]
    # Gone for every reader before any sweep: its call and its sessions.
    assert await living.get_call("rtc_dying") is None
    assert await living.sessions_of("owner-a") == 1
    assert await living.get_call("rtc_living") == call("rtc_living", "w-living")

    # Two workers sweeping at once count the dead one once.
    swept = await asyncio.gather(living.sweep(now), dying.sweep(now))
    assert sorted(swept) == [0, 1]
    assert await living.sweep(now) == 0

    # Swept, not merely hidden: were the worker id to beat again, nothing of it is left,
    # and its heartbeat says the store had forgotten it.
    assert not await dying.heartbeat(worker("w-dying"), LONG_TTL_S)
    assert await living.get_call("rtc_dying") is None
    assert await living.sessions_of("owner-a") == 1
    assert await living.get_call("rtc_living") == call("rtc_living", "w-living")


async def test_a_removed_worker_goes_at_once_with_its_calls_and_sessions(
    backend: Backend,
) -> None:
    leaving, staying = await backend.open(), await backend.open()
    await leaving.heartbeat(worker("w1"), LONG_TTL_S)
    await staying.heartbeat(worker("w2"), LONG_TTL_S)
    await leaving.put_call(call("rtc_1", "w1"))
    assert await leaving.acquire_session("owner-a", "w1", None)
    assert await staying.acquire_session("owner-a", "w2", None)

    await leaving.remove_worker("w1")

    assert [w.id for w in await staying.workers(backend.clock())] == ["w2"]
    await leaving.heartbeat(worker("w1"), LONG_TTL_S)
    assert await staying.get_call("rtc_1") is None
    assert await staying.sessions_of("owner-a") == 1
    await staying.remove_worker("w-unknown")


# ---------------------------------------------------------------------- limits


async def test_the_session_limit_holds_across_workers_under_concurrency(
    backend: Backend,
) -> None:
    a, b = await backend.open(), await backend.open()
    await a.heartbeat(worker("w1"), LONG_TTL_S)
    await b.heartbeat(worker("w2"), LONG_TTL_S)

    attempts = [a.acquire_session("owner-a", "w1", 7) for _ in range(20)]
    attempts += [b.acquire_session("owner-a", "w2", 7) for _ in range(20)]
    results = await asyncio.gather(*attempts)

    assert results.count(True) == 7
    assert await a.sessions_of("owner-a") == 7
    assert await b.sessions_of("owner-b") == 0
    # Another owner has its own count.
    assert await b.acquire_session("owner-b", "w2", 7)

    # One session ends, one more may start; then the limit holds again.
    holder = "w1" if True in results[:20] else "w2"
    await a.release_session("owner-a", holder)
    assert await a.sessions_of("owner-a") == 6
    assert await b.acquire_session("owner-a", "w2", 7)
    assert not await a.acquire_session("owner-a", "w1", 7)
    assert await a.sessions_of("owner-a") == 7


async def test_sessions_released_more_than_acquired_never_go_below_zero(
    backend: Backend,
) -> None:
    store = await backend.open()
    await store.heartbeat(worker("w1"), LONG_TTL_S)
    assert await store.acquire_session("owner-a", "w1", 1)
    for _ in range(3):
        await store.release_session("owner-a", "w1")
    assert await store.sessions_of("owner-a") == 0
    await store.release_session("owner-a", "w-unknown")

    assert await store.acquire_session("owner-a", "w1", 1)
    assert not await store.acquire_session("owner-a", "w1", 1)
    assert await store.sessions_of("owner-a") == 1


async def test_no_limit_counts_without_refusing(backend: Backend) -> None:
    store = await backend.open()
    await store.heartbeat(worker("w1"), LONG_TTL_S)
    results = await asyncio.gather(
        *(store.acquire_session("owner-a", "w1", None) for _ in range(12))
    )
    assert all(results)
    assert await store.sessions_of("owner-a") == 12
    assert not await store.acquire_session("owner-a", "w1", 12)


async def test_a_dead_workers_sessions_stop_counting_against_the_limit(
    backend: Backend,
) -> None:
    dying, living = await backend.open(), await backend.open()
    # A heartbeat says whether the worker was registered until then: not at its first.
    assert not await dying.heartbeat(worker("w-dying"), LONG_TTL_S)
    assert await dying.heartbeat(worker("w-dying"), backend.short_ttl)
    await living.heartbeat(worker("w-living"), LONG_TTL_S)
    assert await dying.acquire_session("owner-a", "w-dying", 2)
    assert await dying.acquire_session("owner-a", "w-dying", 2)
    assert not await living.acquire_session("owner-a", "w-living", 2)

    await backend.expire_heartbeats("w-dying")

    assert await living.acquire_session("owner-a", "w-living", 2)
    assert await living.acquire_session("owner-a", "w-living", 2)
    assert not await living.acquire_session("owner-a", "w-living", 2)


async def test_usage_is_counted_per_fixed_window_kind_and_owner(backend: Backend) -> None:
    a, b = await backend.open(), await backend.open()
    start = 1_800_000_000.0  # a multiple of 60: a window starts here

    assert await a.add_usage("owner-a", "requests", 1, start + 1) == 1
    assert await b.add_usage("owner-a", "requests", 1, start + 30) == 2
    assert await a.add_usage("owner-a", "tokens", 500, start + 59.9) == 500
    assert await b.add_usage("owner-a", "tokens", 0, start + 2) == 500
    assert await b.add_usage("owner-b", "requests", 0, start + 2) == 0
    # The next window starts from nothing.
    assert await a.add_usage("owner-a", "requests", 0, start + 60) == 0
    assert await a.add_usage("owner-a", "requests", 3, start + 61) == 3
    # Windows of another length are their own.
    assert await a.add_usage("owner-a", "requests", 1, start + 61, window_s=10) == 1
    assert await a.add_usage("owner-a", "requests", 0, start + 70, window_s=10) == 0


async def test_concurrent_usage_from_two_workers_adds_up(backend: Backend) -> None:
    a, b = await backend.open(), await backend.open()
    now = 1_800_000_000.0
    await asyncio.gather(
        *(store.add_usage("owner-a", "tokens", 7, now) for store in (a, b) for _ in range(15))
    )
    assert await a.add_usage("owner-a", "tokens", 0, now) == 7 * 30


async def test_a_closed_store_can_be_closed_again(backend: Backend) -> None:
    store: ClusterStore = await backend.open()
    await store.aclose()
    await store.aclose()

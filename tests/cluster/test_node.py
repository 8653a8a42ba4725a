"""A worker's membership of the cluster on a real embedded store: placement order (zone,
load, calls placed since the last heartbeat, no hop on a tie), and where calls live."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hark.cluster.embedded import EmbeddedStore
from hark.cluster.node import HEARTBEAT_TTL_S, ClusterNode, Load
from hark.cluster.store import WorkerInfo


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    """An embedded store of the test's own."""
    opened = EmbeddedStore(tmp_path)
    await opened.start()
    yield opened
    await opened.aclose()


async def peer(
    store: EmbeddedStore, worker_id: str, *, zone: str, sessions: int, **fields: object
) -> WorkerInfo:
    """Another worker's registry entry, as its heartbeat would write it."""
    info = WorkerInfo(
        id=worker_id,
        url=f"http://{worker_id}.invalid:8000",
        zone=zone,
        sessions=sessions,
        heartbeat_at=time.time(),
        **fields,  # type: ignore[arg-type]
    )
    await store.heartbeat(info, HEARTBEAT_TTL_S)
    return info


async def test_placement_prefers_the_zone_then_the_least_loaded(store: EmbeddedStore) -> None:
    node = ClusterNode(store, url="http://self.invalid:8000", zone="a", load=lambda: Load(5))
    node.ready = True
    await node.beat()
    await peer(store, "wrk_far_idle", zone="b", sessions=0)
    await peer(store, "wrk_near_busy", zone="a", sessions=9)
    await peer(store, "wrk_near_light", zone="a", sessions=2)
    await peer(store, "wrk_draining", zone="a", sessions=0, draining=True)
    await peer(store, "wrk_loading", zone="a", sessions=0, ready=False)
    order = [w.id for w in await node.place()]
    assert order == ["wrk_near_light", node.id, "wrk_near_busy", "wrk_far_idle"]
    # Draining this worker takes it out of its own placement.
    assert node.id not in [w.id for w in await node.place(exclude=frozenset({node.id}))]


async def test_calls_placed_since_a_heartbeat_count_until_the_next(store: EmbeddedStore) -> None:
    node = ClusterNode(store, url="http://self.invalid:8000", load=lambda: Load(1))
    node.ready = True
    await node.beat()
    await peer(store, "wrk_other", zone="", sessions=0)
    assert (await node.place())[0].id == "wrk_other"
    node.placed("wrk_other")
    node.placed("wrk_other")
    # Two calls on its way and none reported yet: the other now counts 2 against our 1.
    assert (await node.place())[0].id == node.id
    # Its heartbeat reports them; what it reported replaces what was remembered.
    await peer(store, "wrk_other", zone="", sessions=2)
    assert [w.id for w in await node.place()] == [node.id, "wrk_other"]


async def test_a_tie_stays_here(store: EmbeddedStore) -> None:
    node = ClusterNode(store, url="http://self.invalid:8000", load=lambda: Load(3))
    node.ready = True
    await node.beat()
    (mine,) = [w for w in await store.workers(time.time()) if w.id == node.id]
    other = await peer(store, "wrk_other", zone="", sessions=3, cpu=mine.cpu)
    assert [w.id for w in await node.place()] == [node.id, other.id]


async def test_calls_are_found_here_first_and_in_the_store_for_others(
    store: EmbeddedStore, tmp_path: Path
) -> None:
    node = ClusterNode(store, url="http://self.invalid:8000")
    await node.beat()
    other_store = EmbeddedStore(tmp_path)
    await other_store.start()
    try:
        other = ClusterNode(other_store, url="http://other.invalid:8000")
        await other.beat()
        await node.register_call("rtc_here", "key_owner")
        found = await other.find_call("rtc_here")
        assert found is not None and (found.worker_id, found.owner) == (node.id, "key_owner")
        owner = await other.worker(found.worker_id)
        assert owner is not None and owner.url == node.url
        await node.forget_call("rtc_here")
        assert await other.find_call("rtc_here") is None
    finally:
        await other_store.aclose()

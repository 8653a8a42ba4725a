"""A worker's membership of the cluster: the placement rule as a pure function (zone, load,
calls placed but not yet counted, no hop on a tie, then CPU), the same rule on a real
embedded store, and where calls live."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hark.cluster.embedded import EmbeddedStore
from hark.cluster.node import (
    HEARTBEAT_TTL_S,
    PLACEMENT_IN_FLIGHT_S,
    ClusterNode,
    Load,
    rank,
)
from hark.cluster.store import WorkerInfo


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    """An embedded store of the test's own."""
    opened = EmbeddedStore(tmp_path)
    await opened.start()
    yield opened
    await opened.aclose()


async def peer(
    store: EmbeddedStore,
    worker_id: str,
    *,
    zone: str,
    sessions: int,
    heartbeat_at: float | None = None,
    **fields: object,
) -> WorkerInfo:
    """Another worker's registry entry, as its heartbeat would write it."""
    info = WorkerInfo(
        id=worker_id,
        url=f"http://{worker_id}.invalid:8000",
        zone=zone,
        sessions=sessions,
        heartbeat_at=time.time() if heartbeat_at is None else heartbeat_at,
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


def entry(worker_id: str, *, zone: str = "", sessions: int = 0, cpu: float = 0.0) -> WorkerInfo:
    """A registry entry for the pure ranking."""
    return WorkerInfo(id=worker_id, url="", zone=zone, sessions=sessions, cpu=cpu)


def ranked(workers: list[WorkerInfo], pending: dict[str, int] | None = None) -> list[str]:
    return [w.id for w in rank(workers, here="wrk_here", zone="a", pending=pending or {})]


def test_rank_puts_the_zone_before_the_load() -> None:
    near = entry("wrk_near", zone="a", sessions=7)
    far = entry("wrk_far", zone="b", sessions=0)
    assert ranked([far, near]) == ["wrk_near", "wrk_far"]


def test_rank_counts_pending_calls_with_the_sessions() -> None:
    here = entry("wrk_here", zone="a", sessions=2)
    other = entry("wrk_other", zone="a", sessions=1)
    assert ranked([here, other]) == ["wrk_other", "wrk_here"]
    assert ranked([here, other], {"wrk_other": 2}) == ["wrk_here", "wrk_other"]
    assert ranked([here, other], {"wrk_here": 1, "wrk_other": 3}) == ["wrk_here", "wrk_other"]


def test_rank_keeps_a_tie_here_whatever_the_cpu() -> None:
    # This worker is the busier by CPU; a tie on sessions still stays here (no hop).
    here = entry("wrk_here", zone="a", sessions=3, cpu=1.9)
    other = entry("wrk_other", zone="a", sessions=3, cpu=0.0)
    assert ranked([other, here]) == ["wrk_here", "wrk_other"]


def test_rank_breaks_a_tie_between_others_by_cpu_then_id() -> None:
    busy = entry("wrk_busy", zone="a", sessions=1, cpu=0.8)
    idle = entry("wrk_idle", zone="a", sessions=1, cpu=0.1)
    twin = entry("wrk_twin", zone="a", sessions=1, cpu=0.1)
    assert ranked([busy, twin, idle]) == ["wrk_idle", "wrk_twin", "wrk_busy"]


def test_rank_spreads_sequential_calls_evenly_whatever_the_cpu() -> None:
    # Six calls offered to one worker, each counted where it went: 3 and 3, whichever of
    # the two samples the lower CPU.
    for here_cpu, other_cpu in ((0.9, 0.1), (0.1, 0.9), (0.5, 0.5)):
        sessions = {"wrk_here": 0, "wrk_other": 0}
        for _ in range(6):
            workers = [
                entry("wrk_here", zone="a", sessions=sessions["wrk_here"], cpu=here_cpu),
                entry("wrk_other", zone="a", sessions=sessions["wrk_other"], cpu=other_cpu),
            ]
            sessions[ranked(workers)[0]] += 1
        assert sessions == {"wrk_here": 3, "wrk_other": 3}


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_a_placed_call_counts_until_a_heartbeat_that_counts_it(
    store: EmbeddedStore,
) -> None:
    node = ClusterNode(store, url="http://self.invalid:8000", load=lambda: Load(1))
    node.ready = True
    await node.beat()
    await peer(store, "wrk_other", zone="", sessions=0)
    assert (await node.place())[0].id == "wrk_other"
    first, second = node.placed("wrk_other"), node.placed("wrk_other")
    # Two calls on their way: the other now counts 2 against our 1.
    assert (await node.place())[0].id == node.id
    # They opened there as its 1st and 2nd calls.
    node.settle(first, 1)
    node.settle(second, 2)
    # A heartbeat from before either opened counts neither: both still count.
    await peer(store, "wrk_other", zone="", sessions=0, calls_opened=0)
    assert (await node.place())[0].id == node.id
    # One computed between the two opening counts the first: the second still counts, and
    # the first is not counted twice (1 + 1 = 2 against our 1).
    await peer(store, "wrk_other", zone="", sessions=1, calls_opened=1)
    assert [w.id for w in await node.place()] == [node.id, "wrk_other"]
    await peer(store, "wrk_other", zone="", sessions=0, calls_opened=1)
    assert [w.id for w in await node.place()] == [node.id, "wrk_other"]
    # Once a heartbeat counts both, what it reports replaces what was remembered: after
    # they ended, the other is idle again.
    await peer(store, "wrk_other", zone="", sessions=0, calls_opened=2)
    assert [w.id for w in await node.place()] == ["wrk_other", node.id]


async def test_a_call_that_did_not_open_stops_counting(tmp_path: Path) -> None:
    clock = Clock()
    store = EmbeddedStore(tmp_path, clock=clock)
    await store.start()
    node = ClusterNode(store, url="http://self.invalid:8000", load=lambda: Load(1), clock=clock)
    node.ready = True
    await node.beat()
    await peer(store, "wrk_other", zone="", sessions=0, heartbeat_at=clock.now)
    refused = node.placed("wrk_other")
    lost = node.placed("wrk_other")
    assert (await node.place())[0].id == node.id
    node.settle(refused, None)
    assert (await node.place())[0].id == node.id
    # An offer never answered stops counting after the internal hop's time-out.
    clock.now += PLACEMENT_IN_FLIGHT_S
    await node.beat()
    await peer(store, "wrk_other", zone="", sessions=0, heartbeat_at=clock.now)
    assert [w.id for w in await node.place()] == ["wrk_other", node.id]
    del lost
    await store.aclose()


async def test_calls_opening_here_count_here(store: EmbeddedStore) -> None:
    load = Load(0)
    node = ClusterNode(store, url="http://self.invalid:8000", load=lambda: load)
    node.ready = True
    await node.beat()
    await peer(store, "wrk_other", zone="", sessions=0)
    # A tie stays here; while that call opens it counts here, then as one of our sessions
    # (this worker's own figure is read live, not from its last heartbeat).
    here = node.placed((await node.place())[0].id)
    assert here.worker_id == node.id
    assert (await node.place())[0].id == "wrk_other"
    load = Load(1, calls_opened=1)
    node.settle(here, 1)
    assert [w.id for w in await node.place()] == ["wrk_other", node.id]
    load = Load(0, calls_opened=1)
    assert (await node.place())[0].id == node.id


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


async def test_a_worker_the_store_forgot_writes_its_calls_back_at_its_next_beat(
    store: EmbeddedStore,
) -> None:
    """The store lost the worker's entry and calls (a failover to a replica that let the
    entry expire, and another worker's sweep): the next heartbeat finds it forgotten and
    writes the calls back then, not at the next periodic resync."""
    # Its heartbeat turns taken by hand, without the task (which could take one between).
    node = ClusterNode(store, url="http://self.invalid:8000")
    await node.tick()
    await node.register_call("rtc_kept", "owner-a")
    await node.tick()
    await store.remove_worker(node.id)
    assert await store.get_call("rtc_kept") is None
    await node.tick()
    found = await store.get_call("rtc_kept")
    assert found is not None and found.worker_id == node.id

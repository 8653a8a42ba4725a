"""The embedded store as the ``--workers`` of one machine use it: separate processes on one
SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest

from hark.cluster import open_store
from hark.cluster.embedded import PRUNE_INTERVAL_S, EmbeddedStore
from hark.cluster.store import ClusterUnavailableError, WorkerInfo
from tests.cluster.conftest import Clock

# One "worker" process: registers, reads the key the test wrote, waits for the go (so that
# both processes acquire at the same time), then tries ATTEMPTS sessions against LIMIT.
WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from hark.cluster.embedded import EmbeddedStore
    from hark.cluster.store import WorkerInfo

    async def main(run_dir, worker_id, digest, attempts, limit):
        store = EmbeddedStore(Path(run_dir))
        await store.start()
        await store.heartbeat(WorkerInfo(id=worker_id, url="http://" + worker_id), 600)
        record = await store.get_key(digest, 0)
        print("ready", record.decode() if record else None, flush=True)
        sys.stdin.readline()
        counted = await asyncio.gather(
            *(store.acquire_session("owner-a", worker_id, limit) for _ in range(attempts))
        )
        print("counted", sum(counted), flush=True)
        await store.aclose()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
    """
)


async def test_worker_processes_share_the_file_and_the_limit(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path)
    await store.start()
    await store.put_key("ab" * 32, b"minted in the parent", 4_000_000_000)

    procs = [
        await asyncio.create_subprocess_exec(
            *[sys.executable, "-c", WORKER, str(tmp_path), f"w{i}", "ab" * 32, "30", "9"],
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for i in (1, 2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = (await proc.stdout.readline()).decode()
            assert line.split(maxsplit=1) == ["ready", "minted in the parent\n"]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
        outputs = [(await proc.communicate())[0].decode() for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0]

    counted = [int(out.split()[-1]) for out in outputs]
    assert sum(counted) == 9
    # What the processes wrote, the parent reads.
    assert {w.id for w in await store.workers(0)} == {"w1", "w2"}
    assert await store.sessions_of("owner-a") == 9
    await store.aclose()


async def test_expired_keys_and_usage_windows_are_pruned(tmp_path: Path) -> None:
    clock = Clock()
    store = EmbeddedStore(tmp_path, clock=clock)
    await store.start()
    now = clock()
    await store.put_key("aa" * 32, b"short", now + 5)
    await store.put_key("bb" * 32, b"long", now + 3600)
    await store.add_usage("owner-a", "requests", 1, now)

    clock.advance(PRUNE_INTERVAL_S + 120)
    await store.put_key("cc" * 32, b"new", clock() + 60)

    with _sqlite(tmp_path) as db:
        assert sorted(r[0] for r in db.execute("SELECT record FROM keys")) == [b"long", b"new"]
        assert db.execute("SELECT COUNT(*) FROM usage").fetchone() == (0,)
    await store.aclose()


async def test_a_writer_holding_the_lock_never_stalls_the_event_loop(tmp_path: Path) -> None:
    """Another process's write transaction makes the store wait on its own thread; the event
    loop goes on meanwhile, and the write lands once the lock is free."""
    store = EmbeddedStore(tmp_path)
    await store.start()
    with _sqlite(tmp_path) as other_process:
        other_process.execute("BEGIN IMMEDIATE")
        beat = asyncio.create_task(store.heartbeat(WorkerInfo(id="w1", url="http://w1"), 600))
        ran = asyncio.Event()
        asyncio.get_running_loop().call_soon(ran.set)
        for _ in range(10):
            await asyncio.sleep(0)
        assert ran.is_set()
        assert not beat.done()  # waiting for the lock (busy_timeout is seconds away)
        other_process.execute("COMMIT")
        await beat
    assert [w.id for w in await store.workers(0)] == ["w1"]
    await store.aclose()


async def test_a_closed_or_unusable_store_is_unavailable(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path)
    await store.start()
    await store.aclose()
    with pytest.raises(ClusterUnavailableError, match="not open"):
        await store.get_key("aa" * 32, 0)

    # A run directory that is a file cannot hold the database.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    broken = EmbeddedStore(blocker)
    with pytest.raises(ClusterUnavailableError):
        await broken.start()
    await broken.aclose()


def test_open_store_without_redis_is_embedded_in_the_run_dir(tmp_path: Path) -> None:
    store = open_store(None, tmp_path)
    assert isinstance(store, EmbeddedStore)
    assert store.description == f"sqlite:{tmp_path / 'cluster.sqlite3'}"
    with pytest.raises(ValueError, match="run directory"):
        open_store(None, None)


async def test_the_store_file_is_this_users_alone(tmp_path: Path) -> None:
    # Its trust is the file system: another user of the machine reads and writes nothing.
    store = open_store(None, tmp_path / "run")
    await store.start()
    try:
        files = sorted((tmp_path / "run").glob("cluster.sqlite3*"))
        assert files
        for file in files:
            assert file.stat().st_mode & 0o777 == 0o600, file
        assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    finally:
        await store.aclose()


def _sqlite(run_dir: Path) -> contextlib.closing[sqlite3.Connection]:
    """A plain connection to the store's file (autocommit), as another process has."""
    return contextlib.closing(
        sqlite3.connect(run_dir / "cluster.sqlite3", isolation_level=None, timeout=0)
    )

"""The embedded cluster store: one SQLite file in WAL mode, shared by the workers of a machine.

``hark serve --workers N`` forks N processes that must agree on ephemeral keys, calls, the
worker registry and limits. Each opens its own connection to ``cluster.sqlite3`` in the run
directory. SQLite fits that job better than a parent process serving the workers:

- nothing more to run or install: the store is a file, and a worker that crashes (even
  with SIGKILL) leaves it consistent, because every write is a transaction that either
  reached the write-ahead log or did not; the parent has no state to lose;
- WAL mode lets readers go on while one process writes, so a heartbeat never stalls a key
  check;
- ``BEGIN IMMEDIATE`` takes the write lock before the first read, which makes a
  read-then-write (counting sessions against a limit, sweeping dead workers) atomic across
  processes; ``busy_timeout`` makes a writer wait its turn instead of failing at once.

Every call into SQLite is a short local file operation, but it blocks (on the disk, or on
another process's write lock for up to ``BUSY_TIMEOUT_MS``), so each store runs them on one
dedicated thread that owns its connection: the event loop never waits on a lock.

Expiry is kept in ``expires_at`` columns compared with the ``now`` a caller passes in (the
store's clock where a method takes none); expired keys and usage windows are pruned on the
way, at most every ``PRUNE_INTERVAL_S``, and dead workers' rows by ``sweep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import msgspec

from hark.cluster.store import (
    CallRecord,
    ClusterStore,
    ClusterUnavailableError,
    UsageKind,
    WorkerInfo,
)

T = TypeVar("T")

FILENAME = "cluster.sqlite3"
# How long a writer waits for another process's transaction before the store is declared
# unavailable; transactions here take microseconds, so this only trips on a stuck disk.
BUSY_TIMEOUT_MS = 5000
PRUNE_INTERVAL_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    digest TEXT PRIMARY KEY, record BLOB NOT NULL, expires_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS keys_expiry ON keys (expires_at);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY, info BLOB NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, worker_id TEXT NOT NULL,
    created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS calls_worker ON calls (worker_id);
CREATE TABLE IF NOT EXISTS sessions (
    owner TEXT NOT NULL, worker_id TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (owner, worker_id));
CREATE INDEX IF NOT EXISTS sessions_worker ON sessions (worker_id);
CREATE TABLE IF NOT EXISTS usage (
    owner TEXT NOT NULL, kind TEXT NOT NULL, window_s INTEGER NOT NULL,
    window_start INTEGER NOT NULL, total INTEGER NOT NULL, expires_at REAL NOT NULL,
    PRIMARY KEY (owner, kind, window_s, window_start));
CREATE INDEX IF NOT EXISTS usage_expiry ON usage (expires_at);
"""

# Sessions of ``owner`` on live workers; the asking worker's own count always counts, so a
# worker whose heartbeat has not reached the store yet cannot exceed a limit.
_LIVE_SESSIONS = """
SELECT COALESCE(SUM(s.count), 0) FROM sessions s LEFT JOIN workers w ON w.id = s.worker_id
WHERE s.owner = ? AND (s.worker_id = ? OR w.expires_at > ?)
"""


class EmbeddedStore(ClusterStore):
    """The cluster store in ``path/cluster.sqlite3`` (``path`` is the run directory, made
    if missing); every process of the machine opens its own ``EmbeddedStore`` on it."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path) / FILENAME
        self._clock = clock
        self._executor: ThreadPoolExecutor | None = None
        # Only ever touched on the executor's thread.
        self._db: sqlite3.Connection | None = None
        self._next_prune = -math.inf

    @property
    def description(self) -> str:
        """``sqlite:`` and the file's path."""
        return f"sqlite:{self.path}"

    async def start(self) -> None:
        """Open (and if need be create) the file, in WAL mode, with the tables."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="hark-cluster-store")
        await self._call(lambda db: None)

    async def aclose(self) -> None:
        """Close the connection and stop the store's thread; idempotent."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close)
        finally:
            executor.shutdown(wait=False)

    # ------------------------------------------------------------------ plumbing

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The file is the store's only protection: readable and writable by this user
        # alone (SQLite gives its -wal and -shm files the same mode).
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        # Autocommit (isolation_level=None): transactions are the explicit BEGIN IMMEDIATE
        # blocks below, never ones the sqlite3 module opens on its own. ``timeout`` is
        # SQLite's busy_timeout.
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            # WAL with NORMAL sync stays consistent after a crash; it only risks the last
            # transactions on power loss, and all of this state is rebuilt within seconds
            # by heartbeats and resyncs anyway.
            db.execute("PRAGMA synchronous = NORMAL")
            with _immediate(db):
                _create_schema(db)
        except BaseException:
            db.close()
            raise
        return db

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` with the connection on the store's thread."""
        executor = self._executor
        if executor is None:
            raise ClusterUnavailableError(f"the cluster store {self.path} is not open")

        def run() -> T:
            if self._db is None:
                self._db = self._connect()
            return fn(self._db)

        try:
            return await asyncio.get_running_loop().run_in_executor(executor, run)
        except (sqlite3.DatabaseError, OSError) as exc:
            # A locked database past busy_timeout, a full or unreadable disk, a run directory
            # that cannot be made, a file that is not a database.
            raise ClusterUnavailableError(f"the cluster store {self.path}: {exc}") from exc
        except RuntimeError as exc:
            # The executor was shut down under us (aclose while a call was on its way).
            raise ClusterUnavailableError(f"the cluster store {self.path} is closed") from exc

    def _prune_due(self, now: float) -> bool:
        if now < self._next_prune:
            return False
        self._next_prune = now + PRUNE_INTERVAL_S
        return True

    # ------------------------------------------------------------------ ephemeral keys

    async def put_key(self, digest: str, record: bytes, expires_at: float) -> None:
        """Store ``record`` under ``digest`` until ``expires_at``."""

        def put(db: sqlite3.Connection) -> None:
            now = self._clock()
            with _immediate(db):
                db.execute(
                    "INSERT OR REPLACE INTO keys (digest, record, expires_at) VALUES (?, ?, ?)",
                    (digest, record, expires_at),
                )
                if self._prune_due(now):
                    db.execute("DELETE FROM keys WHERE expires_at <= ?", (now,))
                    db.execute("DELETE FROM usage WHERE expires_at <= ?", (now,))

        await self._call(put)

    async def get_key(self, digest: str, now: float) -> bytes | None:
        """The record under ``digest`` unless unknown or expired at ``now``."""

        def get(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT record FROM keys WHERE digest = ? AND expires_at > ?", (digest, now)
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._call(get)

    # ------------------------------------------------------------------ calls

    async def put_call(self, call: CallRecord) -> None:
        """Record ``call``, replacing any record with its id."""
        await self._call(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO calls (id, owner, worker_id, created_at) "
                "VALUES (?, ?, ?, ?)",
                (call.id, call.owner, call.worker_id, call.created_at),
            )
        )

    async def get_call(self, call_id: str) -> CallRecord | None:
        """The call, unless unknown or its worker's heartbeat has expired by the clock."""

        def get(db: sqlite3.Connection) -> CallRecord | None:
            row = db.execute(
                "SELECT c.owner, c.worker_id, c.created_at FROM calls c "
                "JOIN workers w ON w.id = c.worker_id WHERE c.id = ? AND w.expires_at > ?",
                (call_id, self._clock()),
            ).fetchone()
            if row is None:
                return None
            return CallRecord(id=call_id, owner=row[0], worker_id=row[1], created_at=row[2])

        return await self._call(get)

    async def delete_call(self, call_id: str) -> None:
        """Forget ``call_id``."""
        await self._call(lambda db: db.execute("DELETE FROM calls WHERE id = ?", (call_id,)))

    # ------------------------------------------------------------------ workers

    async def heartbeat(self, worker: WorkerInfo, ttl_s: float) -> bool:
        """Register or refresh ``worker`` until ``ttl_s`` from the store's clock; whether
        it was registered and live until now."""
        info = msgspec.json.encode(worker)

        def beat(db: sqlite3.Connection) -> bool:
            now = self._clock()
            with _immediate(db):
                live = db.execute(
                    "SELECT 1 FROM workers WHERE id = ? AND expires_at > ?", (worker.id, now)
                ).fetchone()
                db.execute(
                    "INSERT OR REPLACE INTO workers (id, info, expires_at) VALUES (?, ?, ?)",
                    (worker.id, info, now + ttl_s),
                )
            return live is not None

        return await self._call(beat)

    async def workers(self, now: float) -> list[WorkerInfo]:
        """Workers whose heartbeat is live at ``now``, ordered by id."""

        def select(db: sqlite3.Connection) -> list[bytes]:
            rows = db.execute(
                "SELECT info FROM workers WHERE expires_at > ? ORDER BY id", (now,)
            ).fetchall()
            return [bytes(row[0]) for row in rows]

        return [msgspec.json.decode(info, type=WorkerInfo) for info in await self._call(select)]

    async def remove_worker(self, worker_id: str) -> None:
        """Drop ``worker_id`` with its calls and session counts."""

        def remove(db: sqlite3.Connection) -> None:
            with _immediate(db):
                _drop_workers(db, [worker_id])

        await self._call(remove)

    async def sweep(self, now: float) -> int:
        """Drop the workers expired at ``now`` with what they left; how many."""

        def sweep(db: sqlite3.Connection) -> int:
            # The write lock first: of several workers sweeping at once, one finds the dead
            # and the others find nothing left.
            with _immediate(db):
                dead = [
                    row[0]
                    for row in db.execute("SELECT id FROM workers WHERE expires_at <= ?", (now,))
                ]
                _drop_workers(db, dead)
            return len(dead)

        return await self._call(sweep)

    # ------------------------------------------------------------------ limits

    async def acquire_session(self, owner: str, worker_id: str, limit: int | None) -> bool:
        """Count a session of ``owner`` on ``worker_id`` unless the live total is ``limit``."""

        def acquire(db: sqlite3.Connection) -> bool:
            with _immediate(db):
                if limit is not None:
                    (count,) = db.execute(
                        _LIVE_SESSIONS, (owner, worker_id, self._clock())
                    ).fetchone()
                    if count >= limit:
                        return False
                db.execute(
                    "INSERT INTO sessions (owner, worker_id, count) VALUES (?, ?, 1) "
                    "ON CONFLICT (owner, worker_id) DO UPDATE SET count = count + 1",
                    (owner, worker_id),
                )
            return True

        return await self._call(acquire)

    async def release_session(self, owner: str, worker_id: str) -> None:
        """One session of ``owner`` on ``worker_id`` fewer, never below zero."""

        def release(db: sqlite3.Connection) -> None:
            with _immediate(db):
                db.execute(
                    "UPDATE sessions SET count = count - 1 WHERE owner = ? AND worker_id = ?",
                    (owner, worker_id),
                )
                db.execute(
                    "DELETE FROM sessions WHERE owner = ? AND worker_id = ? AND count <= 0",
                    (owner, worker_id),
                )

        await self._call(release)

    async def sessions_of(self, owner: str) -> int:
        """``owner``'s sessions on workers live by the store's clock."""

        def count(db: sqlite3.Connection) -> int:
            row = db.execute(
                "SELECT COALESCE(SUM(s.count), 0) FROM sessions s "
                "JOIN workers w ON w.id = s.worker_id WHERE s.owner = ? AND w.expires_at > ?",
                (owner, self._clock()),
            ).fetchone()
            return int(row[0])

        return await self._call(count)

    async def add_usage(
        self, owner: str, kind: UsageKind, amount: int, now: float, window_s: int = 60
    ) -> int:
        """Add ``amount`` to the fixed window ``now`` falls in; the window's total."""
        window_start = int(now // window_s) * window_s

        def add(db: sqlite3.Connection) -> int:
            with _immediate(db):
                rows = db.execute(
                    "INSERT INTO usage (owner, kind, window_s, window_start, total, expires_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, kind, window_s, window_start) "
                    "DO UPDATE SET total = total + excluded.total RETURNING total",
                    (owner, kind, window_s, window_start, amount, window_start + window_s),
                ).fetchall()
            return int(rows[0][0])

        return await self._call(add)


@contextlib.contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    """A ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _create_schema(db: sqlite3.Connection) -> None:
    # executescript would commit the open transaction first; one statement at a time keeps
    # the creation inside BEGIN IMMEDIATE, so processes starting together do not race.
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)


def _drop_workers(db: sqlite3.Connection, worker_ids: list[str]) -> None:
    for worker_id in worker_ids:
        db.execute("DELETE FROM calls WHERE worker_id = ?", (worker_id,))
        db.execute("DELETE FROM sessions WHERE worker_id = ?", (worker_id,))
        db.execute("DELETE FROM workers WHERE id = ?", (worker_id,))

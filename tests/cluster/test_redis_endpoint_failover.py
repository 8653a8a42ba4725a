"""A managed Redis's failover, as ElastiCache and its kind do it: one endpoint name that
moves to the promoted replica, while the old primary, demoted, keeps the connections it had.
The store's next call on such a connection gets ``READONLY`` and is retried on a new
connection, which reaches the new primary: no call fails."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import redis.asyncio

from hark.cluster.redis import RedisStore
from hark.cluster.store import CallRecord
from tests.cluster.test_redis import operations
from tests.redis_server import RedisServer

SECRET = "fleet-secret-of-the-endpoint-tests-0123"
PASSWORD = "endpoint-Pa55word"
# A bound on a hang, not a measure.
SYNC_S = 60.0


class Endpoint:
    """A TCP endpoint that passes each new connection to whichever Redis ``port`` names
    when it opens, as a DNS name that a failover moved does; connections already open stay
    where they were."""

    def __init__(self, port: int) -> None:
        self.port_to = port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Endpoint]:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            self._server.close()
            for task in self._pipes:
                task.cancel()
            await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port_to)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()


async def until_replicated(primary: RedisServer, replica: RedisServer) -> None:
    """Until ``primary``'s writes so far reached ``replica``: the replica has processed the
    primary's replication stream up to the offset the primary had reached. (``WAIT`` would
    not do: it waits for the writes of the connection that sends it, and this one made
    none, so it answered at once, and on a busy machine the promotion below lost the last
    writes the replica had not read yet.)"""
    async with (
        redis.asyncio.Redis(port=primary.port, password=PASSWORD) as source,
        redis.asyncio.Redis(port=replica.port, password=PASSWORD) as copy,
    ):
        written = (await source.info("replication"))["master_repl_offset"]
        deadline = time.monotonic() + SYNC_S
        while True:
            state = await copy.info("replication")
            if state.get("master_link_status") == "up" and state["slave_repl_offset"] >= written:
                return
            assert time.monotonic() < deadline, "the replica never caught up"
            await asyncio.sleep(0.05)


async def test_a_demoted_primary_behind_a_moved_endpoint_fails_no_call(tmp_path: Path) -> None:
    # A replica gets its first copy at once, not after the default 5 s wait for others.
    auth = ["--masterauth", PASSWORD, "--repl-diskless-sync-delay", "0"]
    with RedisServer(tmp_path / "old", password=PASSWORD, args=auth) as old:
        replica_of_old = [*auth, "--replicaof", "127.0.0.1", str(old.port)]
        with RedisServer(tmp_path / "new", password=PASSWORD, args=replica_of_old) as new:
            async with Endpoint(old.port).running() as endpoint:
                store = RedisStore(f"redis://:{PASSWORD}@127.0.0.1:{endpoint.port}/0", SECRET)
                await store.start()
                now = time.time()
                await store.put_call(CallRecord("rtc_1", "owner", "w1", now))
                # Several pooled connections, all on the old primary.
                await asyncio.gather(*(store.add_usage("o", "requests", 1, now) for _ in range(5)))
                await until_replicated(old, new)

                # The failover: the replica is promoted, the endpoint moves to it, the old
                # primary becomes its replica and keeps its clients' connections.
                async with redis.asyncio.Redis(port=new.port, password=PASSWORD) as client:
                    await client.execute_command("REPLICAOF", "NO", "ONE")
                endpoint.port_to = new.port
                async with redis.asyncio.Redis(port=old.port, password=PASSWORD) as client:
                    await client.execute_command("REPLICAOF", "127.0.0.1", str(new.port))

                # Every operation works at once, each write on the new primary.
                for operation in operations(store).values():
                    await operation()
                assert await store.add_usage("o", "requests", 1, now) == 7
                assert (await store.client.execute_command("ROLE"))[0] == b"master"
                await store.aclose()

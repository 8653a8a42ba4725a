"""The Redis cluster store (``--redis-url``): the shared state of a fleet of hosts.

Keys, under a prefix (``hark:``), sealed with the fleet secret (``hark.cluster.seal``: a
record that does not verify is ignored, as if it were not there):

- ``key:<name>``: an ephemeral key's record under the keyed hash of its digest, a hash
  ``{r: encrypted record, e: expires_at}`` expiring at ``expires_at`` (``PEXPIREAT``); ``e``
  is kept so that ``get_key`` refuses a key past the caller's ``now`` even while Redis's own
  clock lags, and the encryption is bound to it;
- ``call:<id>``: a hash ``{owner, worker_id, created_at, mac}``, listed in
  ``worker-calls:<worker>``;
- ``worker:<id>``: the worker's signature (``SIGNATURE_CHARS`` hex digits) then its
  ``WorkerInfo`` as JSON, with the heartbeat's TTL (``PX``), so Redis's clock alone decides
  liveness and hosts whose clocks drift still agree; ``workers`` is the set of ids known,
  where ``sweep`` finds those whose key has expired;
- ``sessions:<owner>``: a hash of open sessions per worker id, with ``worker-owners:<worker>``
  the owners a worker holds counts for (so a dead worker's counts can be removed);
- ``usage:<kind>:<window length>:<window start>:<owner>``: a fixed-window counter
  (``INCRBY`` + ``EXPIRE``).

What must be atomic (counting a session against a limit, moving or dropping a worker's
calls and counts) is a Lua script, run whole by Redis. The scripts compute key names from
what they read, so this store wants one Redis (with replicas or Sentinel if need be), not
Redis Cluster.

A dead Redis fails fast (``CONNECT_TIMEOUT_S``, ``OPERATION_TIMEOUT_S``) with
``ClusterUnavailableError``; the client reconnects by itself on the next call once Redis is
back. A connection still on a master that a failover demoted is dropped at its first write
(Redis answers ``READONLY``) and the call retried once on a new connection: behind Sentinel
(``redis+sentinel://``, ``hark.cluster.redis_url``) a new connection asks a Sentinel where
the master is; a managed Redis's endpoint resolves to its new primary. Nothing here ever
prints the URL's password.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import redis.asyncio
import redis.asyncio.sentinel
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from hark.cluster.redis_url import RedisTarget, parse_redis_url
from hark.cluster.seal import SIGNATURE_CHARS, Seal
from hark.cluster.store import (
    CallRecord,
    ClusterStore,
    ClusterUnavailableError,
    UsageKind,
    WorkerInfo,
)

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 1.0
OPERATION_TIMEOUT_S = 2.0
DEFAULT_PREFIX = "hark:"

# Whatever Redis answers with an error (refused, down, read-only, out of memory, a wrong
# password, protected mode) leaves the shared state out of reach the same way.
_UNAVAILABLE = (redis.exceptions.RedisError, OSError)

# ARGV: prefix, call id, owner, worker id, created_at, mac
_PUT_CALL = """
local p, id = ARGV[1], ARGV[2]
local key = p .. 'call:' .. id
local old = redis.call('HGET', key, 'worker_id')
if old then redis.call('SREM', p .. 'worker-calls:' .. old, id) end
redis.call('HSET', key, 'owner', ARGV[3], 'worker_id', ARGV[4], 'created_at', ARGV[5],
  'mac', ARGV[6])
redis.call('SADD', p .. 'worker-calls:' .. ARGV[4], id)
"""

# ARGV: prefix, call id. Returns {owner, worker_id, created_at, mac}, or nil when the call
# is unknown or its worker's heartbeat has expired.
_GET_CALL = """
local p = ARGV[1]
local call = redis.call('HMGET', p .. 'call:' .. ARGV[2], 'owner', 'worker_id', 'created_at',
  'mac')
if not call[2] then return nil end
if redis.call('EXISTS', p .. 'worker:' .. call[2]) == 0 then return nil end
return call
"""

# ARGV: prefix, call id
_DELETE_CALL = """
local p, id = ARGV[1], ARGV[2]
local key = p .. 'call:' .. id
local worker = redis.call('HGET', key, 'worker_id')
if worker then redis.call('SREM', p .. 'worker-calls:' .. worker, id) end
redis.call('DEL', key)
"""

# ARGV: prefix, worker id, '1' to drop only a worker whose heartbeat has expired. Returns 1
# if this call took the worker out of the registry (so concurrent sweeps count it once).
_DROP_WORKER = """
local p, id = ARGV[1], ARGV[2]
if ARGV[3] == '1' and redis.call('EXISTS', p .. 'worker:' .. id) == 1 then return 0 end
local calls = p .. 'worker-calls:' .. id
for _, call in ipairs(redis.call('SMEMBERS', calls)) do
  local key = p .. 'call:' .. call
  if redis.call('HGET', key, 'worker_id') == id then redis.call('DEL', key) end
end
local owners = p .. 'worker-owners:' .. id
for _, owner in ipairs(redis.call('SMEMBERS', owners)) do
  redis.call('HDEL', p .. 'sessions:' .. owner, id)
end
redis.call('DEL', calls, owners, p .. 'worker:' .. id)
return redis.call('SREM', p .. 'workers', id)
"""

# Sums an owner's sessions on live workers (and on ARGV[3], the asking worker, which is
# alive whether or not its heartbeat has reached Redis yet).
_LIVE_SESSIONS = """
local function live_sessions(p, owner, asking)
  local counts = redis.call('HGETALL', p .. 'sessions:' .. owner)
  local total = 0
  for i = 1, #counts, 2 do
    local worker = counts[i]
    if worker == asking or redis.call('EXISTS', p .. 'worker:' .. worker) == 1 then
      total = total + tonumber(counts[i + 1])
    end
  end
  return total
end
"""

# ARGV: prefix, owner, worker id, limit ('' for none). Returns 1 if counted.
_ACQUIRE_SESSION = (
    _LIVE_SESSIONS
    + """
local p, owner, id = ARGV[1], ARGV[2], ARGV[3]
if ARGV[4] ~= '' and live_sessions(p, owner, id) >= tonumber(ARGV[4]) then return 0 end
redis.call('HINCRBY', p .. 'sessions:' .. owner, id, 1)
redis.call('SADD', p .. 'worker-owners:' .. id, owner)
return 1
"""
)

# ARGV: prefix, owner
_SESSIONS_OF = _LIVE_SESSIONS + "return live_sessions(ARGV[1], ARGV[2], false)"

# ARGV: prefix, owner, worker id
_RELEASE_SESSION = """
local p, owner, id = ARGV[1], ARGV[2], ARGV[3]
local key = p .. 'sessions:' .. owner
if tonumber(redis.call('HGET', key, id) or '0') > 1 then
  redis.call('HINCRBY', key, id, -1)
else
  redis.call('HDEL', key, id)
  redis.call('SREM', p .. 'worker-owners:' .. id, owner)
end
"""


class RedisStore(ClusterStore):
    """The cluster store in the Redis at ``url`` (any shape of ``hark.cluster.redis_url``:
    ``redis://[[user]:password@]host:port/db``, ``rediss://`` for TLS, ``unix:///path?db=N``,
    ``redis+sentinel://host:26379,host2:26379/mymaster``), every key under ``prefix``, its
    records sealed with ``fleet_secret`` (never logged)."""

    def __init__(self, url: str, fleet_secret: str, *, prefix: str = DEFAULT_PREFIX) -> None:
        target = parse_redis_url(url)
        self._description, self._secrets = target.description, target.secrets
        if not fleet_secret:
            raise ValueError("the Redis store needs the fleet secret (HARK_FLEET_SECRET)")
        self._seal = Seal(fleet_secret)
        self._prefix = prefix
        try:
            self._redis, self._sentinel = _client(target)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad Redis URL {self._description}: {self._scrub(exc)}") from None
        self._put_call = self._redis.register_script(_PUT_CALL)
        self._get_call = self._redis.register_script(_GET_CALL)
        self._delete_call = self._redis.register_script(_DELETE_CALL)
        self._drop_worker = self._redis.register_script(_DROP_WORKER)
        self._acquire = self._redis.register_script(_ACQUIRE_SESSION)
        self._release = self._redis.register_script(_RELEASE_SESSION)
        self._sessions_of = self._redis.register_script(_SESSIONS_OF)
        self._closed = False

    @property
    def description(self) -> str:
        """The URL without its password or query: ``redis://host:6379/0``."""
        return self._description

    @property
    def client(self) -> redis.asyncio.Redis:
        """The underlying client (for tests and diagnostics)."""
        return self._redis

    async def start(self) -> None:
        """Check that Redis answers."""
        async with self._errors():
            await self._redis.ping()

    async def aclose(self) -> None:
        """Close the client's connections; idempotent."""
        if not self._closed:
            self._closed = True
            await self._redis.aclose()
            if self._sentinel is not None:
                await self._sentinel.aclose()

    # ------------------------------------------------------------------ plumbing

    @contextlib.asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        try:
            yield
        except redis.asyncio.sentinel.MasterNotFoundError:
            # redis-py's message lists every Sentinel client whole; this says what it means.
            raise ClusterUnavailableError(
                f"Redis at {self._description} is unavailable: no Sentinel answered with a "
                "master that is up (the Sentinels are unreachable, or a failover is under way)"
            ) from None
        except _UNAVAILABLE as exc:
            # Not chained: the cause is summarised in the message, already scrubbed.
            raise ClusterUnavailableError(
                f"Redis at {self._description} is unavailable: {self._scrub(exc)}"
            ) from None

    def _scrub(self, exc: BaseException) -> str:
        text = f"{type(exc).__name__}: {exc}"
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _key(self, *parts: str) -> str:
        return self._prefix + ":".join(parts)

    async def _script(self, script: Any, *args: str | int | float) -> Any:
        return await script(args=[self._prefix, *args])

    # ------------------------------------------------------------------ ephemeral keys

    async def put_key(self, digest: str, record: bytes, expires_at: float) -> None:
        """Store ``record`` (encrypted) under the keyed hash of ``digest``, expiring at
        ``expires_at``."""
        name = self._seal.name(digest)
        key = self._key("key", name)
        expires = repr(expires_at)
        sealed = self._seal.encrypt(record, "key", name, expires)
        async with self._errors(), self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"r": sealed, "e": expires})
            pipe.pexpireat(key, int(expires_at * 1000))
            await pipe.execute()

    async def get_key(self, digest: str, now: float) -> bytes | None:
        """The record under ``digest`` unless unknown, expired at ``now``, or not sealed
        by this fleet."""
        name = self._seal.name(digest)
        async with self._errors():
            sealed, expires_at = await self._redis.hmget(self._key("key", name), ["r", "e"])
        if sealed is None or expires_at is None:
            return None
        expires = _text(expires_at)
        try:
            if float(expires) <= now:
                return None
        except ValueError:
            return None
        record = self._seal.decrypt(_bytes(sealed), "key", name, expires)
        if record is None:
            logger.warning("ignored a key record in Redis that this fleet did not write")
        return record

    # ------------------------------------------------------------------ calls

    async def put_call(self, call: CallRecord) -> None:
        """Record ``call``, replacing (and moving) any record with its id."""
        created_at = repr(call.created_at)
        mac = self._seal.sign("call", call.id, call.owner, call.worker_id, created_at)
        async with self._errors():
            await self._script(self._put_call, call.id, call.owner, call.worker_id, created_at, mac)

    async def get_call(self, call_id: str) -> CallRecord | None:
        """The call, unless unknown or its worker's heartbeat key has expired."""
        async with self._errors():
            found = await self._script(self._get_call, call_id)
        if found is None:
            return None
        owner, worker_id, created_at, mac = found
        if None in (owner, created_at, mac) or not self._seal.verify(
            mac, "call", call_id, owner, worker_id, created_at
        ):
            logger.warning("ignored a call record in Redis that this fleet did not write")
            return None
        return CallRecord(
            id=call_id,
            owner=owner.decode(),
            worker_id=worker_id.decode(),
            created_at=float(created_at),
        )

    async def delete_call(self, call_id: str) -> None:
        """Forget ``call_id``."""
        async with self._errors():
            await self._script(self._delete_call, call_id)

    # ------------------------------------------------------------------ workers

    async def heartbeat(self, worker: WorkerInfo, ttl_s: float) -> bool:
        """Write ``worker``, signed, with a TTL of ``ttl_s`` (Redis's clock) and list its id;
        whether its entry was there until now (in the same round trip)."""
        info = msgspec.json.encode(worker)
        signature = self._seal.sign("worker", worker.id, info).encode("ascii")
        key = self._key("worker", worker.id)
        async with self._errors(), self._redis.pipeline(transaction=True) as pipe:
            pipe.exists(key)
            pipe.set(key, signature + info, px=max(1, round(ttl_s * 1000)))
            pipe.sadd(self._key("workers"), worker.id)
            existed, _, _ = await pipe.execute()
        return bool(existed)

    async def workers(self, now: float) -> list[WorkerInfo]:
        """Workers whose heartbeat key is live and signed by this fleet, ordered by id.

        Liveness is Redis's TTL, by Redis's clock; ``now`` is not needed to decide it.
        """
        async with self._errors():
            ids = sorted(map(_text, await self._redis.smembers(self._key("workers"))))
            if not ids:
                return []
            infos = await self._redis.mget([self._key("worker", i) for i in ids])
        found = []
        for worker_id, value in zip(ids, infos, strict=True):
            if value is None:
                continue
            worker = self._open_worker(worker_id, _bytes(value))
            if worker is None:
                logger.warning("ignored a worker entry in Redis that this fleet did not write")
            else:
                found.append(worker)
        return found

    def _open_worker(self, worker_id: str, value: bytes) -> WorkerInfo | None:
        """The registry entry ``value`` of ``worker_id`` if this fleet signed it."""
        signature, info = value[:SIGNATURE_CHARS], value[SIGNATURE_CHARS:]
        if not self._seal.verify(signature, "worker", worker_id, info):
            return None
        try:
            worker = msgspec.json.decode(info, type=WorkerInfo)
        except msgspec.DecodeError:
            return None
        return worker if worker.id == worker_id else None

    async def remove_worker(self, worker_id: str) -> None:
        """Drop ``worker_id`` with its calls and session counts."""
        async with self._errors():
            await self._script(self._drop_worker, worker_id, "0")

    async def sweep(self, now: float) -> int:
        """Drop the listed workers whose heartbeat key has expired; how many."""
        async with self._errors():
            ids = list(map(_text, await self._redis.smembers(self._key("workers"))))
            if not ids:
                return 0
            infos = await self._redis.mget([self._key("worker", i) for i in ids])
            swept = 0
            for worker_id, info in zip(ids, infos, strict=True):
                if info is None:
                    # The script checks again: the worker may have beaten in between.
                    swept += int(await self._script(self._drop_worker, worker_id, "1"))
        return swept

    # ------------------------------------------------------------------ limits

    async def acquire_session(self, owner: str, worker_id: str, limit: int | None) -> bool:
        """Count a session of ``owner`` on ``worker_id`` unless the live total is ``limit``."""
        async with self._errors():
            counted = await self._script(
                self._acquire, owner, worker_id, "" if limit is None else str(limit)
            )
        return bool(counted)

    async def release_session(self, owner: str, worker_id: str) -> None:
        """One session of ``owner`` on ``worker_id`` fewer, never below zero."""
        async with self._errors():
            await self._script(self._release, owner, worker_id)

    async def sessions_of(self, owner: str) -> int:
        """``owner``'s sessions on workers whose heartbeat key is live."""
        async with self._errors():
            return int(await self._script(self._sessions_of, owner))

    async def add_usage(
        self, owner: str, kind: UsageKind, amount: int, now: float, window_s: int = 60
    ) -> int:
        """Add ``amount`` to the fixed window ``now`` falls in; the window's total."""
        window_start = int(now // window_s) * window_s
        key = self._key("usage", kind, str(window_s), str(window_start), owner)
        async with self._errors(), self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(key, amount)
            # The window is in the key's name, so the TTL only frees memory; twice the
            # window leaves room for clocks that disagree with Redis's.
            pipe.expire(key, 2 * window_s)
            total, _ = await pipe.execute()
        return int(total)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _client(
    target: RedisTarget,
) -> tuple[redis.asyncio.Redis, redis.asyncio.sentinel.Sentinel | None]:
    """A client of the Redis ``target`` names, with the Sentinel client that finds its master
    (None for a single Redis). Nothing is connected yet."""
    # One retry, on a connection that died with a restarted Redis, or that a failover left on
    # a demoted master (READONLY: the write did nothing; behind Sentinel redis-py turns it
    # into a connection error itself): the connection is replaced at once, on the new master
    # (the one Sentinel names, or the one a managed Redis's name now resolves to), instead of
    # failing the caller. A Redis that does not answer is not waited for twice.
    retry = Retry(
        NoBackoff(),
        1,
        supported_errors=(redis.exceptions.ConnectionError, redis.exceptions.ReadOnlyError),
    )
    common: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": OPERATION_TIMEOUT_S,
        "retry": retry,
    }
    connection = {**target.connection, **common, "decode_responses": False}
    if not target.uses_sentinel:
        path = connection.pop("path", None)
        if path is not None:
            return redis.asyncio.Redis(unix_socket_path=path, **connection), None
        return redis.asyncio.Redis(ssl=target.tls, **connection), None
    sentinel = redis.asyncio.sentinel.Sentinel(
        list(target.sentinels),
        sentinel_kwargs={**target.sentinel_connection, **common},
        ssl=target.tls,
        **connection,
    )
    return sentinel.master_for(target.master), sentinel

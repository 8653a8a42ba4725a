"""The cluster store: the state any worker may need about a request another worker handled.

One interface, two backends: ``EmbeddedStore`` (SQLite in WAL mode in a run directory,
shared by the ``--workers`` of one machine; nothing to install) and ``RedisStore``
(``--redis-url``, shared by a fleet of hosts). What lives here:

- ephemeral keys, stored under the SHA-256 digest of the key (never the key itself), with
  their expiry: valid on every worker until they expire, refused everywhere after (Redis,
  shared over the network, keeps them sealed with the fleet secret: ``hark.cluster.seal``);
- calls: call id → owner (a key's stable hash) and the worker that owns the call's media;
- the worker registry: what each worker advertises (internal URL, media address, zone) and
  its load, refreshed by heartbeats that expire;
- per-key limits counted across the fleet: concurrent sessions (counted per worker, so a
  dead worker's sessions stop counting when its heartbeat expires) and usage per minute.

Every method raises ``ClusterUnavailableError`` when the backend cannot be reached; callers
turn that into a clear error for what needed shared state, and running sessions go on.
Times are Unix seconds (``time.time()``); the backend keeps expiry itself (Redis TTLs,
``expires_at`` columns), so no caller has to clean up after a key or a heartbeat.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

UsageKind = Literal["requests", "tokens"]


class ClusterUnavailableError(RuntimeError):
    """The cluster store cannot be reached (Redis down, say); the message says which."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as the registry shows it to the others."""

    id: str
    # How other workers reach this one over HTTP (``--advertise-url``), e.g. http://10.0.0.5:8000
    url: str
    # ``host:port`` of the worker's UDP media port as clients reach it ("" when it has none).
    media_address: str = ""
    zone: str = ""
    # Load: open sessions (WebSocket and WebRTC), process CPU (share of one core, 0..N),
    # and work queued for the worker's models.
    sessions: int = 0
    cpu: float = 0.0
    queue_depth: int = 0
    # Calls this worker ever opened, as of the same moment as ``sessions``: placement reads
    # which of the calls it placed there the session count includes.
    calls_opened: int = 0
    # A draining worker is listed (its calls still live there) but takes nothing new.
    draining: bool = False
    # False until its engines are loaded.
    ready: bool = True
    started_at: float = 0.0
    heartbeat_at: float = 0.0


@dataclass(frozen=True, slots=True)
class CallRecord:
    """Where a call lives: which worker owns its media and session, and whose it is."""

    id: str
    owner: str
    worker_id: str
    created_at: float


class ClusterStore(ABC):
    """Shared state of one hark service; see the module docstring for what lives here."""

    @property
    @abstractmethod
    def description(self) -> str:
        """What this store is, for logs (never a password: ``redis://host:6379/0``)."""

    @abstractmethod
    async def start(self) -> None:
        """Connect or open; raises ``ClusterUnavailableError`` if that cannot be done."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections and files; idempotent."""

    # ------------------------------------------------------------------ ephemeral keys

    @abstractmethod
    async def put_key(self, digest: str, record: bytes, expires_at: float) -> None:
        """Store a minted key's record under ``digest`` (hex SHA-256 of the key) until
        ``expires_at``."""

    @abstractmethod
    async def get_key(self, digest: str, now: float) -> bytes | None:
        """The record stored under ``digest``, or None when unknown or expired at ``now``."""

    # ------------------------------------------------------------------ calls

    @abstractmethod
    async def put_call(self, call: CallRecord) -> None:
        """Record a call (replacing any record with the same id)."""

    @abstractmethod
    async def get_call(self, call_id: str) -> CallRecord | None:
        """The call's record, or None when unknown, ended, or its worker's heartbeat expired."""

    @abstractmethod
    async def delete_call(self, call_id: str) -> None:
        """Forget a call (it ended); unknown ids are ignored."""

    # ------------------------------------------------------------------ workers

    @abstractmethod
    async def heartbeat(self, worker: WorkerInfo, ttl_s: float) -> bool:
        """Register or refresh ``worker``; it disappears ``ttl_s`` after its last heartbeat.
        True if it was registered and live until now; False on its first heartbeat and
        whenever its entry had gone (expired, swept, or lost with the store's data): its
        calls may have gone with it, and the worker writes them again."""

    @abstractmethod
    async def workers(self, now: float) -> list[WorkerInfo]:
        """Every worker whose heartbeat is live at ``now`` (draining ones included)."""

    @abstractmethod
    async def remove_worker(self, worker_id: str) -> None:
        """Take a worker out at once (a clean stop), with its calls and session counts."""

    @abstractmethod
    async def sweep(self, now: float) -> int:
        """Remove what belongs to workers whose heartbeat expired before ``now`` (their
        calls, their session counts); returns how many workers were swept. Safe to run on
        every worker at once."""

    # ------------------------------------------------------------------ limits

    @abstractmethod
    async def acquire_session(self, owner: str, worker_id: str, limit: int | None) -> bool:
        """Count one more open session for ``owner`` on ``worker_id`` unless the fleet-wide
        count of live workers' sessions is already ``limit`` (None: no limit); True if
        counted. Atomic across workers."""

    @abstractmethod
    async def release_session(self, owner: str, worker_id: str) -> None:
        """Count one session of ``owner`` on ``worker_id`` fewer (never below zero)."""

    @abstractmethod
    async def sessions_of(self, owner: str) -> int:
        """``owner``'s open sessions across the live workers."""

    @abstractmethod
    async def add_usage(
        self, owner: str, kind: UsageKind, amount: int, now: float, window_s: int = 60
    ) -> int:
        """Add ``amount`` to ``owner``'s ``kind`` in the fixed window of ``window_s`` seconds
        that ``now`` falls in; returns the window's total after adding (``amount=0`` reads)."""

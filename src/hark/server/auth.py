"""Who may use the server: API keys, ephemeral keys (``ek_…``), metrics keys, and the bind
policy.

Keys are compared in constant time (SHA-256 digests, against every configured key) and are
never logged. A key's *owner* is a stable, non-reversible identity of the real API key behind
it (the ephemeral keys it minted share it), so that later features can tell who may attach
to what without ever keeping the key itself around. Ephemeral keys live in the cluster store
under their digest, so every worker of the service accepts them until they expire.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from hark.cluster.store import ClusterStore
from hark.config import is_loopback_host
from hark.protocol.client_secrets import MAX_EXPIRY_SECONDS, MIN_EXPIRY_SECONDS
from hark.protocol.session_config import SessionConfig

logger = logging.getLogger(__name__)

EPHEMERAL_PREFIX = "ek_"
# An API keys entry ``metrics:KEY`` admits KEY to ``/metrics`` and nothing else: the key a
# Prometheus holds opens no session, mints no key and reaches no call.
METRICS_KEY_PREFIX = "metrics:"
SUBPROTOCOL_KEY_PREFIX = "openai-insecure-api-key."
# Ephemeral keys a worker remembers having seen (each a few hundred bytes).
MAX_CACHED_KEYS = 10_000


class InsecureBindError(RuntimeError):
    """No API keys are configured and the server would listen beyond loopback."""


def split_keys(api_keys: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The configured entries as (API keys, metrics keys): an entry ``metrics:KEY`` is the
    metrics key KEY, any other entry an API key."""
    full: list[str] = []
    metrics: list[str] = []
    for entry in api_keys:
        if entry.startswith(METRICS_KEY_PREFIX):
            metrics.append(entry.removeprefix(METRICS_KEY_PREFIX))
        else:
            full.append(entry)
    return tuple(full), tuple(k for k in metrics if k)


def check_bind_policy(host: str, api_keys: Iterable[str]) -> None:
    """Refuse an open server off loopback; warn loudly about one on loopback.

    Raises ``InsecureBindError`` when no API keys are configured (metrics keys do not
    count: they open nothing else) and ``host`` is not loopback.
    """
    if split_keys(api_keys)[0]:
        return
    if not is_loopback_host(host):
        raise InsecureBindError(
            f"refusing to listen on {host!r} without API keys: anyone who can reach it could "
            "use it. Set HARK_API_KEYS (comma-separated) or api_keys in the --config file, "
            "or bind to 127.0.0.1."
        )
    logger.warning(
        "NO API KEYS CONFIGURED: any key is accepted. This is only safe because the server "
        "listens on loopback (%s); set HARK_API_KEYS before exposing it.",
        host,
    )


def _digest(key: str) -> bytes:
    # surrogatepass: every str encodes, whatever a client put in a header.
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def owner_of(key: str) -> str:
    """The stable identity of a real API key: a short hash, safe to store and log."""
    tagged = hashlib.sha256(b"hark-key-owner\0" + key.encode("utf-8", "surrogatepass"))
    return "key_" + tagged.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class EphemeralKey:
    """A minted ``ek_…`` key's record (the key itself is not kept, only its digest)."""

    digest: bytes = field(repr=False)
    owner: str
    session: SessionConfig
    session_id: str
    created_at: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: the owning real key, and the ephemeral key used if any.
    ``metrics_only``: the key is a metrics key, good for ``/metrics`` alone."""

    owner: str
    ephemeral: EphemeralKey | None = None
    metrics_only: bool = False


class _StoredKey(msgspec.Struct, frozen=True):
    """An ephemeral key's record as the cluster store keeps it (no key, no digest)."""

    owner: str
    session: SessionConfig
    session_id: str
    created_at: int
    expires_at: int


_encode_key = msgspec.json.Encoder().encode
_decode_key = msgspec.json.Decoder(_StoredKey).decode


def _record(digest: bytes, stored: _StoredKey) -> EphemeralKey:
    """The key with ``digest``, as the store keeps it (every field but the digest)."""
    return EphemeralKey(digest, **msgspec.structs.asdict(stored))


class Authenticator:
    """Checks API keys, and mints and checks ephemeral keys kept in the cluster store.

    A key minted on one worker is valid on every worker of the store until it expires. Each
    worker remembers the keys it has seen (up to ``MAX_CACHED_KEYS``): a key cannot change
    once minted, so the memory only saves store round trips and lets a key already in use
    here go on working while the store is unreachable; expiry is checked on every use.
    With no ``api_keys`` every key is accepted (the caller enforces ``check_bind_policy``),
    except ``ek_…`` keys, which must always be live minted keys. Entries ``metrics:KEY``
    are metrics keys (``split_keys``): KEY authenticates as a ``metrics_only`` principal,
    and they alone leave the server open.
    """

    def __init__(
        self,
        api_keys: Iterable[str],
        store: ClusterStore,
        *,
        clock: Callable[[], float] = time.time,
    ):
        full, metrics = split_keys(api_keys)
        self._digests = tuple(_digest(k) for k in full)
        self._metrics_digests = tuple(_digest(k) for k in metrics)
        self.store = store
        self._seen: OrderedDict[bytes, EphemeralKey] = OrderedDict()
        self.clock = clock
        # Keys minted by this worker since it started (an operator's figure, and tests').
        self.minted = 0

    @property
    def open(self) -> bool:
        """True when no keys are configured and any real key is accepted."""
        return not self._digests

    async def authenticate(self, key: str | None) -> Principal | None:
        """The principal behind ``key``, or None if it is missing, wrong, unknown or expired.

        Raises ``ClusterUnavailableError`` when an ephemeral key must be looked up and the
        cluster store cannot be reached.
        """
        if not key:
            return None
        digest = _digest(key)
        if key.startswith(EPHEMERAL_PREFIX):
            record = await self._ephemeral(digest)
            return None if record is None else Principal(owner=record.owner, ephemeral=record)
        if self.open:
            return Principal(owner=owner_of(key))
        # Compare with every key, without stopping early, so timing says nothing.
        matched = metrics = False
        for known in self._digests:
            matched |= hmac.compare_digest(digest, known)
        for known in self._metrics_digests:
            metrics |= hmac.compare_digest(digest, known)
        if matched:
            return Principal(owner=owner_of(key))
        return Principal(owner=owner_of(key), metrics_only=True) if metrics else None

    async def _ephemeral(self, digest: bytes) -> EphemeralKey | None:
        now = self.clock()
        record = self._seen.get(digest)
        if record is None:
            raw = await self.store.get_key(digest.hex(), now)
            if raw is None:
                return None
            record = _record(digest, _decode_key(raw))
            self._remember(record)
        if record.expires_at <= now:
            self._seen.pop(digest, None)
            return None
        return record

    def _remember(self, record: EphemeralKey) -> None:
        self._seen[record.digest] = record
        while len(self._seen) > MAX_CACHED_KEYS:
            self._seen.popitem(last=False)

    async def mint(
        self, owner: Principal, session: SessionConfig, session_id: str, seconds: int
    ) -> tuple[str, EphemeralKey]:
        """Create an ephemeral key for ``owner`` valid for ``seconds``; returns (value, record).

        Raises ``PermissionError`` when ``owner`` itself authenticated with an ephemeral key,
        and ``ClusterUnavailableError`` when the key cannot be stored.
        """
        if owner.ephemeral is not None:
            raise PermissionError("an ephemeral key cannot mint ephemeral keys")
        if not MIN_EXPIRY_SECONDS <= seconds <= MAX_EXPIRY_SECONDS:
            raise ValueError(f"seconds must be {MIN_EXPIRY_SECONDS}..{MAX_EXPIRY_SECONDS}")
        now = int(self.clock())
        value = EPHEMERAL_PREFIX + secrets.token_urlsafe(32)
        stored = _StoredKey(
            owner=owner.owner,
            session=session,
            session_id=session_id,
            created_at=now,
            expires_at=now + seconds,
        )
        record = _record(_digest(value), stored)
        await self.store.put_key(record.digest.hex(), _encode_key(stored), record.expires_at)
        self._remember(record)
        self.minted += 1
        logger.info(
            "minted an ephemeral key for %s (session %s), expires at %d",
            owner.owner,
            session_id,
            record.expires_at,
        )
        return value, record


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header, if there is one."""
    value = headers.get("Authorization")
    if value is None:
        return None
    scheme, _, key = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def subprotocol_key(headers: Mapping[str, str]) -> str | None:
    """The key browsers send as the WebSocket subprotocol ``openai-insecure-api-key.KEY``."""
    for protocol in offered_subprotocols(headers):
        if protocol.startswith(SUBPROTOCOL_KEY_PREFIX):
            return protocol[len(SUBPROTOCOL_KEY_PREFIX) :] or None
    return None


def offered_subprotocols(headers: Mapping[str, str]) -> list[str]:
    """The WebSocket subprotocols a client offered, in order."""
    raw = headers.get("Sec-WebSocket-Protocol", "")
    return [p.strip() for p in raw.split(",") if p.strip()]

"""hark as one service over many processes and hosts: shared state, the worker registry,
routing between workers, placement and drain."""

from __future__ import annotations

from pathlib import Path

from hark.cluster.embedded import EmbeddedStore
from hark.cluster.redis import RedisStore
from hark.cluster.redis_url import with_password
from hark.cluster.store import ClusterStore


def open_store(
    redis_url: str | None,
    run_dir: Path | None,
    fleet_secret: str | None = None,
    *,
    redis_password: str | None = None,
) -> ClusterStore:
    """The cluster store to use: Redis at ``redis_url`` when one is given (a fleet), its
    records sealed with ``fleet_secret``, logged in with ``redis_password`` when the URL
    holds none, else the embedded store in ``run_dir`` (the workers of one machine, in a
    directory only this user can open: the file system is its trust, and it needs no
    secret). Nothing is connected until ``start()``; a malformed Redis URL, one without a
    fleet secret, or a password given twice, raises ``ValueError`` here."""
    if redis_url:
        if not fleet_secret:
            raise ValueError("a Redis store needs the fleet secret (HARK_FLEET_SECRET)")
        return RedisStore(with_password(redis_url, redis_password), fleet_secret)
    if run_dir is None:
        raise ValueError("the embedded cluster store needs a run directory")
    return EmbeddedStore(run_dir)

"""hark as one service over many processes and hosts: shared state, the worker registry,
routing between workers, placement and drain."""

from __future__ import annotations

from pathlib import Path

from hark.cluster.embedded import EmbeddedStore
from hark.cluster.redis import RedisStore
from hark.cluster.store import ClusterStore


def open_store(redis_url: str | None, run_dir: Path | None) -> ClusterStore:
    """The cluster store to use: Redis at ``redis_url`` when one is given (a fleet), else
    the embedded store in ``run_dir`` (the workers of one machine). Nothing is connected
    until ``start()``; a malformed Redis URL raises ``ValueError`` here."""
    if redis_url:
        return RedisStore(redis_url)
    if run_dir is None:
        raise ValueError("the embedded cluster store needs a run directory")
    return EmbeddedStore(run_dir)

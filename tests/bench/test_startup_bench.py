"""``hark bench startup`` times real starts, and leaves nothing behind in the Redis it used."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from hark.bench import startup
from hark.bench.report import BenchError
from hark.bench.startup import default_hark, summary, until_exit, until_forwarded
from hark.cli import build_parser
from hark.cluster.redis import RedisStore
from tests.redis_server import running_redis


def env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("HARK_")}


def test_a_relay_is_timed_until_it_forwards_and_its_worker_and_flows_are_removed(
    tmp_path: Path,
) -> None:
    with running_redis(tmp_path) as server:
        timing = until_forwarded(default_hark(), env(), server.url)

        async def keys() -> list[bytes]:
            # Any secret: the keys are listed, not read.
            store = RedisStore(server.url, "any-secret-for-listing-keys")
            try:
                return [key async for key in store.client.scan_iter()]
            finally:
                await store.aclose()

        leftovers = asyncio.run(keys())
    assert timing.wall_s > 0 and timing.cpu_s > 0
    # The registry's set of worker ids may stay, empty; no worker and no flow does.
    assert [key for key in leftovers if b"worker:" in key or b"relay-flow:" in key] == []


def test_a_command_that_fails_fails_the_bench() -> None:
    assert until_exit([*default_hark(), "--help"], env()).cpu_s > 0
    with pytest.raises(BenchError, match="exited with 2"):
        until_exit([*default_hark(), "no-such-command"], env())


def test_the_summary_and_the_command_line() -> None:
    figures = {"median_s": 0.5, "min_s": 0.4, "max_s": 0.9, "cpu_median_s": 0.3}
    report = {
        "hark": "hark",
        "runs": 3,
        "cpus": 2,
        "load_average": {"before": 0.5, "after": 0.7},
        "relay": "left out: no --redis-url",
        "commands": {"hark --help": figures},
    }
    text = summary(report)
    assert "hark --help" in text and "0.50 (0.40–0.90), CPU 0.30  until it exits" in text
    assert "hark relay: left out" in text
    args = build_parser().parse_args(["bench", "startup", "--runs", "2", "--hark", "env hark"])
    assert (args.runs, args.hark, args.handler) == (2, "env hark", startup.command)

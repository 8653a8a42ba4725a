"""Starting ``hark relay`` from its settings as plain values: ``hark.config.relay`` reads
and checks the options, this module turns them into the relay's config and supervises its
forwarding processes."""

from __future__ import annotations

import sys

from hark.cluster.redis import RedisStore
from hark.edge.flows import parse_address
from hark.edge.relay import RelayConfig
from hark.edge.supervisor import supervise


def run(
    *,
    listen: str,
    internal: str,
    redis_url: str,
    fleet_secret: str,
    workers: int,
    metrics_listen: str | None,
    flow_idle: float,
    source_flow_rate: float,
    source_flow_burst: int,
) -> int:
    """Run the relay until SIGTERM or SIGINT; the exit status (2, with a line on stderr,
    when an address or the Redis URL is malformed: nothing has started then)."""
    try:
        config = RelayConfig(
            listen=parse_address(listen),
            internal=parse_address(internal),
            fleet_secret=fleet_secret,
            idle_s=flow_idle,
            source_flows_per_s=source_flow_rate,
            source_flow_burst=source_flow_burst,
        )
        metrics_address = parse_address(metrics_listen) if metrics_listen else None
        # A malformed URL fails here, before any process starts.
        RedisStore(redis_url, fleet_secret)
    except ValueError as exc:
        print(f"hark relay: {exc}", file=sys.stderr)
        return 2
    return supervise(config, redis_url, workers, metrics_address)

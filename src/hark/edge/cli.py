"""``hark relay``: the fleet's one public UDP port for WebRTC media.

Options also come from the environment: ``HARK_REDIS_URL``, ``HARK_FLEET_SECRET`` (prefer
it to ``--fleet-secret``, which other users of the machine can read in the process list).
With ``--workers N`` the relay runs N forwarding processes on the one port
(``SO_REUSEPORT``: the kernel spreads clients over them by address), a process that dies is
started again, and the parent serves the sum of their counters on ``--metrics-listen``.
"""

from __future__ import annotations

import argparse
import os
import sys

from hark.edge.flow_admission import SOURCE_FLOW_BURST, SOURCE_FLOWS_PER_S
from hark.edge.route_hint import MIN_SECRET_BYTES
from hark.observability.logging import configure_logging

DEFAULT_LISTEN = "0.0.0.0:3478"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """The options of ``hark relay``."""
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"the public UDP address clients send media to (default {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--internal",
        default="0.0.0.0:0",
        metavar="HOST:PORT",
        help="where to send to workers from (default: any address, a free port per process)",
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help="the fleet's Redis: the worker registry and the mirrored flow table "
        "(default $HARK_REDIS_URL)",
    )
    parser.add_argument(
        "--fleet-secret",
        default=None,
        metavar="SECRET",
        help="the secret the workers sign their routing hints with (default "
        "$HARK_FLEET_SECRET, which is better: arguments are visible to other users)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N", help="forwarding processes (default 1)"
    )
    parser.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics over HTTP at /metrics (default: none)",
    )
    parser.add_argument(
        "--flow-idle",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="forget a flow after this long without a datagram from its client (default 30)",
    )
    parser.add_argument(
        "--source-flow-rate",
        type=float,
        default=SOURCE_FLOWS_PER_S,
        metavar="PER_SECOND",
        help=f"new flows one source IP may make per second (default {SOURCE_FLOWS_PER_S:g})",
    )
    parser.add_argument(
        "--source-flow-burst",
        type=int,
        default=SOURCE_FLOW_BURST,
        metavar="N",
        help=f"new flows one source IP may make at once (default {SOURCE_FLOW_BURST})",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )


def command(options: dict[str, object]) -> int:
    """Run ``hark relay`` until SIGTERM or SIGINT; the exit status."""
    # What forwarding needs (NumPy, redis) is imported only now, by this command alone: the
    # parser, ``hark relay --help`` and ``hark``'s other commands go without it.
    from hark.cluster.redis import RedisStore
    from hark.cluster.redis_url import with_password
    from hark.edge.flows import parse_address
    from hark.edge.relay import RelayConfig
    from hark.edge.supervisor import supervise

    configure_logging(str(options["log_level"]))
    redis_url = options.get("redis_url") or os.environ.get("HARK_REDIS_URL")
    secret = options.get("fleet_secret") or os.environ.get("HARK_FLEET_SECRET")
    try:
        if not redis_url:
            raise ValueError("the relay needs --redis-url (or HARK_REDIS_URL)")
        # The workers' way to give Redis's password apart from the URL works here too.
        redis_url = with_password(str(redis_url), os.environ.get("HARK_REDIS_PASSWORD"))
        if not secret or len(str(secret).encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"the relay needs a fleet secret of at least {MIN_SECRET_BYTES} bytes "
                "(HARK_FLEET_SECRET or --fleet-secret)"
            )
        workers = int(str(options["workers"]))
        if workers < 1:
            raise ValueError("--workers must be at least 1")
        rate = float(str(options["source_flow_rate"]))
        burst = int(str(options["source_flow_burst"]))
        if rate <= 0 or burst < 1:
            raise ValueError("--source-flow-rate must be positive, --source-flow-burst 1 or more")
        config = RelayConfig(
            listen=parse_address(str(options["listen"])),
            internal=parse_address(str(options["internal"])),
            fleet_secret=str(secret),
            idle_s=float(str(options["flow_idle"])),
            source_flows_per_s=rate,
            source_flow_burst=burst,
        )
        metrics = options.get("metrics_listen")
        metrics_address = parse_address(str(metrics)) if metrics else None
        # A malformed URL fails here, before any process starts.
        RedisStore(str(redis_url), str(secret))
    except ValueError as exc:
        print(f"hark relay: {exc}", file=sys.stderr)
        return 2
    return supervise(config, str(redis_url), workers, metrics_address)

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
from collections.abc import Mapping
from typing import Any

from hark.config.options import Kind, Option, add_arguments
from hark.edge.flow_admission import SOURCE_FLOW_BURST, SOURCE_FLOWS_PER_S
from hark.edge.route_hint import MIN_SECRET_BYTES
from hark.observability.logging import configure_logging

DEFAULT_LISTEN = "0.0.0.0:3478"


def _relay_option(name: str, kind: Kind, default: Any, help: str, **fields: Any) -> Option:
    # The relay reads no file, and the environment only where it shares a setting with the
    # workers (in_env given).
    fields.setdefault("in_env", False)
    return Option(name, kind, default, "relay", help, in_file=False, **fields)


# Every option of ``hark relay``, declared once: its command line, the environment variables
# it reads and its table in docs/configuration.md come from here.
RELAY_OPTIONS: tuple[Option, ...] = (
    _relay_option(
        "listen",
        "str",
        DEFAULT_LISTEN,
        f"the public UDP address clients send media to (default {DEFAULT_LISTEN})",
        metavar="HOST:PORT",
    ),
    _relay_option(
        "internal",
        "str",
        "0.0.0.0:0",
        "where to send to workers from (default: any address, a free port per process)",
        metavar="HOST:PORT",
        doc_default="any address, a free port per process",
    ),
    _relay_option(
        "redis_url",
        "str",
        None,
        "the fleet's Redis: the worker registry and the mirrored flow table "
        "(default $HARK_REDIS_URL)",
        metavar="URL",
        secret=True,
        in_env=True,
        doc_default="none: needed",
    ),
    _relay_option(
        "redis_password",
        "str",
        None,
        "the password of --redis-url's Redis, given apart from the URL",
        secret=True,
        in_env=True,
        cli=False,
    ),
    _relay_option(
        "fleet_secret",
        "str",
        None,
        "the secret the workers sign their routing hints with (default "
        "$HARK_FLEET_SECRET, which is better: arguments are visible to other users)",
        metavar="SECRET",
        secret=True,
        in_env=True,
        doc_default="none: needed",
        doc=f"the secret the workers sign their routing hints with (≥ {MIN_SECRET_BYTES} "
        "bytes), the same on every worker and relay",
    ),
    _relay_option(
        "workers", "int", 1, "forwarding processes (default 1)", metavar="N", check="positive"
    ),
    _relay_option(
        "metrics_listen",
        "str",
        None,
        "serve Prometheus metrics over HTTP at /metrics (default: none)",
        metavar="HOST:PORT",
    ),
    _relay_option(
        "flow_idle",
        "float",
        30.0,
        "forget a flow after this long without a datagram from its client (default 30)",
        metavar="SECONDS",
    ),
    _relay_option(
        "source_flow_rate",
        "float",
        SOURCE_FLOWS_PER_S,
        f"new flows one source IP may make per second (default {SOURCE_FLOWS_PER_S:g})",
        metavar="PER_SECOND",
        check="positive",
    ),
    _relay_option(
        "source_flow_burst",
        "int",
        SOURCE_FLOW_BURST,
        f"new flows one source IP may make at once (default {SOURCE_FLOW_BURST})",
        metavar="N",
        check="positive",
    ),
    _relay_option(
        "log_level",
        "str",
        "info",
        "log level (default info)",
        choices=("debug", "info", "warning", "error"),
    ),
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """The options of ``hark relay``."""
    add_arguments(parser, RELAY_OPTIONS)


def relay_values(options: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The relay's settings: each option from the command line, else the environment (where
    it reads one), else its declared default; ``ValueError`` names the one that is wrong."""
    values: dict[str, Any] = {}
    for option in RELAY_OPTIONS:
        value = options.get(option.name)
        if value is None and option.in_env:
            value = env.get(option.env) or None
        values[option.name] = option.default if value is None else value
        if option.check == "positive" and values[option.name] <= 0:
            least = "at least 1" if option.kind == "int" else "positive"
            raise ValueError(f"{option.flag} must be {least}")
    if not values["redis_url"]:
        raise ValueError("the relay needs --redis-url (or HARK_REDIS_URL)")
    secret = values["fleet_secret"]
    if not secret or len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the relay needs a fleet secret of at least {MIN_SECRET_BYTES} bytes "
            "(HARK_FLEET_SECRET or --fleet-secret)"
        )
    # Imported here: only a relay that starts reads Redis URLs.
    from hark.cluster.redis_url import with_password

    # The workers' way to give Redis's password apart from the URL works here too.
    values["redis_url"] = with_password(values["redis_url"], values.pop("redis_password"))
    return values


def command(options: dict[str, Any]) -> int:
    """Run ``hark relay`` until SIGTERM or SIGINT; the exit status."""
    try:
        values = relay_values(options, os.environ)
    except ValueError as exc:
        print(f"hark relay: {exc}", file=sys.stderr)
        return 2
    configure_logging(values.pop("log_level"))
    # What forwarding needs (NumPy, redis) is imported only now, by this command alone: the
    # parser, ``hark relay --help`` and ``hark``'s other commands go without it.
    from hark.edge.cli import run

    return run(**values)

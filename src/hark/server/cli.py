"""``hark serve``: the options of the Realtime API server, and running it (in this process,
or in the worker processes of ``--workers``; ``hark.server.serving`` runs each).

Only what reading the options needs is imported at the top: ``hark serve --help`` and the
``hark`` command's parser load this module, the server itself is imported when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from hark.config import ConfigError, load_settings
from hark.config.options import add_arguments
from hark.observability.logging import configure_logging
from hark.server.serving import EXIT_USAGE, serve

DESCRIPTION = (
    "Run the server. Every option also reads HARK_<OPTION> from the environment (e.g. "
    "HARK_LLM_URL) and <option> from the --config file; API keys come from HARK_API_KEYS "
    "(comma-separated) or api_keys in the file. An entry metrics:KEY makes KEY a metrics key, "
    "which reads /metrics and nothing else."
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """The options of ``hark serve``, from their declarations (``hark.config.options``)."""
    # One paragraph, wrapped to the terminal (the module's docstring is for the code's
    # readers).
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.HelpFormatter
    add_arguments(parser)


def command(options: dict[str, object]) -> int:
    """Run ``hark serve`` (with ``--workers``, its processes) until SIGINT or SIGTERM; the
    exit status."""
    try:
        settings = load_settings(options, env=os.environ)
    except ConfigError as exc:
        print(f"hark: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.log_level)
    if settings.workers > 1:
        from hark.server.workers import run_workers

        return run_workers(settings)
    from hark.eventloop import run_event_loop

    try:
        return run_event_loop(serve(settings))
    except KeyboardInterrupt:
        # Ctrl-C before the signal handlers were installed.
        return 130

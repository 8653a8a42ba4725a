"""Where hark's logs go: one setup shared by every command (``hark serve``, its worker
processes, ``hark relay``), kept below the command line so that any layer may call it."""

from __future__ import annotations

import logging
import sys


def configure_logging(level: str) -> None:
    """Log to stderr at ``level`` (a name from ``hark.cli.LOG_LEVELS``)."""
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )

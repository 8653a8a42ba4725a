"""What every ``hark bench`` shares: percentiles, the server's URL forms, the report's output.

A bench measures, then prints a summary for people and writes the same figures as JSON
(``--json FILE``); the statistics and the URL handling live here so that two benches can
never disagree on what "p99" or "the server at ``--url``" means.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from hark import __version__

# The key a server takes when it has none configured (any key is accepted then).
DEFAULT_API_KEY = "local"


class BenchError(RuntimeError):
    """The benchmark cannot run (bad options, server unreachable, chart impossible)."""


# ---------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values``, interpolating between closest ranks.

    The same definition as NumPy's default (``method="linear"``).
    """
    if not values:
        raise ValueError("percentile of no values")
    return _ranked(sorted(values), q)


def percentile_or_nan(values: Sequence[float], q: float) -> float:
    """``percentile``, or NaN when there are no values: a window's figures stay floats,
    printed and written as NaN."""
    return percentile(values, q) if values else math.nan


def timing_figures(values: Sequence[float]) -> dict[str, float]:
    """p50, p90 and p99 of ``values`` (NaN when there are none) and how many there are: a
    timing of the call benches' reports (a SIP call's INVITE → 200 OK, a WebRTC answer)."""
    return {
        "p50": percentile_or_nan(values, 50),
        "p90": percentile_or_nan(values, 90),
        "p99": percentile_or_nan(values, 99),
        "count": float(len(values)),
    }


def percentiles(
    values: Sequence[float], qs: Iterable[float], digits: int | None = None
) -> dict[str, float | None]:
    """``{"p50": …, "p99": …}`` for each ``q`` of ``qs``, rounded to ``digits`` when given.

    Every figure is None when there are no values: a window without a sample has no
    percentile, and the report says so rather than inventing one.
    """
    ordered = sorted(values)
    figures: dict[str, float | None] = {}
    for q in qs:
        figure = _ranked(ordered, q) if ordered else None
        figures[f"p{q:g}"] = rounded(figure, digits) if digits is not None else figure
    return figures


def rounded(value: float | None, digits: int = 1) -> float | None:
    """``value`` rounded to ``digits``; None stays None."""
    return None if value is None else round(value, digits)


def _ranked(ordered: Sequence[float], q: float) -> float:
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the local process ``pid`` has used so far, from ``/proc``;
    raises ``OSError`` when there is no such process (or no ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    # utime and stime are fields 14 and 15 of stat(5); the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds_if_running(pid: int | None) -> float | None:
    """``cpu_seconds`` of ``pid``, or None when no process is given or it has gone."""
    if pid is None:
        return None
    try:
        return cpu_seconds(pid)
    except OSError:
        return None


def load_average() -> float | None:
    """This machine's one-minute load average, for a report to say how busy it was; None
    where the system does not tell."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


# ---------------------------------------------------------------------------- the server's URLs


@dataclass(frozen=True)
class ServerUrl:
    """A server's root as ``--url`` gives it, with its HTTP and WebSocket forms.

    ``--url`` may use any of ``ws://``, ``wss://``, ``http://`` and ``https://``, with or
    without a path prefix and a trailing ``/v1``: ``wss://h/base/v1/`` and ``https://h/base``
    are the same server.
    """

    secure: bool
    netloc: str
    # The path before ``/v1``, without a trailing slash ("" at the host's root).
    prefix: str

    @classmethod
    def parse(cls, url: str) -> ServerUrl:
        """The server at ``url``; ``BenchError`` when it is not an HTTP or WebSocket URL."""
        parts = urlsplit(url)
        secure = {"ws": False, "http": False, "wss": True, "https": True}.get(parts.scheme)
        if secure is None or not parts.netloc:
            raise BenchError(f"--url must look like ws://HOST:PORT, got {url!r}")
        prefix = parts.path.rstrip("/").removesuffix("/v1")
        return cls(secure, parts.netloc, prefix)

    def http(self, path: str = "") -> str:
        """The ``http(s)://`` URL of ``path`` (``"/metrics"``, ``"/v1/…?…"``) on the server."""
        return urlunsplit(
            ("https" if self.secure else "http", self.netloc, self.prefix + path, "", "")
        )

    def ws(self, path: str = "") -> str:
        """The ``ws(s)://`` URL of ``path`` (which may end in a query) on the server."""
        return urlunsplit(("wss" if self.secure else "ws", self.netloc, self.prefix + path, "", ""))


# ---------------------------------------------------------------------------- options and output


def api_key(option: str | None) -> str:
    """The key to send: ``--api-key``, else ``$OPENAI_API_KEY``, else ``local``."""
    return option or os.environ.get("OPENAI_API_KEY") or DEFAULT_API_KEY


def host_figures(load_before: float | None) -> dict[str, Any]:
    """This machine as a report describes it: its CPUs, and its load average before the run
    (``load_before``, from ``load_average``) and now."""
    return {"cpus": os.cpu_count(), "load_1m_before": load_before, "load_1m_after": load_average()}


def report_head(
    benchmark: str, started_at: float, duration_s: float, host: Mapping[str, Any]
) -> dict[str, Any]:
    """The fields a bench's JSON report opens with: which bench, which hark, when, how long
    and on what host (a dict of the bench's own)."""
    return {
        "benchmark": benchmark,
        "hark_version": __version__,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "duration_s": round(duration_s, 1),
        "host": dict(host),
    }


def write_json(path: Path, report: Mapping[str, Any]) -> None:
    """``report`` as indented JSON at ``path``, its folder created if need be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def publish(summary: str, report: Mapping[str, Any], json_path: Path | None) -> None:
    """Print the summary for people and, with ``json_path``, write the report as JSON."""
    print(summary)
    if json_path is not None:
        write_json(json_path, report)

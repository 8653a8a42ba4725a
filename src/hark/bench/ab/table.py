"""The A/B table: each figure's rounds side by side, their medians, the ratio and the verdict.

Pure functions of the figures, so that what is flagged can be tested without a run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

# B worse than A by more than this share of A is flagged.
DEFAULT_THRESHOLD = 0.10


@dataclass(frozen=True)
class Figure:
    """One figure a bench reports, and which way is better."""

    key: str
    label: str
    unit: str
    better: Literal["lower", "higher"]
    # A difference this small (in ``unit``) is never flagged, whatever the ratio: a 1 ms
    # E2A against 0 ms is "infinitely" worse and means nothing.
    floor: float = 0.0


@dataclass(frozen=True)
class Row:
    """One figure of the table."""

    figure: Figure
    a: list[float | None]
    b: list[float | None]
    a_median: float | None
    b_median: float | None
    # B/A of the medians; None when either is missing or A is 0.
    ratio: float | None
    # How much worse B is than A, as a share of A (negative: better); ±inf when A is 0 and
    # B is not; None when either side has no value.
    worse: float | None
    # B/A of each round's pair (the A run and the B run of one round), where both ran.
    pair_ratios: list[float]
    # (max - min) / median of each side's rounds: how much a side differs from itself.
    a_spread: float | None
    b_spread: float | None
    # worse, better, same (within the threshold or the floor) or n/a.
    verdict: str
    # A side's own rounds differ by more than the threshold: a difference of that size
    # between A and B may be noise.
    noisy: bool

    @property
    def flagged(self) -> bool:
        """B is worse than A by more than the threshold (and the figure's floor)."""
        return self.verdict == "worse"


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are there; None when none is."""
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def spread(values: Sequence[float | None]) -> float | None:
    """(max - min) / median of the values there; None with fewer than two or a median of 0."""
    present = [v for v in values if v is not None]
    middle = median(present)
    if len(present) < 2 or not middle:
        return None
    return (max(present) - min(present)) / abs(middle)


def worse_share(a: float, b: float, better: Literal["lower", "higher"]) -> float:
    """How much worse ``b`` is than ``a``, as a share of ``a`` (negative when better)."""
    change = b - a if better == "lower" else a - b
    if a == 0:
        return 0.0 if change == 0 else math.copysign(math.inf, change)
    return change / abs(a)


def compare_figure(
    figure: Figure,
    a: Sequence[float | None],
    b: Sequence[float | None],
    threshold: float = DEFAULT_THRESHOLD,
) -> Row:
    """The row of ``figure`` from its values on A and on B, one per round (None: not
    measured in that round)."""
    a_median, b_median = median(a), median(b)
    ratio = worse = None
    verdict = "n/a"
    if a_median is not None and b_median is not None:
        ratio = b_median / a_median if a_median else None
        worse = worse_share(a_median, b_median, figure.better)
        beyond_floor = abs(b_median - a_median) > figure.floor
        if worse > threshold and beyond_floor:
            verdict = "worse"
        elif -worse > threshold and beyond_floor:
            verdict = "better"
        else:
            verdict = "same"
    pair_ratios = [
        y / x for x, y in zip(a, b, strict=False) if x is not None and y is not None and x != 0
    ]
    a_spread, b_spread = spread(a), spread(b)
    return Row(
        figure=figure,
        a=list(a),
        b=list(b),
        a_median=a_median,
        b_median=b_median,
        ratio=ratio,
        worse=worse,
        pair_ratios=pair_ratios,
        a_spread=a_spread,
        b_spread=b_spread,
        verdict=verdict,
        noisy=any(s is not None and s > threshold for s in (a_spread, b_spread)),
    )


def compare(
    figures: Sequence[Figure],
    a: dict[str, list[float | None]],
    b: dict[str, list[float | None]],
    threshold: float = DEFAULT_THRESHOLD,
) -> list[Row]:
    """One row per figure; a figure missing from ``a`` or ``b`` is n/a on that side."""
    return [compare_figure(f, a.get(f.key, []), b.get(f.key, []), threshold) for f in figures]


# ---------------------------------------------------------------------------- rendering


def number(value: float | None) -> str:
    """A figure as the table prints it: about three significant digits, ``–`` for none."""
    if value is None:
        return "–"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    magnitude = abs(value)
    if magnitude >= 100 or value == int(value):
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def change(row: Row) -> str:
    """B against A in words: ``12.3 % worse``, ``4.0 % better``, ``same``, ``–``."""
    if row.worse is None:
        return "–"
    if math.isinf(row.worse):
        return f"{'worse' if row.worse > 0 else 'better'} (A is 0)"
    if row.worse == 0:
        return "same"
    return f"{abs(row.worse) * 100:.1f} % {'worse' if row.worse > 0 else 'better'}"


def _rounds(values: Sequence[float | None]) -> str:
    return ", ".join(number(v) for v in values) if values else "–"


def _ratio_range(row: Row) -> str:
    if not row.pair_ratios:
        return "–"
    low, high = min(row.pair_ratios), max(row.pair_ratios)
    return f"{low:.2f}" if low == high else f"{low:.2f}–{high:.2f}"


def _spreads(row: Row) -> str:
    def one(s: float | None) -> str:
        return "–" if s is None else f"{s * 100:.0f} %"

    return f"{one(row.a_spread)} / {one(row.b_spread)}"


def _verdict(row: Row) -> str:
    if row.verdict == "worse":
        return "WORSE" + (" (noisy)" if row.noisy else "")
    return row.verdict + (" (noisy)" if row.noisy and row.verdict != "n/a" else "")


HEADER = (
    "figure",
    "better",
    "A rounds",
    "A median",
    "B rounds",
    "B median",
    "B/A",
    "B against A",
    "B/A per round",
    "spread A / B",
    "verdict",
)


def cells(row: Row) -> tuple[str, ...]:
    """The row's cells, in ``HEADER``'s order."""
    unit = f" {row.figure.unit}" if row.figure.unit else ""
    return (
        row.figure.label,
        row.figure.better,
        _rounds(row.a),
        number(row.a_median) + (unit if row.a_median is not None else ""),
        _rounds(row.b),
        number(row.b_median) + (unit if row.b_median is not None else ""),
        "–" if row.ratio is None else f"{row.ratio:.3f}",
        change(row),
        _ratio_range(row),
        _spreads(row),
        _verdict(row),
    )


def text_table(rows: Sequence[Row]) -> str:
    """The table for a terminal: aligned columns."""
    lines = [HEADER, *(cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(rows: Sequence[Row]) -> str:
    """The table in Markdown, for pasting into a note."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        values = list(cells(row))
        if row.flagged:
            values[-1] = f"**{values[-1]}**"
        lines.append("| " + " | ".join(v.replace("|", "\\|") for v in values) + " |")
    return "\n".join(lines)


def _finite(value: float | None) -> float | str | None:
    # JSON has no infinity; say it in words.
    if value is not None and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def row_json(row: Row) -> dict[str, Any]:
    """The row as JSON-ready data."""
    return {
        "key": row.figure.key,
        "label": row.figure.label,
        "unit": row.figure.unit,
        "better": row.figure.better,
        "floor": row.figure.floor,
        "a": row.a,
        "b": row.b,
        "a_median": row.a_median,
        "b_median": row.b_median,
        "ratio": row.ratio,
        "worse": _finite(row.worse),
        "pair_ratios": row.pair_ratios,
        "a_spread": row.a_spread,
        "b_spread": row.b_spread,
        "verdict": row.verdict,
        "flagged": row.flagged,
        "noisy": row.noisy,
    }

"""The server's own figures, read from its Prometheus ``/metrics`` while the callers run."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hark.bench.report import rounded


@dataclass
class Sample:
    """One reading of the server's ``/metrics``: the flat samples, or why there are none."""

    t: float
    values: dict[str, float] | None
    error: str | None = None


def parse_metrics(text: str) -> dict[str, float]:
    """A Prometheus text exposition as ``{'name{label="v",…}': value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    flat: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            flat[_key(sample.name, sample.labels)] = float(sample.value)
    return flat


def _key(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _matching(values: Mapping[str, float], name: str, **labels: str) -> Iterable[float]:
    """Values of every series of ``name`` whose labels include ``labels``."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    for key, value in values.items():
        base, _, rest = key.partition("{")
        if base == name and all(w in rest for w in wanted):
            yield value


def _total(values: Mapping[str, float], name: str, **labels: str) -> float:
    return sum(_matching(values, name, **labels))


def histogram_quantile(
    q: float,
    now: Mapping[str, float],
    before: Mapping[str, float] | None,
    name: str,
    **labels: str,
) -> float | None:
    """The ``q`` quantile (0–1) of a histogram's observations between two scrapes.

    Interpolates linearly within the bucket, as Prometheus's ``histogram_quantile`` does;
    None without observations. Series of several processes are added up.
    """
    buckets: dict[float, float] = {}
    for key, value in now.items():
        base, _, rest = key.partition("{")
        if base != f"{name}_bucket" or not all(f'{k}="{v}"' in rest for k, v in labels.items()):
            continue
        found = re.search(r'le="([^"]+)"', rest)
        if found is None:
            continue
        earlier = before.get(key, 0.0) if before else 0.0
        bound = float(found.group(1))
        buckets[bound] = buckets.get(bound, 0.0) + value - earlier
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def quantile_ms(
    q: int, now: Mapping[str, float], before: Mapping[str, float], name: str, **labels: str
) -> float | None:
    """``histogram_quantile`` at the ``q``-th percentile of a histogram in seconds, in ms."""
    seconds = histogram_quantile(q / 100, now, before, name, **labels)
    return rounded(None if seconds is None else seconds * 1000)


def server_figures(now: Mapping[str, float], before: Mapping[str, float] | None) -> dict[str, Any]:
    """The server's figures in one scrape (and, with ``before``, over the time between)."""
    rss = list(_matching(now, "hark_process_resident_memory_bytes"))
    fds = list(_matching(now, "hark_process_open_fds"))
    lag_max = list(_matching(now, "hark_event_loop_lag_max_seconds"))
    figures: dict[str, Any] = {
        "server_sessions": int(_total(now, "hark_sessions_active")),
        "rss_mib": round(sum(rss) / 2**20, 1) if rss else None,
        "open_fds": int(sum(fds)) if fds else None,
        "processes": len(rss),
        "loop_lag_max_ms": round(max(lag_max) * 1000, 1) if lag_max else None,
        "vad_chunks": int(_total(now, "hark_vad_chunks_total")),
        "vad_chunks_late": int(_total(now, "hark_vad_chunks_late_total")),
        "audio_dropped": int(_total(now, "hark_audio_chunks_dropped_total")),
        "audio_late": int(_total(now, "hark_audio_chunks_late_total")),
        "errors": int(_total(now, "hark_errors_total")),
    }
    if before is not None:
        batches = _total(now, "hark_batcher_batch_size_count") - _total(
            before, "hark_batcher_batch_size_count"
        )
        rows = _total(now, "hark_batcher_batch_size_sum") - _total(
            before, "hark_batcher_batch_size_sum"
        )
        figures["batch_mean"] = round(rows / batches, 1) if batches > 0 else None
        figures["batch_wait_p99_ms"] = quantile_ms(99, now, before, "hark_batcher_wait_seconds")
        figures["loop_lag_p99_ms"] = quantile_ms(99, now, before, "hark_event_loop_lag_seconds")
    return figures

"""``hark bench relay`` runs its parts, measures, and stops by itself."""

from __future__ import annotations

import os

from hark.bench.relay import RelayBenchConfig, measure, summary


def test_the_bench_measures_both_paths_and_forwards_every_datagram_it_counts() -> None:
    cpus = os.sched_getaffinity(0)
    report = measure(RelayBenchConfig(seconds=0.3, flows=4, size=200, pings=50, relay_cpu=0))
    # The caller keeps its CPUs: what it runs next (in a test run, the models) needs them all.
    assert os.sched_getaffinity(0) == cpus
    counters = report["relay_counters"]
    # Every datagram that came back passed the relay in and out, and nothing was dropped.
    assert counters["packets_in"] >= report["forwarded_pps"] * report["seconds"] / 2 - 4
    assert counters["flows_created"] == 4
    assert not any(name.startswith("drop_") for name in counters)
    assert report["forwarded_pps"] > 0
    assert report["pps_per_core"] is None or report["pps_per_core"] > 0
    for path in ("via_relay", "direct"):
        assert report["round_trip_us"][path]["p50"] > 0
    assert "added by the relay" in summary(report)

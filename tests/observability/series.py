"""Every series name hark's workers and relays expose, for the tests of what reads them."""

from __future__ import annotations


def known_series() -> set[str]:
    """Every series name hark's workers and relays expose (a histogram's ``_bucket``,
    ``_sum`` and ``_count`` and a counter's ``_total`` among them)."""
    from hark.edge.metrics import _HELP as RELAY_HELP
    from hark.observability.metrics import Metrics

    names: set[str] = set()
    for family in Metrics().registry.collect():
        for sample in family.samples:
            names.add(sample.name)
        names.add(family.name)
        if family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
        if family.type == "counter":
            names.add(f"{family.name}_total")
    for name in RELAY_HELP:
        names |= {f"hark_relay_{name}", f"hark_relay_{name}_total"}
    return names

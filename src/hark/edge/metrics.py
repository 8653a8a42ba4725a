"""The relay's counters in Prometheus's text format."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hark.edge.relay import COUNTERS, DROP_REASONS

_HELP = {
    "packets": "Datagrams forwarded, by direction (in: client to worker).",
    "bytes": "Payload bytes forwarded, by direction (framing excluded).",
    "flows": "Client addresses the relay forwards for now.",
    "flows_created": "Flows made by a client's verified STUN binding request.",
    "flows_restored": "Flows taken from the mirrored table (a restart, another relay's flow).",
    "flows_expired": "Flows forgotten after a time without a datagram from their client.",
    "flows_worker_gone": "Flows ended because their worker left the registry.",
    "lookups": "Unknown clients looked up in the mirrored flow table.",
    "mirror_failures": "Calls to the flow mirror in Redis that failed or had no answer in time.",
    "dropped": "Datagrams dropped, by reason.",
}


def metrics_text(values: npt.NDArray[np.int64]) -> str:
    """The exposition of one row of counters (``relay.COUNTERS`` then the drop reasons)."""
    named = dict(zip(COUNTERS, values.tolist(), strict=False))
    lines: list[str] = []

    def family(name: str, kind: str, samples: list[tuple[str, int]]) -> None:
        lines.append(f"# HELP hark_relay_{name} {_HELP[name]}")
        lines.append(f"# TYPE hark_relay_{name} {kind}")
        suffix = "_total" if kind == "counter" else ""
        lines.extend(f"hark_relay_{name}{suffix}{labels} {value}" for labels, value in samples)

    for name in ("packets", "bytes"):
        family(
            name,
            "counter",
            [
                ('{direction="in"}', named[f"{name}_in"]),
                ('{direction="out"}', named[f"{name}_out"]),
            ],
        )
    family("flows", "gauge", [("", named["flows"])])
    # The rest, after the directional counters and the flows gauge: one plain counter each.
    for name in COUNTERS[COUNTERS.index("flows") + 1 :]:
        family(name, "counter", [("", named[name])])
    drops = values.tolist()[len(COUNTERS) :]
    family(
        "dropped",
        "counter",
        [
            (f'{{reason="{reason}"}}', count)
            for reason, count in zip(DROP_REASONS, drops, strict=True)
        ],
    )
    return "\n".join(lines) + "\n"

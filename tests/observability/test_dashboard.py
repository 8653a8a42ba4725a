"""The Grafana dashboard in deploy/ asks only for series that hark exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .series import known_series
from .test_metrics import SERIES

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "hark-dashboard.json"


def test_the_dashboard_queries_exported_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    assert expressions
    used = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for expr in expressions
        for name in re.findall(r"\bhark_[a-z0-9_]+", expr)
    }
    # The relays' series too: the dashboard shows the fleet.
    exported = {re.sub(r"_total$", "", name) for name in known_series()} | known_series()
    assert used <= exported, used - exported
    # Every exported series is on the dashboard somewhere.
    assert {re.sub(r"_total$", "", s) for s in SERIES} <= {
        re.sub(r"_total$", "", name) for name in used
    }

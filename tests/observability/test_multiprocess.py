"""Several worker processes, one view: a scrape of any worker adds up all of them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# prometheus_client picks its storage when first imported, so each worker is a fresh
# interpreter with PROMETHEUS_MULTIPROC_DIR already set, as `hark serve --workers` makes them.
WORKER = textwrap.dedent(
    """
    import os, sys
    from hark.observability.metrics import Metrics
    metrics = Metrics()
    for _ in range(int(sys.argv[1])):
        session = metrics.session("websocket")
        session.started()
        session.client_event("session.update")
        session.flush()
    metrics.observe_loop_lag(float(sys.argv[2]))
    metrics.sample_process()
    print(os.getpid())
    """
)
SCRAPE = "from hark.observability.metrics import Metrics; print(Metrics().exposition().decode())"


def run(code: str, directory: Path, *args: str) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def scrape(directory: Path) -> dict[str, float]:
    flat: dict[str, float] = {}
    for family in text_string_to_metric_families(run(SCRAPE, directory)):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            flat[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return flat


def test_workers_add_up(tmp_path: Path) -> None:
    first = run(WORKER, tmp_path, "2", "0.01").strip()
    second = run(WORKER, tmp_path, "3", "0.2").strip()
    values = scrape(tmp_path)
    assert values['hark_sessions_started_total{transport="websocket"}'] == 5
    assert values['hark_client_events_total{type="session.update"}'] == 5
    # Memory is per process, one series each.
    assert f'hark_process_resident_memory_bytes{{pid="{first}"}}' in values
    assert f'hark_process_resident_memory_bytes{{pid="{second}"}}' in values
    assert values["hark_event_loop_lag_max_seconds"] == 0.2
    assert values["hark_event_loop_lag_seconds_count"] == 2


def test_a_dead_worker_leaves_the_live_gauges(tmp_path: Path) -> None:
    from prometheus_client import multiprocess

    first = run(WORKER, tmp_path, "2", "0.01").strip()
    run(WORKER, tmp_path, "3", "0.01")
    # The workers above have exited; as far as the files know, their sessions are open.
    assert scrape(tmp_path)['hark_sessions_active{transport="websocket"}'] == 5
    multiprocess.mark_process_dead(int(first), str(tmp_path))
    values = scrape(tmp_path)
    assert values['hark_sessions_active{transport="websocket"}'] == 3
    assert f'hark_process_resident_memory_bytes{{pid="{first}"}}' not in values
    # Counters keep what the dead worker counted.
    assert values['hark_sessions_started_total{transport="websocket"}'] == 5

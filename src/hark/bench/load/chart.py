"""The timeline of a ``hark bench load`` run as a chart (``--chart``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hark.bench.report import BenchError


def write_chart(report: Mapping[str, Any], path: Path) -> None:
    """The timeline as a PNG: calls, VAD decision lag, E2A, memory and file descriptors."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BenchError("--chart needs matplotlib: pip install 'hark[bench]'") from exc

    timeline = report["timeline"]

    def series(key: str) -> tuple[list[float], list[float]]:
        points = [(p["t_s"], p[key]) for p in timeline if p.get(key) is not None]
        return [t for t, _ in points], [v for _, v in points]

    figure, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    figure.suptitle(
        f"hark bench load: {report['parameters']['sessions']} callers "
        f"({report['parameters']['chunk_ms']} ms chunks)"
    )
    panels: list[tuple[Any, str, list[tuple[str, str]]]] = [
        (axes[0], "sessions", [("calls", "client calls"), ("server_sessions", "server active")]),
        (
            axes[1],
            "ms",
            [
                ("vad_lag_p50_ms", "VAD decision lag p50"),
                ("vad_lag_p99_ms", "VAD decision lag p99"),
                ("loop_lag_max_ms", "event-loop lag max"),
            ],
        ),
        (axes[2], "ms", [("e2a_p50_ms", "E2A p50"), ("e2a_p99_ms", "E2A p99")]),
        (axes[3], "MiB", [("rss_mib", "RSS")]),
    ]
    for ax, unit, keys in panels:
        for key, label in keys:
            xs, ys = series(key)
            if xs:
                ax.plot(xs, ys, label=label)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    xs, ys = series("open_fds")
    if xs:
        fds = axes[3].twinx()
        fds.plot(xs, ys, color="tab:red", label="open fds")
        fds.set_ylabel("file descriptors")
        fds.legend(loc="upper right", fontsize="small")
    axes[3].set_xlabel("seconds since start")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)

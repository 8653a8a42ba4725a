"""What the callers of ``hark bench load`` saw, gathered as they run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# Send lateness is counted in whole ms up to this; the last bin holds everything later.
_SEND_LAG_BINS_MS = 1000


@dataclass
class Results:
    """Everything the callers saw, gathered as they run (times in ms)."""

    calls_started: int = 0
    calls_completed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    responses: Counter[str] = field(default_factory=Counter)
    questions: int = 0
    turns_expected: int = 0
    turns_detected: int = 0
    missed_turns: int = 0
    # (seconds since the start, ms): the timeline needs to know when.
    vad_lag: list[tuple[float, float]] = field(default_factory=list)
    speech_end_lag: list[tuple[float, float]] = field(default_factory=list)
    e2a: list[tuple[float, float]] = field(default_factory=list)
    v2v: list[float] = field(default_factory=list)
    server_e2a: list[float] = field(default_factory=list)
    server_v2v: list[float] = field(default_factory=list)
    transcripts: int = 0
    active: int = 0
    send_lag_max: float = 0.0
    # A histogram rather than a list: a long run sends millions of chunks.
    send_lag_hist: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(_SEND_LAG_BINS_MS + 1, dtype=np.int64)
    )

    def record_send_lag(self, ms: float) -> None:
        """One chunk left ``ms`` after its schedule."""
        self.send_lag_hist[min(_SEND_LAG_BINS_MS, int(ms))] += 1
        self.send_lag_max = max(self.send_lag_max, ms)

    def send_lag_percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0–100) of the send lateness in whole ms; None if none."""
        total = int(self.send_lag_hist.sum())
        if total == 0:
            return None
        return float(np.searchsorted(np.cumsum(self.send_lag_hist), q / 100 * total))

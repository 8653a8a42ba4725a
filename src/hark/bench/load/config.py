"""What ``hark bench load`` does: the run's options, and the durations they are written in."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hark.bench.report import DEFAULT_API_KEY, BenchError
from hark.bench.spoken_questions import RATE

TRANSPORTS = ("ws",)
# The fields a report leaves out of the run's parameters: the API key, a secret, and this
# machine's particulars, which say nothing of what the callers did.
_NOT_PARAMETERS = frozenset({"api_key", "server_pid", "connect_timeout_s", "cache_dir"})


@dataclass(frozen=True)
class LoadConfig:
    """What ``hark bench load`` does; times in seconds unless named otherwise."""

    url: str
    sessions: int
    ramp_s: float = 10.0
    duration_s: float = 60.0
    transport: str = "ws"
    chunk_ms: int = 20
    call_s: float = 180.0
    silence_ms: int = 500
    think_s: tuple[float, float] = (0.5, 2.0)
    pause_s: tuple[float, float] = (3.0, 6.0)
    api_key: str = DEFAULT_API_KEY
    model: str = "gpt-realtime"
    sample_s: float = 5.0
    seed: int = 0
    # Input transcription on (``whisper-1``): recognition runs on every turn as it is spoken.
    transcribe: bool = False
    # The server's process, when local: its CPU time per session-second after the ramp.
    server_pid: int | None = None
    connect_timeout_s: float = 15.0
    cache_dir: Path | None = None

    def check(self) -> None:
        """Raise ``BenchError`` when the options cannot make a run."""
        if self.sessions < 1:
            raise BenchError("--sessions must be at least 1")
        if self.transport not in TRANSPORTS:
            raise BenchError(f"--transport must be one of {', '.join(TRANSPORTS)}")
        if not 10 <= self.chunk_ms <= 1000 or RATE * self.chunk_ms % 1000:
            raise BenchError("--chunk-ms must be a whole number of ms from 10 to 1000")

    def parameters(self) -> dict[str, Any]:
        """The run's parameters as JSON: its fields but for those of ``_NOT_PARAMETERS``."""
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in asdict(self).items()
            if name not in _NOT_PARAMETERS
        }


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``3m``, ``1h`` or ``1h30m``."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a duration: {text!r} (try 90s, 3m or 1h)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(number) * scale[unit] for number, unit in parts)

"""Voice activity detection: speech probability per fixed-size chunk of 16 kHz audio."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt


class VadStream(Protocol):
    """One audio stream's VAD state (the model's recurrent state and the previous chunk's tail)."""

    async def probability(self, chunk: npt.NDArray[np.float32]) -> float:
        """Speech probability of one chunk: exactly ``chunk_samples`` float32 samples in [-1, 1]."""
        ...

    def reset(self) -> None:
        """Forget the stream's history, as if it had just been opened."""
        ...


class VadEngine(Protocol):
    """A VAD model shared by many streams."""

    sample_rate: int
    chunk_samples: int

    def open_stream(self) -> VadStream:
        """A new, independent stream with fresh state."""
        ...

    async def warmup(self) -> None:
        """Load the model and run it once so the first real chunk is not slow."""
        ...

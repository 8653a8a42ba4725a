"""Test signals."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def tone(
    hz: float,
    seconds: float,
    *,
    rate: int = 16000,
    level: float = 8000.0,
    dtype: type[np.generic] = np.int16,
) -> npt.NDArray[Any]:
    """``seconds`` of a sine at ``hz``, sampled at ``rate`` and peaking at ``level``.

    The default is 16-bit PCM (``level`` in sample units); pass ``dtype=np.float32`` and a
    ``level`` of at most 1.0 for float audio, or ``np.float64`` to shape the wave further
    before converting it.
    """
    t = np.arange(round(rate * seconds)) / rate
    return (level * np.sin(2 * np.pi * hz * t)).astype(dtype)

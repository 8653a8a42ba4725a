"""Sample-rate conversion of mono audio, streaming or one-shot, with libsoxr.

Quality is soxr's "MQ": 16-bit precision, the same as the int16 audio it carries, a flat
passband to 85 % of the lower Nyquist frequency and over 100 dB of alias rejection. "HQ"
costs the same (25–40 µs per 20 ms chunk on a busy core, int16 conversion included) and
sounds no different for speech.

soxr works in internal blocks, so a stream holds back some audio and releases it in bursts:
measured on 20 ms chunks, the lag behind the input averages about 20 ms for 24 k ↔ 16 k and
about 60 ms for 8 k ↔ 16 k (up to twice that just before a burst). ``flush`` releases what is
held back at the end of a stream.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt
import soxr

_QUALITY = "MQ"
_INT16_SCALE = 32768.0

_Sample = TypeVar("_Sample", np.int16, np.float32)


def _checked(pcm: npt.NDArray[_Sample]) -> npt.NDArray[_Sample]:
    if pcm.dtype not in (np.int16, np.float32):
        raise TypeError(f"expected int16 or float32 samples, got {pcm.dtype}")
    if pcm.ndim != 1:
        raise ValueError(f"expected mono (1-D) audio, got shape {pcm.shape}")
    # soxr needs a plain, contiguous ndarray; this copies only when it is not one already.
    return np.ascontiguousarray(pcm)


def _to_float(pcm: npt.NDArray[_Sample]) -> npt.NDArray[np.float32]:
    if pcm.dtype == np.float32:
        return pcm.astype(np.float32, copy=False)
    return (pcm * np.float32(1 / _INT16_SCALE)).astype(np.float32)


def _from_float(pcm: npt.NDArray[np.float32], dtype: np.dtype[_Sample]) -> npt.NDArray[_Sample]:
    if dtype == np.float32:
        return pcm.astype(dtype, copy=False)
    # Rounding here rather than in soxr, whose int16 output adds random dither: the same
    # input then always gives the same output.
    scaled = np.rint(pcm * np.float32(_INT16_SCALE))
    return np.clip(scaled, -32768, 32767).astype(dtype)


def resample(pcm: npt.NDArray[_Sample], in_rate: int, out_rate: int) -> npt.NDArray[_Sample]:
    """Resample a whole mono signal at once; the result has the input's dtype.

    With equal rates the input itself is returned.
    """
    pcm = _checked(pcm)
    if in_rate == out_rate:
        return pcm
    result = soxr.resample(_to_float(pcm), in_rate, out_rate, quality=_QUALITY)
    return _from_float(result, pcm.dtype)


class StreamResampler:
    """Resamples one continuous mono stream chunk by chunk, carrying the filter state across.

    The concatenation of every ``process`` output and the final ``flush`` matches resampling
    the whole stream at once, so chunk boundaries leave no clicks. The sample type (int16
    or float32) is fixed by the first chunk. With equal rates chunks pass through unchanged,
    without a copy or any delay.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} and {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._dtype: np.dtype[np.int16] | np.dtype[np.float32] | None = None
        self._stream: soxr.ResampleStream | None = None

    def process(self, pcm: npt.NDArray[_Sample]) -> npt.NDArray[_Sample]:
        """Resample the next chunk; returns whatever output is ready, possibly none yet."""
        pcm = _checked(pcm)
        if self._dtype is None:
            self._dtype = pcm.dtype
        elif pcm.dtype != self._dtype:
            raise TypeError(f"this stream carries {self._dtype} samples, got {pcm.dtype}")
        if self.in_rate == self.out_rate:
            return pcm
        if self._stream is None:
            self._stream = soxr.ResampleStream(
                self.in_rate, self.out_rate, 1, dtype=np.float32, quality=_QUALITY
            )
        return _from_float(self._stream.resample_chunk(_to_float(pcm)), pcm.dtype)

    def flush(self) -> npt.NDArray[np.int16] | npt.NDArray[np.float32]:
        """End the stream: return the output still held back and start afresh.

        The result has the stream's sample type (int16 if nothing was processed). The next
        ``process`` call begins a new, independent stream.
        """
        stream, dtype = self._stream, self._dtype
        self._stream, self._dtype = None, None
        tail: npt.NDArray[np.float32] = (
            np.zeros(0, np.float32)
            if stream is None
            else stream.resample_chunk(np.zeros(0, np.float32), last=True)
        )
        if dtype == np.float32:
            return tail
        return _from_float(tail, np.dtype(np.int16))

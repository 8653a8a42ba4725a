"""Resampling many streams' VAD chunks to 16 kHz at once, as one polyphase FIR per batch.

The VAD hears 32 ms chunks at the session's input rate (24 kHz for ``pcm``, 8 kHz for G.711)
and Silero wants 16 kHz. Resampling every chunk on its own costs a library call and its
fixed overhead per chunk; here a batch of chunks of one rate is resampled by one matrix
product, each row carrying the last input samples of its stream as history so that chunk
boundaries stay seamless. The filter is banded, so the product is not one dense
``[rows, inputs] x [inputs, outputs]`` (mostly zeros) but one over blocks: every row is cut
into overlapping spans of input that each make 32 consecutive outputs per phase, and all the
spans of all the rows are multiplied by the same ``[span, outputs]`` matrix in a single GEMM.

The filter is a short windowed-sinc low-pass (8 or 16 taps per phase): enough for a VAD,
which needs the speech band and not 100 dB of alias rejection, and cheap enough that a row
costs a few microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

VAD_RATE = 16000
CHUNK_MS = 32
_KAISER_BETA = 6.0
# The pass band ends this far below the lower Nyquist frequency (7.2 kHz of 8 kHz at 16 kHz).
_PASSBAND = 0.9
# Outputs per filter phase that one span of input makes (see the module's documentation).
_BLOCK_PER_PHASE = 32


class UnsupportedRateError(ValueError):
    """No 32 ms chunk of whole samples, or no short polyphase filter, exists for this rate."""


@dataclass(frozen=True, eq=False)
class ChunkResampler:
    """Turns ``[rows, history + in_samples]`` float32 rows at ``rate`` into rows of
    ``out_samples`` at ``target`` (512 at 16 kHz, 256 at 8 kHz).

    Each row is the last ``history`` input samples of its stream followed by its new 32 ms
    chunk; the output is that chunk at 16 kHz, delayed by half the filter (under 0.4 ms).
    """

    rate: int
    target: int
    out_samples: int
    up: int
    down: int
    in_samples: int
    history: int
    # Per output phase, the taps in input order (oldest sample first).
    taps: npt.NDArray[np.float32]
    # The same filter as one matrix over a span of input: [span, outputs per block].
    block: npt.NDArray[np.float32]
    # Input samples between the starts of consecutive spans.
    block_step: int

    def run(self, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Resample a batch of rows; see the class documentation for the layout."""
        count = rows.shape[0]
        if rows.shape[1] != self.history + self.in_samples:
            raise ValueError(
                f"rows at {self.rate} Hz hold {self.history + self.in_samples} samples, "
                f"got {rows.shape[1]}"
            )
        if self.up == self.down:
            return rows[:, self.history :]
        span, produced = self.block.shape
        blocks = self.out_samples // produced
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        item = rows.itemsize
        spans = as_strided(
            rows, (count, blocks, span), (rows.strides[0], self.block_step * item, item)
        )
        out = np.ascontiguousarray(spans).reshape(count * blocks, span) @ self.block
        return out.reshape(count, self.out_samples)


def chunk_samples(rate: int) -> int:
    """Samples in one 32 ms VAD chunk at ``rate``; raises for rates without a whole number."""
    if rate <= 0 or rate * CHUNK_MS % 1000:
        raise UnsupportedRateError(f"{rate} Hz has no 32 ms chunk of whole samples")
    return rate * CHUNK_MS // 1000


def chunk_rate(samples: int) -> int:
    """The sample rate at which ``samples`` last 32 ms; raises when there is none."""
    if samples <= 0 or samples * 1000 % CHUNK_MS:
        raise UnsupportedRateError(f"{samples} samples are not 32 ms at any whole rate")
    return samples * 1000 // CHUNK_MS


@cache
def chunk_resampler(rate: int, target: int = VAD_RATE) -> ChunkResampler:
    """The resampler for 32 ms chunks from ``rate`` to ``target`` (cached)."""
    samples, out = chunk_samples(rate), chunk_samples(target)
    divisor = math.gcd(target, rate)
    up, down = target // divisor, rate // divisor
    if up == down:
        identity = np.ones((1, 1), dtype=np.float32)
        return ChunkResampler(rate, target, out, 1, 1, samples, 0, identity, identity, samples)
    if out % up or up > 8:
        raise UnsupportedRateError(f"no short filter resamples {rate} Hz to {target} Hz")
    width = 16 if down > up else 8
    taps = _design(up, down, width)
    per_phase = min(_BLOCK_PER_PHASE, out // up)
    block = _block_matrix(taps, up, down, per_phase)
    step = down * per_phase
    resampler = ChunkResampler(rate, target, out, up, down, samples, width - 1, taps, block, step)
    # The last span must end within the row (history and chunk).
    last_end = step * (out // (up * per_phase) - 1) + len(block)
    if last_end > samples + width - 1:
        raise UnsupportedRateError(f"no block filter resamples {rate} Hz to {target} Hz")
    return resampler


def _block_matrix(
    taps: npt.NDArray[np.float32], up: int, down: int, per_phase: int
) -> npt.NDArray[np.float32]:
    """The polyphase filter as ``[span, up * per_phase]``: column ``up * m + r`` is output
    ``up * m + r`` of a block, whose taps start ``down * m + (r * down) // up`` samples into
    the span and are phase ``(r * down) % up`` of the filter."""
    width = taps.shape[1]
    firsts = [residue * down // up for residue in range(up)]
    span = down * (per_phase - 1) + max(firsts) + width
    block = np.zeros((span, up * per_phase), dtype=np.float32)
    for m in range(per_phase):
        for residue, first in enumerate(firsts):
            start = down * m + first
            block[start : start + width, up * m + residue] = taps[residue * down % up]
    return block


def _design(up: int, down: int, width: int) -> npt.NDArray[np.float32]:
    """Polyphase taps ``[up, width]`` of a Kaiser-windowed sinc low-pass, oldest first."""
    length = up * width
    cutoff = _PASSBAND * 0.5 / max(up, down)  # cycles per sample of the upsampled signal
    n = np.arange(length) - (length - 1) / 2
    prototype = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(length, _KAISER_BETA)
    taps = np.empty((up, width), dtype=np.float64)
    for phase in range(up):
        # Tap i of a phase weighs the input sample i steps back from the newest one.
        back = prototype[phase::up][:width]
        taps[phase] = back[::-1] / back.sum()  # unit gain at DC in every phase
    return taps.astype(np.float32)

"""Streaming noise suppression with RNNoise, for one continuous mono stream at any rate.

RNNoise (Xiph's recurrent network that sets a gain per critical band, 10 ms at a time) takes
48 kHz frames of 480 samples. The ``pyrnnoise`` wheel ships ``librnnoise.so`` with the weights
compiled in; it is loaded here through ctypes, since the package's own Python layer pulls in
file I/O and progress bars that a stream has no use for. Audio is brought to 48 kHz and back
with soxr's "quick" (cubic) quality: its streams hold back nothing, where the better qualities
hold back 40-140 ms in their blocks, and that would be heard as a later end of turn. The band
gains RNNoise applies make the difference, not the last decibels of alias rejection.

Each ``process`` call returns exactly as many samples as it was given, so the sample clock of
whatever reads the denoised stream stays the input's. The audio comes out late by RNNoise's own
delay (two frames, 20 ms: one of analysis, one of look-ahead) and about a millisecond of
resampling. A stream's first millisecond is silence that covers what soxr holds back, so that
chunks of whole 10 ms (what clients send) fill whole frames at once; a chunking that leaves
frames partly filled adds silence once, when it first runs short, so that the delay grows by
at most one more frame.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soxr

RNNOISE_RATE = 48000
FRAME = 480
_QUALITY = "QQ"


class DenoiserUnavailable(RuntimeError):
    """librnnoise could not be loaded (the ``pyrnnoise`` wheel is missing or broken)."""


@cache
def _library() -> ctypes.CDLL:
    spec = importlib.util.find_spec("pyrnnoise")
    if spec is None or not spec.submodule_search_locations:
        raise DenoiserUnavailable("noise reduction needs the pyrnnoise wheel (librnnoise)")
    path = Path(next(iter(spec.submodule_search_locations))) / "librnnoise.so"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise DenoiserUnavailable(f"cannot load {path.name}: {exc}") from None
    lib.rnnoise_create.argtypes = [ctypes.c_void_p]
    lib.rnnoise_create.restype = ctypes.c_void_p
    lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
    lib.rnnoise_destroy.restype = None
    lib.rnnoise_get_frame_size.restype = ctypes.c_int
    # The frames are read and written in place, through their addresses.
    lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.rnnoise_process_frame.restype = ctypes.c_float
    if lib.rnnoise_get_frame_size() != FRAME:
        raise DenoiserUnavailable("librnnoise has an unexpected frame size")
    return lib


class Denoiser:
    """RNNoise over one stream of int16 mono PCM at ``rate``, state kept across calls.

    ``wet`` (0 to 1) is the share of the denoised signal in the output; the rest is the input,
    delayed to line up with it. Below 1 it sets a floor on the suppression (``wet`` 0.9 takes
    noise down by at most 20 dB), which keeps the breath and soft consonants of a voice close
    to the microphone. ``wet`` may change between calls. Not thread-safe; call ``close`` (or
    let it be collected) to free the network's state.
    """

    def __init__(self, rate: int, wet: float = 1.0) -> None:
        if rate <= 0:
            raise ValueError(f"the sample rate must be positive, got {rate}")
        self._lib = _library()
        self.rate = rate
        self.wet = wet
        self._state: int | None = self._lib.rnnoise_create(None)
        self._up = soxr.ResampleStream(rate, RNNOISE_RATE, 1, dtype=np.float32, quality=_QUALITY)
        self._down = soxr.ResampleStream(RNNOISE_RATE, rate, 1, dtype=np.float32, quality=_QUALITY)
        # 48 kHz input not yet a whole frame; the stream starts with the silence that makes up
        # for what the resampler holds back.
        self._pending = self._up.resample_chunk(np.zeros(-(-rate // 1000), np.float32))
        # RNNoise answers a frame with the one two frames before it: the dry signal is held
        # back as long, to be mixed with the denoised audio it matches.
        self._dry = np.zeros(2 * FRAME, np.float32)
        # Output at ``rate`` not yet handed out.
        self._ready = np.zeros(0, np.float32)

    def close(self) -> None:
        """Free the network's state; ``process`` must not be called afterwards."""
        if self._state is not None:
            self._lib.rnnoise_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()

    def process(self, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """Denoise the next chunk; returns as many samples as ``pcm`` has (see the module's
        docstring for how late)."""
        if self._state is None:
            raise RuntimeError("the denoiser is closed")
        if not len(pcm):
            return pcm
        up = self._up.resample_chunk(pcm.astype(np.float32))
        pending = np.ascontiguousarray(
            np.concatenate((self._pending, up)) if len(self._pending) else up, np.float32
        )
        whole = len(pending) // FRAME * FRAME
        wet = min(1.0, max(0.0, self.wet))
        denoised = np.empty(whole, np.float32)
        source, target = pending.ctypes.data, denoised.ctypes.data
        step = FRAME * pending.itemsize
        for offset in range(0, whole * pending.itemsize, step):
            self._lib.rnnoise_process_frame(self._state, target + offset, source + offset)
        # The dry signal of each frame is the input two frames before it.
        dry = np.concatenate((self._dry, pending[:whole]))
        if wet < 1.0:
            denoised = wet * denoised + (1.0 - wet) * dry[:whole]
        self._dry = dry[whole:].copy()
        self._pending = pending[whole:].copy()
        down = self._down.resample_chunk(denoised) if whole else np.zeros(0, np.float32)
        ready = np.concatenate((self._ready, down)) if len(down) else self._ready
        n = len(pcm)
        if len(ready) < n:
            ready = np.concatenate((np.zeros(n - len(ready), np.float32), ready))
        out, self._ready = ready[:n], ready[n:]
        return np.clip(np.rint(out), -32768, 32767).astype(np.int16)

"""Opus straight from libopus: one 20 ms frame in, one packet out, and back, no frame objects.

PyAV wraps each frame and packet in objects and decodes only at 48 kHz; for a call that
sends and receives fifty packets a second that overhead is most of the codec's cost. Here
the encoder and decoder states are plain buffers held by Python (freed with them), called
through ``ctypes``, and the decoder writes PCM at the rate the session wants (Opus decodes
natively at 8, 12, 16, 24 and 48 kHz), so a caller's audio needs no resampling at all.

libopus is the one PyAV ships (``av.libs`` on Linux, ``av/.dylibs`` on macOS), else the
system's. ``opus_encoder_ctl`` is variadic in C: only its fixed arguments are declared and
the value is passed as an extra ``c_int32``, which ctypes then calls with libffi's variadic
convention (``ffi_prep_cif_var``); declaring the value as a fixed argument would work on
x86-64 and Linux on ARM but not on Apple's ARM, where variadic arguments go on the stack.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from typing import Final

import numpy as np
import numpy.typing as npt

# Sample rates libopus encodes from and decodes to.
RATES: Final = frozenset({8000, 12000, 16000, 24000, 48000})
# RTP clock of Opus (RFC 7587): 48 kHz, whatever the rate inside.
RTP_RATE: Final = 48000
# The longest Opus packet: 120 ms.
MAX_FRAME_MS: Final = 120
# Room for one packet: a 20 ms frame is at most 1275 bytes (RFC 6716 § 3.2.1).
MAX_PACKET_BYTES: Final = 1500

_APPLICATION_VOIP: Final = 2048
_SET_BITRATE: Final = 4002
_SET_COMPLEXITY: Final = 4010
_SET_SIGNAL: Final = 4024
_SIGNAL_VOICE: Final = 3001


class OpusError(RuntimeError):
    """libopus refused a call; the message is its own."""


def _find_libopus() -> str:
    import av

    package = os.path.dirname(av.__file__)
    for pattern in ("../av.libs/libopus*", ".dylibs/libopus*", "../av.libs/opus*.dll"):
        found = sorted(glob.glob(os.path.join(package, pattern)))
        if found:
            return found[0]
    system = ctypes.util.find_library("opus")
    if system is None:
        raise ImportError("libopus was found neither beside PyAV nor on the system")
    return system


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(_find_libopus())
    state, pcm, data = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p
    i32 = ctypes.c_int32
    lib.opus_strerror.argtypes = [ctypes.c_int]
    lib.opus_strerror.restype = ctypes.c_char_p
    for kind in ("encoder", "decoder"):
        getattr(lib, f"opus_{kind}_get_size").argtypes = [ctypes.c_int]
        getattr(lib, f"opus_{kind}_get_size").restype = ctypes.c_int
    lib.opus_encoder_init.argtypes = [state, i32, ctypes.c_int, ctypes.c_int]
    lib.opus_decoder_init.argtypes = [state, i32, ctypes.c_int]
    lib.opus_encoder_ctl.argtypes = [state, ctypes.c_int]
    lib.opus_encoder_ctl.restype = ctypes.c_int
    lib.opus_encode.argtypes = [state, pcm, ctypes.c_int, ctypes.c_void_p, i32]
    lib.opus_encode.restype = i32
    lib.opus_decode.argtypes = [state, data, i32, pcm, ctypes.c_int, ctypes.c_int]
    lib.opus_decode.restype = ctypes.c_int
    return lib


_lib: Final = _load()


def _check(result: int) -> int:
    if result < 0:
        raise OpusError(_lib.opus_strerror(result).decode())
    return result


class OpusEncoder:
    """A mono voice encoder for ``rate`` Hz input at ``bitrate`` bit/s.

    ``complexity`` (0-10) trades CPU for quality; at voice bitrates the top settings buy
    little that a listener hears.
    """

    def __init__(self, rate: int, *, bitrate: int, complexity: int) -> None:
        if rate not in RATES:
            raise ValueError(f"Opus does not encode from {rate} Hz")
        self.rate = rate
        self._state = ctypes.create_string_buffer(_lib.opus_encoder_get_size(1))
        _check(_lib.opus_encoder_init(self._state, rate, 1, _APPLICATION_VOIP))
        for request, value in (
            (_SET_BITRATE, bitrate),
            (_SET_COMPLEXITY, complexity),
            (_SET_SIGNAL, _SIGNAL_VOICE),
        ):
            _check(_lib.opus_encoder_ctl(self._state, request, ctypes.c_int32(value)))
        self._out = ctypes.create_string_buffer(MAX_PACKET_BYTES)

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """One packet of ``pcm``: one frame of 2.5, 5, 10, 20, 40 or 60 ms, contiguous int16."""
        size = _check(
            _lib.opus_encode(self._state, pcm.ctypes.data, len(pcm), self._out, MAX_PACKET_BYTES)
        )
        return self._out.raw[:size]


class OpusDecoder:
    """A decoder to mono PCM at ``rate`` Hz (stereo streams are mixed down by libopus)."""

    def __init__(self, rate: int) -> None:
        if rate not in RATES:
            raise ValueError(f"Opus does not decode to {rate} Hz")
        self.rate = rate
        self._state = ctypes.create_string_buffer(_lib.opus_decoder_get_size(1))
        _check(_lib.opus_decoder_init(self._state, rate, 1))
        self._max_samples = rate * MAX_FRAME_MS // 1000
        self._pcm = np.empty(self._max_samples, np.int16)
        self._pcm_address = self._pcm.ctypes.data

    def decode(self, packet: bytes) -> npt.NDArray[np.int16]:
        """The samples of one packet (a new array)."""
        n = _check(
            _lib.opus_decode(
                self._state, packet, len(packet), self._pcm_address, self._max_samples, 0
            )
        )
        return self._pcm[:n].copy()

    def conceal(self, samples: int) -> npt.NDArray[np.int16]:
        """``samples`` of loss concealment (fading to silence), for packets that never came.

        ``samples`` is a whole number of 2.5 ms at this rate, at most ``MAX_FRAME_MS``.
        """
        n = _check(_lib.opus_decode(self._state, None, 0, self._pcm_address, samples, 0))
        return self._pcm[:n].copy()

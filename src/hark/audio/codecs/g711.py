"""ITU-T G.711 companding: μ-law (PCMU) and A-law (PCMA) between 16-bit PCM and 8-bit codes.

Both directions are single table look-ups: a 256-entry decode table and a 65536-entry encode
table indexed by the unsigned view of each int16 sample, built once at import. The tables
follow the classic reference implementation (the one behind Python's ``audioop``), which
treats μ-law input as 14-bit and A-law input as 13-bit linear PCM.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159
_ULAW_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])

# Every int16 value, ordered so that position i holds the sample whose uint16 view is i.
_ALL_SAMPLES = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)


def _build_ulaw_decode() -> npt.NDArray[np.int16]:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    segment = (code >> 4) & 0x7
    magnitude = (((code & 0x0F) << 3) + _ULAW_BIAS) << segment
    linear = np.where(code & 0x80, _ULAW_BIAS - magnitude, magnitude - _ULAW_BIAS)
    return linear.astype(np.int16)


def _build_ulaw_encode() -> npt.NDArray[np.uint8]:
    value = _ALL_SAMPLES >> 2
    mask = np.where(value < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(value), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    segment = np.searchsorted(_ULAW_SEGMENT_ENDS, magnitude, side="left")
    code = (segment << 4) | ((magnitude >> (segment + 1)) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code)
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def _build_alaw_decode() -> npt.NDArray[np.int16]:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    segment = (code >> 4) & 0x7
    mantissa = (code & 0x0F) << 4
    magnitude = np.where(
        segment == 0,
        mantissa + 8,
        (mantissa + 0x108) << np.maximum(segment - 1, 0),
    )
    linear = np.where(code & 0x80, magnitude, -magnitude)
    return linear.astype(np.int16)


def _build_alaw_encode() -> npt.NDArray[np.uint8]:
    value = _ALL_SAMPLES >> 3
    mask = np.where(value >= 0, 0xD5, 0x55)
    # One's-complement magnitude for negatives keeps the code table symmetric around zero.
    magnitude = np.where(value >= 0, value, -value - 1)
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, magnitude, side="left")
    shift = np.where(segment < 2, 1, segment)
    code = (segment << 4) | ((magnitude >> shift) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code)
    return ((code ^ mask) & 0xFF).astype(np.uint8)


_ULAW_DECODE = _build_ulaw_decode()
_ULAW_ENCODE = _build_ulaw_encode()
_ALAW_DECODE = _build_alaw_decode()
_ALAW_ENCODE = _build_alaw_encode()


def ulaw_encode(pcm: npt.NDArray[np.int16]) -> bytes:
    """Encode 16-bit PCM samples as G.711 μ-law, one byte per sample."""
    return _ULAW_ENCODE[np.asarray(pcm, dtype=np.int16).view(np.uint16)].tobytes()


def ulaw_decode(data: bytes) -> npt.NDArray[np.int16]:
    """Decode G.711 μ-law bytes to 16-bit PCM samples."""
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def alaw_encode(pcm: npt.NDArray[np.int16]) -> bytes:
    """Encode 16-bit PCM samples as G.711 A-law, one byte per sample."""
    return _ALAW_ENCODE[np.asarray(pcm, dtype=np.int16).view(np.uint16)].tobytes()


def alaw_decode(data: bytes) -> npt.NDArray[np.int16]:
    """Decode G.711 A-law bytes to 16-bit PCM samples."""
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]

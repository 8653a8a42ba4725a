"""The Realtime wire formats: decoding client audio and encoding reply audio."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hark.audio.codecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import AudioFormat, PcmaFormat, PcmFormat, PcmuFormat

Pcm = npt.NDArray[np.int16]
# audio/pcm is little-endian 16-bit (a dtype object: numpy parses a dtype string every call).
_WIRE_PCM = np.dtype("<i2")


def format_rate(fmt: AudioFormat) -> int:
    """Samples per second of a wire format."""
    return 24000 if isinstance(fmt, PcmFormat) else 8000


def decode_audio(fmt: AudioFormat, data: bytes, param: str = "audio") -> Pcm:
    """Wire bytes → int16 PCM at ``format_rate(fmt)``."""
    if isinstance(fmt, PcmFormat):
        if len(data) % 2:
            raise ProtocolError(
                "audio/pcm must hold whole 16-bit samples (an even number of bytes).", param
            )
        return np.frombuffer(data, dtype=_WIRE_PCM).astype(np.int16, copy=False)
    if isinstance(fmt, PcmuFormat):
        return ulaw_decode(data)
    return alaw_decode(data)


def encode_audio(fmt: AudioFormat, pcm: Pcm) -> bytes:
    """int16 PCM at ``format_rate(fmt)`` → wire bytes."""
    if isinstance(fmt, PcmFormat):
        return pcm.astype("<i2", copy=False).tobytes()
    if isinstance(fmt, PcmaFormat):
        return alaw_encode(pcm)
    return ulaw_encode(pcm)

"""libopus through ctypes: the variadic encoder requests reach it with their values."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from hark.audio.codecs import opus
from hark.audio.codecs.opus import OpusDecoder, OpusEncoder, OpusError

_GET_BITRATE = 4003
_GET_COMPLEXITY = 4011


def _get(encoder: OpusEncoder, request: int) -> int:
    value = ctypes.c_int32(-1)
    assert opus._lib.opus_encoder_ctl(encoder._state, request, ctypes.byref(value)) == 0
    return value.value


@pytest.mark.parametrize("complexity", [0, 1, 3, 10])
def test_the_encoder_has_the_settings_it_was_made_with(complexity: int) -> None:
    encoder = OpusEncoder(48000, bitrate=24000, complexity=complexity)
    assert _get(encoder, _GET_COMPLEXITY) == complexity
    assert _get(encoder, _GET_BITRATE) == 24000


def test_a_setting_libopus_refuses_is_an_error() -> None:
    with pytest.raises(OpusError, match="invalid argument"):
        OpusEncoder(48000, bitrate=32000, complexity=11)


def test_a_tone_survives_encode_and_decode() -> None:
    t = np.arange(48000) / 48000
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    encoder, decoder = OpusEncoder(48000, bitrate=32000, complexity=1), OpusDecoder(16000)
    decoded = np.concatenate([decoder.decode(encoder.encode(f)) for f in tone.reshape(-1, 960)])
    assert len(decoded) == 16000
    spectrum = np.abs(np.fft.rfft(decoded[4000:].astype(float)))
    assert abs(np.argmax(spectrum) * 16000 / 12000 - 440) <= 2

"""G.711 μ-law and A-law against the standard's reference values and Python's ``audioop``."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.codecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

ALL_CODES = bytes(range(256))
ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)

audioop: ModuleType | None
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        audioop = importlib.import_module("audioop")
    except ImportError:  # removed in Python 3.13
        audioop = None

needs_audioop = pytest.mark.skipif(audioop is None, reason="audioop was removed in Python 3.13")


@pytest.mark.parametrize(
    ("code", "linear"),
    [(0x00, -32124), (0x80, 32124), (0xFF, 0), (0x7F, 0), (0x7E, -8), (0xFE, 8), (0xEF, 132)],
)
def test_ulaw_decode_reference_values(code: int, linear: int) -> None:
    assert ulaw_decode(bytes([code])).tolist() == [linear]


@pytest.mark.parametrize(
    ("code", "linear"),
    [(0xD5, 8), (0x55, -8), (0xAA, 32256), (0x2A, -32256), (0xD4, 24), (0xC5, 264)],
)
def test_alaw_decode_reference_values(code: int, linear: int) -> None:
    assert alaw_decode(bytes([code])).tolist() == [linear]


def test_encode_reference_values() -> None:
    pcm = np.array([0, -8, 32767, -32768], dtype=np.int16)
    assert ulaw_encode(pcm) == bytes([0xFF, 0x7E, 0x80, 0x00])
    assert alaw_encode(pcm) == bytes([0xD5, 0x55, 0xAA, 0x2A])


@needs_audioop
def test_decode_matches_audioop_for_every_code() -> None:
    assert audioop is not None
    ulaw_ref = np.frombuffer(audioop.ulaw2lin(ALL_CODES, 2), dtype=np.int16)
    alaw_ref = np.frombuffer(audioop.alaw2lin(ALL_CODES, 2), dtype=np.int16)
    np.testing.assert_array_equal(ulaw_decode(ALL_CODES), ulaw_ref)
    np.testing.assert_array_equal(alaw_decode(ALL_CODES), alaw_ref)


@needs_audioop
def test_encode_matches_audioop_for_every_sample() -> None:
    assert audioop is not None
    assert ulaw_encode(ALL_SAMPLES) == audioop.lin2ulaw(ALL_SAMPLES.tobytes(), 2)
    assert alaw_encode(ALL_SAMPLES) == audioop.lin2alaw(ALL_SAMPLES.tobytes(), 2)


@pytest.mark.parametrize(
    ("encode", "decode", "full_scale"),
    [(ulaw_encode, ulaw_decode, 32124), (alaw_encode, alaw_decode, 32256)],
)
def test_round_trip_error_is_within_half_a_quantisation_step(
    encode: Callable[[npt.NDArray[np.int16]], bytes],
    decode: Callable[[bytes], npt.NDArray[np.int16]],
    full_scale: int,
) -> None:
    restored = decode(encode(ALL_SAMPLES)).astype(np.int32)
    original = ALL_SAMPLES.astype(np.int32)
    in_range = np.abs(original) <= full_scale
    error = np.abs(restored - original)[in_range]
    # Steps double with each segment, so the error grows with the magnitude: about 3 %.
    assert np.all(error <= np.abs(original[in_range]) / 32 + 8)
    assert restored.min() == -full_scale and restored.max() == full_scale


def test_decoding_then_encoding_gives_back_the_codes() -> None:
    assert alaw_encode(alaw_decode(ALL_CODES)) == ALL_CODES
    # μ-law has two zeros (0x7F, "negative zero", and 0xFF); zero encodes as 0xFF.
    expected = ALL_CODES.replace(b"\x7f", b"\xff")
    assert ulaw_encode(ulaw_decode(ALL_CODES)) == expected


def test_empty_input() -> None:
    empty = np.zeros(0, dtype=np.int16)
    assert ulaw_encode(empty) == b"" and alaw_encode(empty) == b""
    assert ulaw_decode(b"").dtype == np.int16 and ulaw_decode(b"").size == 0
    assert alaw_decode(b"").size == 0

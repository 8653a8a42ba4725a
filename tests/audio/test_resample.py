"""Streaming and one-shot resampling: frequency, length, chunk boundaries, identity."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.resample import StreamResampler, resample


def sine(
    frequency: float, rate: int, seconds: float, amplitude: float = 0.5
) -> npt.NDArray[np.float32]:
    t = np.arange(round(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def peak_frequency(signal: npt.NDArray[Any], rate: int) -> float:
    samples = signal.astype(np.float64) * np.hanning(signal.size)
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(signal.size, 1 / rate)[int(np.argmax(spectrum))])


def stream_in_chunks(
    resampler: StreamResampler, signal: npt.NDArray[Any], chunk: int
) -> npt.NDArray[Any]:
    pieces = [resampler.process(signal[i : i + chunk]) for i in range(0, signal.size, chunk)]
    pieces.append(resampler.flush())
    return np.concatenate(pieces)


RATE_PAIRS = [
    (24000, 16000),
    (16000, 24000),
    (8000, 16000),
    (16000, 8000),
    (8000, 24000),
    (24000, 8000),
    (22050, 24000),
    (48000, 24000),
]


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_one_shot_keeps_frequency_and_duration(in_rate: int, out_rate: int) -> None:
    signal = (sine(1000, in_rate, 1.0) * 32767).astype(np.int16)
    out = resample(signal, in_rate, out_rate)
    assert out.dtype == np.int16
    assert out.size == round(signal.size * out_rate / in_rate)
    assert peak_frequency(out, out_rate) == pytest.approx(1000, abs=2)
    # The level survives: no attenuation in the passband.
    rms_in = np.sqrt(np.mean(signal.astype(np.float64) ** 2))
    rms_out = np.sqrt(np.mean(out.astype(np.float64) ** 2))
    assert rms_out == pytest.approx(rms_in, rel=0.02)


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
@pytest.mark.parametrize("dtype", [np.int16, np.float32])
def test_chunked_stream_matches_one_shot(in_rate: int, out_rate: int, dtype: type) -> None:
    rng = np.random.default_rng(1)
    signal = sine(440, in_rate, 1.0) + sine(2500, in_rate, 1.0, 0.2)
    signal += rng.normal(0, 0.01, signal.size).astype(np.float32)
    if dtype is np.int16:
        signal_typed: npt.NDArray[Any] = (signal * 32767).astype(np.int16)
        scale = 32767.0
    else:
        signal_typed = signal
        scale = 1.0
    chunked = stream_in_chunks(StreamResampler(in_rate, out_rate), signal_typed, in_rate // 50)
    whole = resample(signal_typed, in_rate, out_rate)
    assert chunked.dtype == dtype
    assert abs(chunked.size - whole.size) <= 1
    n = min(chunked.size, whole.size)
    difference = np.abs(chunked[:n].astype(np.float64) - whole[:n].astype(np.float64)) / scale
    assert difference.max() < 2e-3


def test_chunk_boundaries_leave_no_clicks() -> None:
    in_rate, out_rate = 24000, 16000
    signal = sine(1000, in_rate, 1.0)
    # Odd, uneven chunk sizes, as a network would deliver them.
    sizes = [480, 1, 317, 960, 7, 480, 2000]
    pieces: list[npt.NDArray[Any]] = []
    start, turn = 0, 0
    resampler = StreamResampler(in_rate, out_rate)
    while start < signal.size:
        size = sizes[turn % len(sizes)]
        pieces.append(resampler.process(signal[start : start + size]))
        start, turn = start + size, turn + 1
    pieces.append(resampler.flush())
    out = np.concatenate(pieces)
    expected = sine(1000, out_rate, 1.0)
    assert out.size == expected.size
    # Away from the stream's two ends the output is the ideal sine, sample for sample.
    middle = slice(200, -200)
    assert np.abs(out[middle] - expected[middle]).max() < 5e-3


def test_equal_rates_pass_chunks_through_without_a_copy() -> None:
    resampler = StreamResampler(16000, 16000)
    chunk = (sine(300, 16000, 0.02) * 1000).astype(np.int16)
    assert resampler.process(chunk) is chunk
    assert resampler.flush().size == 0
    assert resample(chunk, 16000, 16000) is chunk


def test_flush_starts_a_new_stream() -> None:
    resampler = StreamResampler(8000, 16000)
    signal = (sine(500, 8000, 0.5) * 10000).astype(np.int16)
    first = stream_in_chunks(resampler, signal, 160)
    second = stream_in_chunks(resampler, signal, 160)
    np.testing.assert_array_equal(first, second)
    assert resampler.flush().size == 0


def test_output_arrives_while_streaming_not_only_at_flush() -> None:
    resampler = StreamResampler(24000, 16000)
    signal = sine(1000, 24000, 1.0)
    streamed = sum(resampler.process(signal[i : i + 480]).size for i in range(0, 24000, 480))
    assert streamed > 0.9 * 16000


def test_a_stream_keeps_one_sample_type() -> None:
    resampler = StreamResampler(24000, 16000)
    resampler.process(np.zeros(480, dtype=np.int16))
    with pytest.raises(TypeError):
        resampler.process(np.zeros(480, dtype=np.float32))
    assert resampler.flush().dtype == np.int16


def test_rejects_bad_input() -> None:
    with pytest.raises(TypeError):
        resample(np.zeros(10, dtype=np.float64), 16000, 8000)  # type: ignore[type-var]
    with pytest.raises(ValueError):
        resample(np.zeros((10, 2), dtype=np.int16), 16000, 8000)
    with pytest.raises(ValueError):
        StreamResampler(0, 16000)


def test_non_contiguous_input_is_accepted() -> None:
    signal = (sine(1000, 16000, 0.5) * 10000).astype(np.int16)
    strided = np.repeat(signal, 2)[::2]
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(resample(strided, 16000, 8000), resample(signal, 16000, 8000))

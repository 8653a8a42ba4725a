"""The streaming RNNoise denoiser: the sample count, the delay, and what it takes out."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.denoise import Denoiser
from tests.speech import spoken

SPEECH = "Could you tell me what the capital of France is, and how many people live there?"


def speech(rate: int) -> npt.NDArray[np.int16]:
    """A spoken sentence at ``rate``."""
    return spoken(SPEECH, rate)


def white_noise(samples: int, rms: float, seed: int = 1) -> npt.NDArray[np.int16]:
    """Gaussian noise of ``rms`` (full scale 1)."""
    noise = np.random.default_rng(seed).normal(0.0, rms * 32768, samples)
    return np.clip(noise, -32768, 32767).astype(np.int16)


def run(denoiser: Denoiser, pcm: npt.NDArray[np.int16], chunk: int) -> npt.NDArray[np.int16]:
    """Stream ``pcm`` through ``denoiser`` in chunks of ``chunk`` samples."""
    return np.concatenate([denoiser.process(pcm[i : i + chunk]) for i in range(0, len(pcm), chunk)])


def rms_db(pcm: npt.NDArray[np.int16]) -> float:
    """The level of ``pcm`` in dB below full scale."""
    samples = pcm.astype(np.float64) / 32768
    return float(10 * np.log10(np.mean(samples**2) + 1e-20))


def lag_of(output: npt.NDArray[np.int16], source: npt.NDArray[np.int16], most: int) -> int:
    """The delay (in samples, up to ``most``) at which ``output`` best matches ``source``."""
    out = output.astype(np.float64)
    src = source.astype(np.float64)
    scores = [float(np.dot(out[k:], src[: len(out) - k])) for k in range(most)]
    return int(np.argmax(scores))


@pytest.mark.parametrize(("rate", "chunk"), [(24000, 480), (24000, 333), (8000, 160), (16000, 1)])
def test_each_chunk_comes_back_as_long_as_it_went_in(rate: int, chunk: int) -> None:
    denoiser = Denoiser(rate)
    pcm = speech(rate)[: rate // 2]
    for start in range(0, len(pcm), chunk):
        piece = pcm[start : start + chunk]
        assert len(denoiser.process(piece)) == len(piece)


@pytest.mark.parametrize(("rate", "wet"), [(24000, 1.0), (8000, 1.0), (24000, 0.5)])
def test_speech_comes_through_21_ms_late(rate: int, wet: float) -> None:
    """Clean speech passes nearly unchanged, late by RNNoise's two frames and the first
    millisecond, when the chunks are whole 10 ms (what clients send). Mixed with the input,
    it lines up with it: two copies a frame apart would not match the input this well."""
    pcm = speech(rate)
    out = run(Denoiser(rate, wet), pcm, rate // 50)
    lag = lag_of(out, pcm, rate // 20)
    assert lag == pytest.approx(0.021 * rate, abs=2)
    matched = out[lag:].astype(np.float64)
    source = pcm[: len(pcm) - lag].astype(np.float64)
    correlation = np.dot(matched, source) / np.sqrt(
        np.dot(matched, matched) * np.dot(source, source)
    )
    assert correlation > 0.98


def test_dry_output_is_the_input_delayed() -> None:
    """With no denoised share, the output is the input exactly, only later: the dry path is
    held back as long as the denoised one, so a mix of the two lines up."""
    pcm = speech(24000)
    denoiser = Denoiser(24000, wet=0.0)
    out = run(denoiser, pcm, 480)
    lag = lag_of(out, pcm, 1200)
    assert lag > 0
    # The resampling round trip (cubic, 24 → 48 → 24 kHz) is all that differs.
    error = out[lag:].astype(np.float64) - pcm[: len(pcm) - lag]
    assert 10 * np.log10(np.sum(error**2) / np.sum(pcm.astype(np.float64) ** 2)) < -30


def test_white_noise_is_taken_down() -> None:
    noise = white_noise(24000 * 2, 0.03)
    denoiser = Denoiser(24000)
    out = run(denoiser, noise, 480)
    # The first half second is the network settling on the noise.
    assert rms_db(out[12000:]) < rms_db(noise) - 20


def test_the_denoised_share_sets_how_far_noise_goes_down() -> None:
    noise = white_noise(24000 * 2, 0.03)
    full = run(Denoiser(24000, wet=1.0), noise, 480)[12000:]
    gentle = run(Denoiser(24000, wet=0.9), noise, 480)[12000:]
    assert rms_db(full) < rms_db(gentle) - 5
    # A tenth of the input mixed back in: the floor is 20 dB down, near enough.
    assert rms_db(gentle) == pytest.approx(rms_db(noise) - 20, abs=2)


def test_state_carries_across_calls() -> None:
    """The same audio in different chunkings gives the same output once the chunks are whole
    frames: nothing restarts at a call's edge."""
    pcm = speech(24000)
    by_20ms = run(Denoiser(24000), pcm, 480)
    by_10ms = run(Denoiser(24000), pcm, 240)
    np.testing.assert_array_equal(by_20ms, by_10ms)


def test_a_closed_denoiser_refuses_audio() -> None:
    denoiser = Denoiser(24000)
    denoiser.close()
    with pytest.raises(RuntimeError):
        denoiser.process(np.zeros(480, np.int16))

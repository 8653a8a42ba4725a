"""Silero VAD as batched matrix products: the same answers as ONNX Runtime, row by row."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines.vad import silero_gemm
from hark.engines.vad.silero import (
    STATE_SIZE,
    context_samples,
    initial_states,
    load_session,
    model_path,
    run_batch,
)

from .conftest import Say
from .tolerances import assert_probabilities_close, assert_states_close


@pytest.fixture(scope="module")
def models() -> dict[int, silero_gemm.SileroGemm]:
    return silero_gemm.load(model_path())


def streams(say: Say, rate: int) -> npt.NDArray[np.float32]:
    """Three different streams at ``rate``: two questions and quiet noise, with pauses."""
    import soxr

    gap = np.zeros(4000, dtype=np.float32)
    spoken = [
        np.concatenate((gap, say("What is the capital of France?"), gap)),
        np.concatenate((say("Tell me a joke about penguins, please."), gap, gap)),
        (0.003 * np.random.default_rng(1).standard_normal(40000)).astype(np.float32),
    ]
    chunk = rate * 32 // 1000
    resampled = [soxr.resample(audio, 16000, rate).astype(np.float32) for audio in spoken]
    length = min(len(audio) for audio in resampled) // chunk * chunk
    return np.stack([audio[:length] for audio in resampled])


@pytest.mark.parametrize("spectrum", ["fft", "product"])
@pytest.mark.parametrize("rate", [16000, 8000])
def test_same_probabilities_and_states_as_onnx_runtime(
    models: dict[int, silero_gemm.SileroGemm], say: Say, rate: int, spectrum: str
) -> None:
    """Both run the streams chunk by chunk, each carrying its own state forward.

    The STFT is a real FFT of Hann-windowed frames when the model's basis is that DFT (it is,
    at both rates), else the product with the basis; both must match.
    """
    model = copy.copy(models[rate])
    assert model._window is not None
    if spectrum == "product":
        model._window = None
    session = load_session()
    audio = streams(say, rate)
    rows, chunk, context = len(audio), rate * 32 // 1000, context_samples(rate)
    ours, theirs = initial_states(rows), initial_states(rows)
    previous = np.zeros((rows, context), dtype=np.float32)
    ours_p, theirs_p = [], []
    for start in range(0, audio.shape[1], chunk):
        windows = np.concatenate((previous, audio[:, start : start + chunk]), axis=1)
        probabilities, ours = model.run(windows, ours)
        reference, theirs = run_batch(session, windows, theirs, rate)
        ours_p.append(probabilities)
        theirs_p.append(reference)
        previous = windows[:, -context:]
    ours_all, theirs_all = np.array(ours_p), np.array(theirs_p)
    assert ours_all.shape == (audio.shape[1] // chunk, rows)
    assert_probabilities_close(ours_all, theirs_all)
    assert_states_close(ours, theirs)
    # The comparison is meaningful: the streams heard speech and the noise did not.
    assert theirs_all[:, 0].max() > 0.9 and theirs_all[:, 1].max() > 0.9
    assert theirs_all[:, 2].max() < 0.2


def test_a_row_does_not_depend_on_its_batch(models: dict[int, silero_gemm.SileroGemm]) -> None:
    model = models[16000]
    rng = np.random.default_rng(2)
    windows = (0.2 * rng.standard_normal((9, model.window))).astype(np.float32)
    states = (0.5 * rng.standard_normal((2, 9, STATE_SIZE))).astype(np.float32)
    together, together_states = model.run(windows, states)
    for row in range(9):
        alone, alone_states = model.run(windows[row : row + 1], states[:, row : row + 1])
        assert_probabilities_close(alone[0], together[row])
        assert_states_close(alone_states[:, 0], together_states[:, row])


def test_wrong_shapes_are_refused(models: dict[int, silero_gemm.SileroGemm]) -> None:
    model = models[8000]
    with pytest.raises(ValueError, match=r"\[B, 288\]"):
        model.run(np.zeros((2, 576), np.float32), initial_states(2))
    with pytest.raises(ValueError, match="states"):
        model.run(np.zeros((2, 288), np.float32), initial_states(3))


def test_a_file_that_is_not_the_silero_model_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x0a\x05hello\xff")
    with pytest.raises(silero_gemm.SileroFormatError):
        silero_gemm.load(garbage)
    # A well-formed protobuf without a graph is refused too.
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"\x08\x07")
    with pytest.raises(silero_gemm.SileroFormatError, match="no graph"):
        silero_gemm.load(empty)


def test_a_basis_that_is_not_a_hann_dft_keeps_the_product() -> None:
    n = 16
    angle = 2 * np.pi * np.outer(np.arange(n), np.arange(n // 2 + 1)) / n
    plain = np.concatenate((np.cos(angle), -np.sin(angle)), axis=1).astype(np.float32)
    assert silero_gemm._dft_window(plain) is None
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)
    window = silero_gemm._dft_window((plain * hann[:, None]).astype(np.float32))
    assert window is not None
    # The window is the float64 one rounded to float32: half an ulp, under 6e-8 below 1.
    np.testing.assert_allclose(window, hann, atol=1e-7)

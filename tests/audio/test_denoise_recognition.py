"""What noise_reduction is for: Whisper hears a question in hiss better once it is denoised.

A model comparison on one clip, not a timing: the sky question under white noise at 10 dB
SNR, as ``hark bench denoise`` mixes it, transcribed with and without the session's
denoiser. docs/performance.md has the whole table, where denoising also loses (babble).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hark.bench.denoise import denoised, mix, noise, transcript
from hark.bench.spoken_questions import RATE
from hark.bench.word_alignment import align, words
from hark.engines.asr.whisper import WhisperAsr
from tests.speech import spoken

pytestmark = pytest.mark.slow

QUESTION = "What color is the sky on a clear day?"


@pytest.fixture
async def whisper() -> AsyncIterator[WhisperAsr]:
    """The bundled Whisper tiny.en, loaded."""
    asr = WhisperAsr(workers=1)
    await asr.warmup()
    yield asr
    asr.close()


async def test_denoised_speech_in_hiss_is_heard_with_fewer_errors(whisper: WhisperAsr) -> None:
    clean = spoken(QUESTION, RATE)
    noisy = mix(clean, noise("white", len(clean), seed=2), snr_db=10.0)
    errors = {}
    for mode in ("off", "near_field"):
        heard = await transcript(whisper, denoised(noisy, mode)[0])
        errors[mode] = align(words(QUESTION), words(heard)).errors
    assert errors["near_field"] < errors["off"], errors

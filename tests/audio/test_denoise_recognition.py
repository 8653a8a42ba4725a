"""What noise_reduction is for: Whisper hears a question in hiss better once it is denoised.

A model comparison, not a timing: six of the spoken questions under pink noise at 10 dB SNR,
as ``hark bench denoise`` mixes them, transcribed with and without the session's denoiser,
their word errors summed (one clip is too close a call: another test run before it in the
same process was seen to tip it). docs/performance.md has the whole table, where denoising
also loses (babble, 0 dB).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hark.bench.denoise import denoised, mix, noise, transcript
from hark.bench.spoken_questions import QUESTIONS, RATE
from hark.bench.word_alignment import align, words
from hark.engines.asr.whisper import WhisperAsr
from tests.speech import spoken

pytestmark = pytest.mark.slow


@pytest.fixture
async def whisper() -> AsyncIterator[WhisperAsr]:
    """The bundled Whisper tiny.en, loaded."""
    asr = WhisperAsr(workers=1)
    await asr.warmup()
    yield asr
    asr.close()


async def test_denoised_speech_in_noise_is_heard_with_fewer_errors(whisper: WhisperAsr) -> None:
    errors = {"off": 0, "near_field": 0}
    for seed, question in enumerate(QUESTIONS[:6], start=2):
        clean = spoken(question, RATE)
        noisy = mix(clean, noise("pink", len(clean), seed=seed), snr_db=10.0)
        for mode in errors:
            heard = await transcript(whisper, denoised(noisy, mode)[0])
            errors[mode] += align(words(question), words(heard)).errors
    assert errors["near_field"] < errors["off"], errors

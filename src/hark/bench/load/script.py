"""The session script every simulated caller plays: questions and quiet, as append events."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hark.bench.spoken_questions import RATE, SpokenQuestion

# Quiet room noise between words (about -60 dBFS), so the VAD hears a live microphone.
NOISE_LEVEL = 30.0
_NOISE_VARIANTS = 16


@dataclass
class ScriptedQuestion:
    """One question cut into ``input_audio_buffer.append`` events."""

    text: str
    frames: list[str]
    # Index (within ``frames``) of the chunk holding the last voiced sample.
    last_voiced_chunk: int


@dataclass
class Script:
    """The pre-encoded ``input_audio_buffer.append`` events every caller draws from."""

    chunk_ms: int
    questions: list[ScriptedQuestion]
    silence: list[str]


def _append_event(pcm: npt.NDArray[np.int16]) -> str:
    audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
    return f'{{"type":"input_audio_buffer.append","audio":"{audio}"}}'


def build_script(questions: Sequence[SpokenQuestion], chunk_ms: int, seed: int = 0) -> Script:
    """Questions and quiet noise cut into ``chunk_ms`` chunks, each already a JSON event.

    Encoding once keeps the generator's own cost per chunk to a send.
    """
    size = RATE * chunk_ms // 1000
    rng = np.random.default_rng(seed)
    silence = [
        _append_event((NOISE_LEVEL * rng.standard_normal(size)).astype(np.int16))
        for _ in range(_NOISE_VARIANTS)
    ]
    cut = []
    for question in questions:
        count = -(-len(question.pcm) // size)
        padded = np.zeros(count * size, dtype=np.int16)
        padded[: len(question.pcm)] = question.pcm
        padded += (NOISE_LEVEL * rng.standard_normal(len(padded))).astype(np.int16)
        frames = [_append_event(padded[i * size : (i + 1) * size]) for i in range(count)]
        cut.append(ScriptedQuestion(question.text, frames, max(0, question.last_voiced) // size))
    return Script(chunk_ms, cut, silence)

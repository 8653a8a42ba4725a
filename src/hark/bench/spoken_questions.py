"""Spoken questions for the benchmarks: short, complete questions, synthesised once with Piper.

Each question is spoken by Piper, resampled to 24 kHz and cached as a WAV file under
``$XDG_CACHE_HOME/hark/bench`` (``~/.cache/hark/bench``), keyed by its text, voice and rate, so
only the first run pays for the synthesis. The index of the last voiced sample is found from
the signal's energy: voice-to-voice latency starts when that sample is sent.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.engines.tts import TtsEngine

RATE = 24000

QUESTIONS: tuple[str, ...] = (
    "What is the capital of France?",
    "How many days are in a week?",
    "What color is the sky on a clear day?",
    "Who wrote Romeo and Juliet?",
    "What is two plus two?",
    "How many legs does a spider have?",
    "What is the largest planet in our solar system?",
    "Can you name a fruit that is yellow?",
    "What do bees make?",
    "Which ocean is the biggest?",
    "How many minutes are in an hour?",
    "What is the opposite of hot?",
)

# A 10 ms frame is voiced when its RMS is within this many dB of the loudest frame's: 40 dB
# keeps the quiet tail of a final fricative ("France?") and drops Piper's trailing hiss.
VOICED_FLOOR_DB = 40.0
_FRAME_S = 0.01
# Bump when the synthesis or the file layout changes, so that old cache entries are not used.
_CACHE_VERSION = "1"


def audio_session(**audio_input: Any) -> dict[str, Any]:
    """A ``session.update``'s session that speaks the questions' audio (PCM at :data:`RATE`)
    and hears audio replies in the same format; ``audio_input`` adds to the input's
    settings (turn detection, transcription)."""
    pcm = {"type": "audio/pcm", "rate": RATE}
    return {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {"input": {"format": pcm, **audio_input}, "output": {"format": pcm}},
    }


@dataclass(frozen=True)
class SpokenQuestion:
    """One question as 24 kHz int16 speech, with the index of its last voiced sample."""

    text: str
    pcm: npt.NDArray[np.int16]
    last_voiced: int

    @property
    def duration_s(self) -> float:
        """How long it takes to say."""
        return len(self.pcm) / RATE


def last_voiced_sample(
    pcm: npt.NDArray[np.int16], rate: int, floor_db: float = VOICED_FLOOR_DB
) -> int:
    """The index of the last sample of the last voiced 10 ms frame of ``pcm``; -1 if silent.

    A frame is voiced when its RMS is at most ``floor_db`` below the loudest frame's RMS.
    """
    frame = max(1, round(rate * _FRAME_S))
    count = -(-len(pcm) // frame)
    if count == 0:
        return -1
    padded = np.zeros(count * frame, np.float64)
    padded[: len(pcm)] = pcm
    rms = np.sqrt(np.mean(padded.reshape(count, frame) ** 2, axis=1))
    loudest = float(rms.max())
    if loudest == 0.0:
        return -1
    voiced = np.flatnonzero(rms >= loudest * 10 ** (-floor_db / 20))
    return min(len(pcm), (int(voiced[-1]) + 1) * frame) - 1


def default_cache_dir() -> Path:
    """Where synthesised questions are kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hark" / "bench"


async def spoken_questions(
    texts: Sequence[str] = QUESTIONS,
    cache_dir: Path | None = None,
    voice: str | None = None,
) -> list[SpokenQuestion]:
    """``texts`` spoken at 24 kHz, from the cache or synthesised with Piper (and cached).

    ``voice`` is a Piper ``.onnx`` voice file; the piper extra's voice when omitted.
    """
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    tts: TtsEngine | None = None
    questions = []
    for text in texts:
        path = cache_path(directory, text, voice)
        pcm = read_wav(path) if path.exists() else None
        if pcm is None:
            if tts is None:
                from hark.engines.tts.piper import PiperTts

                tts = PiperTts(model_path=voice)
            pcm = await _synthesize(tts, text)
            write_question(path, pcm)
        questions.append(SpokenQuestion(text, pcm, last_voiced_sample(pcm, RATE)))
    return questions


def cache_path(directory: Path, text: str, voice: str | None = None) -> Path:
    """Where ``text`` spoken by ``voice`` is cached in ``directory``: a recording placed
    there (24 kHz mono 16-bit, ``write_question``) is used instead of synthesising."""
    voice_name = Path(voice).name if voice is not None else "piper-default"
    digest = hashlib.sha256(f"{_CACHE_VERSION}\n{voice_name}\n{RATE}\n{text}".encode())
    return directory / f"{digest.hexdigest()[:24]}.wav"


async def _synthesize(tts: TtsEngine, text: str) -> npt.NDArray[np.int16]:
    from hark.audio.resample import resample

    chunks = [chunk async for chunk in tts.synthesize(text)]
    if not chunks:
        raise RuntimeError(f"Piper produced no audio for {text!r}")
    return resample(np.concatenate(chunks), tts.sample_rate, RATE)


def read_wav(path: Path) -> npt.NDArray[np.int16] | None:
    """The samples of a cached file; None when it is unreadable or not 24 kHz mono 16-bit."""
    try:
        with wave.open(str(path), "rb") as wav:
            if (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) != (1, 2, RATE):
                return None
            frames = wav.readframes(wav.getnframes())
    except (OSError, EOFError, wave.Error):
        return None
    pcm = np.frombuffer(frames, dtype="<i2").astype(np.int16)
    return pcm if pcm.size else None


def write_question(path: Path, pcm: npt.NDArray[np.int16]) -> None:
    """Cache ``pcm`` (24 kHz) at ``path``, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside and renamed, so that a concurrent run never reads half a file.
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".wav.tmp")
    try:
        with os.fdopen(handle, "wb") as raw, wave.open(raw, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(RATE)
            wav.writeframes(pcm.astype("<i2").tobytes())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

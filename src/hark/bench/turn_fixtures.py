"""The fixtures of ``hark bench turns`` and its backchannel trials: the spec of voices and
turns (``turns_fixtures.toml``), each turn's labels, and the synthesiser that says them with
the spec's voices (Piper, espeak-ng) over noise, cached as WAV files."""

from __future__ import annotations

import asyncio
import hashlib
import math
import shutil
import subprocess
import tempfile
import tomllib
import wave
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from hark.bench.monologues import first_voiced_sample
from hark.bench.report import BenchError
from hark.bench.spoken_questions import (
    RATE,
    default_cache_dir,
    last_voiced_sample,
    read_wav,
    write_question,
)

SPEC_PATH = Path(__file__).with_name("turns_fixtures.toml")
# Bump when the synthesis changes, so that old cache entries are not used.
_CACHE_VERSION = "1"
_ESPEAK_WPM = 175


# ---------------------------------------------------------------------------- the spec


@dataclass(frozen=True, slots=True)
class Voice:
    """A voice of the spec: ``engine`` piper (the piper extra's voice, or the ``.onnx`` file
    ``id``) or espeak-ng (``id`` an espeak-ng voice name such as ``en-us+f3``)."""

    name: str
    engine: Literal["piper", "espeak-ng"]
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Turn:
    """A turn of the spec: ``segments`` said one after another with ``pauses_ms`` of silence
    between them; it ends with the last segment."""

    id: str
    kind: str
    segments: tuple[str, ...]
    pauses_ms: tuple[int, ...] = ()
    context: str | None = None

    @property
    def paused(self) -> bool:
        """Whether the turn has mid-utterance pauses."""
        return bool(self.pauses_ms)


@dataclass(frozen=True, slots=True)
class Spec:
    """The fixture spec: voices, turns, rates, noise levels and the silence around turns."""

    voices: tuple[Voice, ...]
    turns: tuple[Turn, ...]
    rates: tuple[float, ...]
    snr_db: tuple[float, ...]
    lead_ms: int
    tail_ms: int


@dataclass(frozen=True, slots=True)
class FixtureSpec:
    """One turn said by one voice at one rate over one noise level."""

    turn: Turn
    voice: Voice
    rate: float
    snr_db: float

    @property
    def name(self) -> str:
        """A name that says all of it, e.g. ``card/piper-joe/x0.85/20dB``."""
        noise = "clean" if math.isinf(self.snr_db) else f"{self.snr_db:g}dB"
        return f"{self.turn.id}/{self.voice.name}/x{self.rate:g}/{noise}"


def load_spec(path: Path = SPEC_PATH) -> Spec:
    """The spec at ``path``; raises ``ValueError`` naming what is malformed."""
    with path.open("rb") as file:
        raw = tomllib.load(file)
    voices = tuple(_voice(v) for v in raw.get("voice", []))
    turns = tuple(_turn(t) for t in raw.get("turn", []))
    rates = tuple(float(r) for r in raw.get("rates", [1.0]))
    snr_db = tuple(float(s) for s in raw.get("snr_db", [math.inf]))
    lead_ms, tail_ms = int(raw.get("lead_ms", 500)), int(raw.get("tail_ms", 9000))
    if not voices or not turns:
        raise ValueError(f"{path}: needs at least one [[voice]] and one [[turn]]")
    for kind, names in (("voice", [v.name for v in voices]), ("turn", [t.id for t in turns])):
        if len(set(names)) != len(names):
            raise ValueError(f"{path}: {kind} names must be unique")
    if not rates or min(rates) <= 0:
        raise ValueError(f"{path}: rates must be positive")
    if not snr_db or any(math.isnan(s) for s in snr_db):
        raise ValueError(f"{path}: snr_db must be numbers (inf for clean)")
    if lead_ms < 0 or tail_ms <= 0:
        raise ValueError(f"{path}: lead_ms must be at least 0 and tail_ms above 0")
    return Spec(voices, turns, rates, snr_db, lead_ms, tail_ms)


def _voice(raw: Mapping[str, Any]) -> Voice:
    engine = raw.get("engine")
    name = raw.get("name")
    if engine not in ("piper", "espeak-ng") or not isinstance(name, str) or not name:
        raise ValueError(f"a voice needs a name and engine piper or espeak-ng: {dict(raw)}")
    voice_id = raw.get("id")
    if engine == "espeak-ng" and not isinstance(voice_id, str):
        raise ValueError(f"espeak-ng voice {name!r} needs an id (an espeak-ng voice name)")
    return Voice(name, engine, voice_id)


def _turn(raw: Mapping[str, Any]) -> Turn:
    turn_id = raw.get("id")
    segments = raw.get("segments")
    pauses = raw.get("pauses_ms", [])
    if not isinstance(turn_id, str) or not turn_id or "/" in turn_id:
        raise ValueError(f"a turn needs an id without '/': {dict(raw)}")
    if (
        not isinstance(segments, list)
        or not segments
        or not all(isinstance(s, str) and s.strip() for s in segments)
    ):
        raise ValueError(f"turn {turn_id!r}: segments must be a list of texts")
    if not isinstance(pauses, list) or len(pauses) != len(segments) - 1:
        raise ValueError(f"turn {turn_id!r}: one pause (pauses_ms) between each two segments")
    if not all(isinstance(p, int) and p > 0 for p in pauses):
        raise ValueError(f"turn {turn_id!r}: pauses are positive milliseconds")
    context = raw.get("context")
    if context is not None and not isinstance(context, str):
        raise ValueError(f"turn {turn_id!r}: context is the assistant's message, a text")
    kind = str(raw.get("kind", "paused" if pauses else "complete"))
    return Turn(turn_id, kind, tuple(segments), tuple(pauses), context)


def fixture_specs(
    spec: Spec, voices: Sequence[str] | None = None, turns: Sequence[str] | None = None
) -> list[FixtureSpec]:
    """Every turn by every voice, the rate and noise level rotating (see the spec file);
    ``voices`` and ``turns`` keep only those named (the rotation stays that of the whole
    spec, so a fixture is the same whichever others are run)."""
    for wanted, known in (
        (voices, {v.name for v in spec.voices}),
        (turns, {t.id for t in spec.turns}),
    ):
        unknown = set(wanted or ()) - known
        if unknown:
            raise BenchError(f"not in the spec: {', '.join(sorted(unknown))}")
    result = []
    for t, turn in enumerate(spec.turns):
        if turns is not None and turn.id not in turns:
            continue
        for v, voice in enumerate(spec.voices):
            if voices is not None and voice.name not in voices:
                continue
            rate = spec.rates[(t + v) % len(spec.rates)]
            snr = spec.snr_db[(t + 2 * v) % len(spec.snr_db)]
            result.append(FixtureSpec(turn, voice, rate, snr))
    return result


@dataclass(frozen=True, slots=True)
class Labels:
    """Where a fixture's turn really ends, and its mid-utterance pauses (start, end), in ms
    from the fixture's start."""

    end_ms: float
    pauses: tuple[tuple[float, float], ...] = ()


# ---------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Fixture:
    """A fixture's audio (24 kHz int16) and its labels."""

    spec: FixtureSpec
    pcm: npt.NDArray[np.int16]
    labels: Labels

    @property
    def name(self) -> str:
        """The fixture spec's name."""
        return self.spec.name


class Synthesiser:
    """Speaks segments with the spec's voices, caching each as a 24 kHz WAV file."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.cache_dir = (cache_dir or default_cache_dir()) / "turns"
        self._piper: dict[str | None, Any] = {}

    async def segment(self, text: str, voice: Voice, rate: float) -> npt.NDArray[np.int16]:
        """``text`` said by ``voice`` at ``rate``, trimmed to its voiced samples."""
        key = f"{_CACHE_VERSION}\n{voice.engine}\n{voice.id}\n{rate:g}\n{text}"
        path = self.cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.wav"
        pcm = read_wav(path)
        if pcm is None:
            if voice.engine == "piper":
                pcm = await self._piper_say(text, voice, rate)
            else:
                pcm = await asyncio.to_thread(_espeak_say, text, voice, rate)
            write_question(path, pcm)
        first = first_voiced_sample(pcm, RATE)
        last = last_voiced_sample(pcm, RATE)
        if last < first:
            raise BenchError(f"{voice.name} said nothing for {text!r}")
        return pcm[first : last + 1]

    async def _piper_say(self, text: str, voice: Voice, rate: float) -> npt.NDArray[np.int16]:
        from hark.audio.resample import resample

        tts = self._piper.get(voice.id)
        if tts is None:
            from hark.engines.tts.piper import PiperTts

            tts = self._piper[voice.id] = PiperTts(model_path=voice.id)
        chunks = [chunk async for chunk in tts.synthesize(text, speed=rate)]
        if not chunks:
            raise BenchError(f"Piper produced no audio for {text!r}")
        out: npt.NDArray[np.int16] = resample(np.concatenate(chunks), tts.sample_rate, RATE)
        return out

    async def fixture(self, spec: FixtureSpec, lead_ms: int, tail_ms: int) -> Fixture:
        """The fixture's audio: its segments joined by their pauses, with the lead and tail
        of silence, and noise over all of it; labelled from the spec."""
        parts: list[npt.NDArray[np.int16]] = [_silence(lead_ms)]
        pauses = []
        at = len(parts[0])
        for index, text in enumerate(spec.turn.segments):
            if index:
                gap = _silence(spec.turn.pauses_ms[index - 1])
                pauses.append((at * 1000 / RATE, (at + len(gap)) * 1000 / RATE))
                parts.append(gap)
                at += len(gap)
            speech = await self.segment(text, spec.voice, spec.rate)
            parts.append(speech)
            at += len(speech)
        end_ms = at * 1000 / RATE
        parts.append(_silence(tail_ms))
        clean = np.concatenate(parts)
        pcm = add_noise(clean, spec.snr_db, seed=spec.name)
        return Fixture(spec, pcm, Labels(end_ms, tuple(pauses)))


def _silence(ms: float) -> npt.NDArray[np.int16]:
    return np.zeros(round(ms * RATE / 1000), np.int16)


def _espeak_say(text: str, voice: Voice, rate: float) -> npt.NDArray[np.int16]:
    from hark.audio.resample import resample

    binary = shutil.which("espeak-ng")
    if binary is None:
        raise BenchError(
            f"voice {voice.name} needs espeak-ng (apt-get install espeak-ng), or leave it out "
            "with --voices"
        )
    assert voice.id is not None
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "say.wav"
        wpm = str(round(_ESPEAK_WPM * rate))
        subprocess.run(
            [binary, "-v", voice.id, "-s", wpm, "-w", str(out), text],
            check=True,
            capture_output=True,
            timeout=60,
        )
        with wave.open(str(out), "rb") as wav:
            source_rate = wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    pcm = np.frombuffer(frames, dtype="<i2").astype(np.int16)
    resampled: npt.NDArray[np.int16] = resample(pcm, source_rate, RATE)
    return resampled


def add_noise(pcm: npt.NDArray[np.int16], snr_db: float, seed: str) -> npt.NDArray[np.int16]:
    """``pcm`` with pink noise at ``snr_db`` below its voiced frames' power (inf: unchanged);
    the noise comes from a generator seeded by ``seed``, so the same name gets the same."""
    if math.isinf(snr_db):
        return pcm
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8]))
    spectrum = np.fft.rfft(rng.standard_normal(len(pcm)))
    # 1/f power: each bin's amplitude falls with the square root of its frequency.
    spectrum[1:] /= np.sqrt(np.arange(1, len(spectrum)))
    spectrum[0] = 0
    noise = np.fft.irfft(spectrum, len(pcm))
    signal = pcm.astype(np.float64)
    frame = RATE // 100
    frames = signal[: len(signal) // frame * frame].reshape(-1, frame)
    power = np.mean(frames**2, axis=1)
    voiced = power[power >= power.max() * 10 ** (-40 / 10)]
    target = float(np.mean(voiced)) / 10 ** (snr_db / 10)
    noise *= math.sqrt(target / float(np.mean(noise**2)))
    return np.clip(np.round(signal + noise), -32768, 32767).astype(np.int16)

"""``hark bench denoise``: what ``noise_reduction`` does for recognition of noisy speech.

The spoken questions (Piper's voice at 24 kHz, cached) are mixed with noise at several
signal-to-noise ratios, streamed in 20 ms chunks through the session's denoiser as a session
with ``noise_reduction`` hears them (``off``, ``near_field``, ``far_field``), and transcribed
whole by Whisper (hark's ASR engine, the bundled tiny.en unless ``--asr-model``). The figures
are the word error rate over all questions for each noise, SNR and mode, and the denoiser's
CPU time per second of audio (this process's CPU time, so the machine's other load does not
count).

Noises: ``white`` (hiss), ``pink`` (1/f, the spectrum of fans, traffic and rain), ``babble``
(four other questions spoken over each other: the café, where a denoiser that keeps voices
has least to take away). The SNR is the speech's power over the noise's, both over the
whole clip. Everything is seeded, so a run repeats exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from hark.audio.denoise import Denoiser
from hark.audio.resample import resample
from hark.bench.command import Bench, Result, config_from, list_option, listed
from hark.bench.report import BenchError
from hark.bench.spoken_questions import QUESTIONS, RATE, SpokenQuestion, spoken_questions
from hark.bench.word_alignment import align, words
from hark.config.options import BenchOption
from hark.engines.asr import AsrEngine, AudioToTranscribe
from hark.protocol.session_config import NoiseReduction
from hark.session.noise_reduction import wet_share

NOISES = ("white", "pink", "babble")
MODES = ("off", "near_field", "far_field")
DEFAULT_SNRS = (20.0, 10.0, 5.0, 0.0)
CHUNK = RATE // 50
# Silence after each question, so that the denoiser's 21 ms delay loses no speech.
_TAIL = RATE // 10
_ASR_RATE = 16000


OPTIONS: tuple[BenchOption | str, ...] = (
    list_option(
        "snrs",
        "comma-separated signal-to-noise ratios in dB (default 20,10,5,0)",
        (f"{snr:g}" for snr in DEFAULT_SNRS),
    ),
    list_option("noises", f"comma-separated noises, of {', '.join(NOISES)} (default all)", NOISES),
    BenchOption(
        "questions",
        f"how many of the spoken questions (default all {len(QUESTIONS)})",
        int,
        len(QUESTIONS),
    ),
    "asr_model",
    "json",
)


@dataclass(frozen=True)
class DenoiseBenchConfig:
    """What ``hark bench denoise`` measures: its options."""

    snrs: tuple[float, ...]
    noises: tuple[str, ...]
    questions: int
    asr_model: str | None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> DenoiseBenchConfig:
        """The config of the parsed options; ``BenchError`` when one is out of range."""
        config = config_from(
            cls, options, snrs=listed(options["snrs"], float), noises=listed(options["noises"], str)
        )
        if not config.snrs or not config.noises:
            raise BenchError("--snrs and --noises need at least one value each")
        unknown = set(config.noises) - set(NOISES)
        if unknown:
            raise BenchError(f"unknown noise {sorted(unknown)[0]!r}: use {', '.join(NOISES)}")
        if not 1 <= config.questions <= len(QUESTIONS):
            raise BenchError(f"--questions is 1 to {len(QUESTIONS)}")
        return config


def run(config: DenoiseBenchConfig) -> Result:
    """Measure; the report and its summary."""
    report = asyncio.run(measure(config.snrs, config.noises, config.questions, config.asr_model))
    return Result(report, summary(report))


BENCH = Bench("denoise", OPTIONS, DenoiseBenchConfig.from_options, run)
configure_parser, command = BENCH.configure_parser, BENCH.command


def noise(
    kind: str, samples: int, seed: int, others: Sequence[SpokenQuestion] = ()
) -> npt.NDArray[np.float64]:
    """``samples`` of noise ``kind`` at 24 kHz (float64, unit power); babble is made of
    ``others``' speech."""
    rng = np.random.default_rng(seed)
    if kind == "white":
        signal = rng.standard_normal(samples)
    elif kind == "pink":
        spectrum = np.fft.rfft(rng.standard_normal(samples))
        frequencies = np.fft.rfftfreq(samples)
        frequencies[0] = frequencies[1]
        signal = np.fft.irfft(spectrum / np.sqrt(frequencies), samples)
    elif kind == "babble":
        if not others:
            raise BenchError("babble needs other speech")
        signal = np.zeros(samples)
        for index in range(4):
            voice = others[(seed + index) % len(others)].pcm.astype(np.float64)
            # Each talker starts somewhere in the clip and goes on, looped.
            loop = np.resize(voice, samples + len(voice))
            start = int(rng.integers(len(voice)))
            signal += loop[start : start + samples]
    else:
        raise BenchError(f"unknown noise {kind!r}")
    scaled: npt.NDArray[np.float64] = signal / np.sqrt(np.mean(signal**2))
    return scaled


def mix(
    speech: npt.NDArray[np.int16], noise_signal: npt.NDArray[np.float64], snr_db: float
) -> npt.NDArray[np.int16]:
    """``speech`` with ``noise_signal`` (unit power, as long) added at ``snr_db``."""
    clean = speech.astype(np.float64)
    power = float(np.mean(clean**2))
    noisy = clean + noise_signal * np.sqrt(power / 10 ** (snr_db / 10))
    return np.clip(np.rint(noisy), -32768, 32767).astype(np.int16)


def denoised(pcm: npt.NDArray[np.int16], mode: str) -> tuple[npt.NDArray[np.int16], float]:
    """``pcm`` (24 kHz) through a session's denoiser for ``mode``, streamed in 20 ms chunks
    with a tail of silence; with the CPU seconds it took."""
    padded = np.concatenate((pcm, np.zeros(_TAIL, np.int16)))
    if mode == "off":
        return padded, 0.0
    kind: Literal["near_field", "far_field"] = "near_field" if mode == "near_field" else "far_field"
    denoiser = Denoiser(RATE, wet_share(NoiseReduction(type=kind)))
    cpu = time.process_time()
    out = np.concatenate(
        [denoiser.process(padded[i : i + CHUNK]) for i in range(0, len(padded), CHUNK)]
    )
    cost = time.process_time() - cpu
    denoiser.close()
    return out, cost


@dataclass(slots=True)
class _Tally:
    errors: int = 0
    reference_words: int = 0

    @property
    def wer(self) -> float:
        return self.errors / self.reference_words if self.reference_words else 0.0


async def transcript(asr: AsrEngine, pcm: npt.NDArray[np.int16]) -> str:
    """What Whisper hears in ``pcm`` (24 kHz)."""
    audio = resample(pcm, RATE, _ASR_RATE).astype(np.float32) / 32768.0
    return "".join(
        [delta async for delta in asr.transcribe(AudioToTranscribe(audio, language="en"))]
    )


async def measure(
    snrs: Sequence[float], noises: Sequence[str], count: int, asr_model: str | None = None
) -> dict[str, Any]:
    """Word error rates by noise, SNR and mode, and the denoiser's CPU cost."""
    from hark.engines.asr.whisper import WhisperAsr

    questions = await spoken_questions(QUESTIONS)
    asr = WhisperAsr(model_path=asr_model, workers=1)
    await asr.warmup()
    cpu_seconds = 0.0
    audio_seconds = 0.0
    rows: list[dict[str, Any]] = []
    try:
        conditions: list[tuple[str, float | None]] = [("clean", None)]
        conditions += [(kind, snr) for kind in noises for snr in snrs]
        for kind, snr in conditions:
            tallies = {mode: _Tally() for mode in MODES}
            for index, question in enumerate(questions[:count]):
                others = [q for q in questions if q is not question]
                pcm = question.pcm
                if snr is not None:
                    pcm = mix(pcm, noise(kind, len(pcm), index, others), snr)
                reference = words(question.text)
                for mode in MODES:
                    heard, cost = denoised(pcm, mode)
                    if mode != "off":
                        cpu_seconds += cost
                        audio_seconds += len(heard) / RATE
                    alignment = align(reference, words(await transcript(asr, heard)))
                    tallies[mode].errors += alignment.errors
                    tallies[mode].reference_words += alignment.reference_words
            rows.append(
                {
                    "noise": kind,
                    "snr_db": snr,
                    **{f"wer_{mode}": round(tallies[mode].wer, 4) for mode in MODES},
                }
            )
    finally:
        asr.close()
    return {
        "benchmark": "denoise",
        "questions": count,
        "asr": "whisper " + (asr_model or "tiny.en (bundled)"),
        "chunk_ms": 20,
        "denoiser_cpu_s_per_audio_s": round(cpu_seconds / audio_seconds, 4)
        if audio_seconds
        else None,
        "rows": rows,
    }


def summary(report: Mapping[str, Any]) -> str:
    """A table of the report for people."""
    lines = [
        f"Word error rate of {report['asr']} over {report['questions']} spoken questions, "
        "by noise_reduction",
        f"{'noise':<7} {'SNR dB':>6} {'off':>7} {'near_field':>11} {'far_field':>10}",
    ]
    for row in report["rows"]:
        snr = "-" if row["snr_db"] is None else f"{row['snr_db']:g}"
        lines.append(
            f"{row['noise']:<7} {snr:>6} {row['wer_off']:>7.1%} {row['wer_near_field']:>11.1%}"
            f" {row['wer_far_field']:>10.1%}"
        )
    cost = report["denoiser_cpu_s_per_audio_s"]
    if cost is not None:
        lines.append(
            f"denoiser CPU: {cost * 1000:.1f} ms per second of audio "
            f"({cost:.1%} of a core per session)"
        )
    return "\n".join(lines)

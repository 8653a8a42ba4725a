"""``hark bench tts``: how well Whisper hears each TTS engine, and what its speech costs.

Each engine (hark's own, made as ``hark serve --tts NAME`` makes it: Piper's bundled joe
voice, hibari's bundled heart voice, one ONNX Runtime thread each) speaks the sentences one
by one; Whisper (hark's ASR engine, the bundled tiny.en unless ``--asr-model``) transcribes
each. The figures per engine and run:

- word error rate over all sentences, and the sentences heard word for word. Numbers
  compare digit by digit ("four one five" and Whisper's "415" are the same three words);
- synthesis time over the audio's length (the real-time factor), wall clock and this
  process's CPU time (the machine's other load stretches the first, hardly the second);
- how long the engine took to load and speak once (``warmup``).

``--runs`` repeats the whole, alternating which engine goes first, so that a change in the
machine's load falls on both. Synthesis runs alone: Whisper listens after each engine's turn.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.audio.resample import resample
from hark.bench.command import Bench, Result, config_from, list_option, listed
from hark.bench.report import BenchError, load_average
from hark.bench.spoken_questions import QUESTIONS
from hark.bench.word_alignment import align, words
from hark.config.options import BenchOption
from hark.engines.asr import AsrEngine, AudioToTranscribe
from hark.engines.tts import TtsEngine

# The sentences hark's tests hear (tests/speech.py keeps them as WAV files and adds the
# backchannels): requests, spelled-out numbers, the fragments the turn-taking tests use,
# then the benchmarks' questions.
SENTENCES: tuple[str, ...] = (
    "What is the capital of France?",
    "Tell me a joke about penguins, please.",
    "Turn off the lights in the kitchen.",
    "Tell me a joke.",
    "Could you tell me what the capital of France is, and how many people live there?",
    "How do I reset my password?",
    "Set a timer for ten minutes.",
    "Can you recommend a good book?",
    "I'd like to cancel my subscription.",
    "My phone number is four one five five five five one two three four.",
    "my phone number is four one five",
    "my phone number is four one five five five five",
    "i want to book a table for",
    "i was wondering if",
    "my credit card number is four two four two",
    "so what i'm trying to say is",
    "Tell me a long story about a dragon and a knight.",
    "Wait, stop please.",
    "Wait, stop, I have another question.",
    # Said in two parts, with a pause between them, by the turn-taking test.
    "My phone number is four one five,",
    "five five five, one two three four.",
)
SENTENCES += tuple(q for q in QUESTIONS if q not in SENTENCES)
ENGINES = ("piper", "hibari")
_ASR_RATE = 16000
_DIGITS = {
    "zero": "0",
    "oh": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}


OPTIONS: tuple[BenchOption | str, ...] = (
    list_option(
        "engines",
        f"comma-separated TTS engines, of {', '.join(ENGINES)} (default both)",
        ENGINES,
    ),
    BenchOption("runs", "rounds of every engine, alternating (default 2)", int, 2),
    BenchOption(
        "sentences",
        f"how many of the sentences (default all {len(SENTENCES)})",
        int,
        len(SENTENCES),
    ),
    "asr_model",
    "json",
)


@dataclass(frozen=True)
class TtsBenchConfig:
    """What ``hark bench tts`` measures: its options."""

    engines: tuple[str, ...]
    runs: int
    sentences: int
    asr_model: str | None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> TtsBenchConfig:
        """The config of the parsed options; ``BenchError`` when one is out of range."""
        config = config_from(cls, options, engines=listed(options["engines"], str))
        unknown = sorted(set(config.engines) - set(ENGINES))
        if not config.engines or unknown or len(set(config.engines)) != len(config.engines):
            raise BenchError(f"--engines is a list of {', '.join(ENGINES)}")
        if config.runs < 1:
            raise BenchError("--runs is at least 1")
        if not 1 <= config.sentences <= len(SENTENCES):
            raise BenchError(f"--sentences is 1 to {len(SENTENCES)}")
        return config


def run(config: TtsBenchConfig) -> Result:
    """Measure; the report and its summary."""
    sentences = SENTENCES[: config.sentences]
    report = asyncio.run(measure(config.engines, config.runs, sentences, config.asr_model))
    return Result(report, summary(report))


BENCH = Bench("tts", OPTIONS, TtsBenchConfig.from_options, run)
configure_parser, command = BENCH.configure_parser, BENCH.command


def compared(text: str) -> list[str]:
    """``text``'s words as they are compared: number words and digits both as single digits
    ("ten", "10" and "1 0" alike)."""
    out: list[str] = []
    for word in words(text):
        word = _DIGITS.get(word, word)
        out.extend(word if word.isdigit() else [word])
    return out


def make_engine(name: str) -> TtsEngine:
    """The engine ``hark serve --tts NAME`` would use, with its default voice."""
    from hark.config import Settings
    from hark.engines.registry import TTS_ENGINES
    from hark.protocol.session_config import OPENAI_VOICES

    return TTS_ENGINES[name](Settings(tts=name), OPENAI_VOICES)


async def _spoken(tts: TtsEngine, sentence: str) -> tuple[npt.NDArray[np.int16], float, float]:
    """``sentence`` as ``tts`` says it, with the wall and CPU seconds that took."""
    wall, cpu = time.perf_counter(), time.process_time()
    chunks = [chunk async for chunk in tts.synthesize(sentence)]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not chunks:
        raise BenchError(f"no audio for {sentence!r}")
    return np.concatenate(chunks), wall, cpu


async def _heard(asr: AsrEngine, audio: npt.NDArray[np.int16], rate: int) -> str:
    pcm = resample(audio, rate, _ASR_RATE).astype(np.float32) / 32768.0
    return "".join([delta async for delta in asr.transcribe(AudioToTranscribe(pcm, language="en"))])


async def _one_run(
    name: str, tts: TtsEngine, asr: AsrEngine, sentences: Sequence[str]
) -> dict[str, Any]:
    spoken = [await _spoken(tts, sentence) for sentence in sentences]
    errors = reference_words = exact = 0
    misheard: list[dict[str, str]] = []
    for sentence, (audio, _, _) in zip(sentences, spoken, strict=True):
        heard = await _heard(asr, audio, tts.sample_rate)
        alignment = align(compared(sentence), compared(heard))
        errors += alignment.errors
        reference_words += alignment.reference_words
        if alignment.errors == 0:
            exact += 1
        else:
            misheard.append({"said": sentence, "heard": heard.strip()})
    audio_s = [audio.size / tts.sample_rate for audio, _, _ in spoken]
    wall_rtf = [w / a for (_, w, _), a in zip(spoken, audio_s, strict=True)]
    cpu_rtf = [c / a for (_, _, c), a in zip(spoken, audio_s, strict=True)]
    return {
        "engine": name,
        "wer": round(errors / reference_words, 4),
        "exact": exact,
        "sentences": len(sentences),
        "audio_s": round(sum(audio_s), 2),
        "wall_rtf_p50": round(statistics.median(wall_rtf), 4),
        "cpu_rtf_p50": round(statistics.median(cpu_rtf), 4),
        "wall_s": round(sum(w for _, w, _ in spoken), 3),
        "cpu_s": round(sum(c for _, _, c in spoken), 3),
        "misheard": misheard,
    }


async def measure(
    engines: Sequence[str], runs: int, sentences: Sequence[str], asr_model: str | None = None
) -> dict[str, Any]:
    """Every engine's figures for every run, the engines taking turns to go first."""
    from hark.engines.asr.whisper import WhisperAsr

    asr = WhisperAsr(model_path=asr_model, workers=1)
    await asr.warmup()
    loaded: dict[str, TtsEngine] = {}
    load_s: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    try:
        for run in range(runs):
            order = list(engines) if run % 2 == 0 else list(reversed(engines))
            for name in order:
                if name not in loaded:
                    started = time.perf_counter()
                    loaded[name] = make_engine(name)
                    await loaded[name].warmup()
                    load_s[name] = round(time.perf_counter() - started, 2)
                row = await _one_run(name, loaded[name], asr, sentences)
                rows.append({"run": run + 1, **row, "load_average": load_average()})
    finally:
        asr.close()
    return {
        "benchmark": "tts",
        "asr": "whisper " + (asr_model or "tiny.en (bundled)"),
        "sentences": len(sentences),
        "load_s": load_s,
        "rows": rows,
    }


def summary(report: Mapping[str, Any]) -> str:
    """A table of the report for people."""
    lines = [
        f"{report['sentences']} sentences spoken by each engine, heard by {report['asr']}",
        f"{'run':>3} {'engine':<7} {'WER':>6} {'exact':>7} {'wall RTF':>9} {'CPU RTF':>8}"
        f" {'load':>6} {'loadavg':>8}",
    ]
    for row in report["rows"]:
        load = report["load_s"][row["engine"]]
        machine = "-" if row["load_average"] is None else f"{row['load_average']:.1f}"
        lines.append(
            f"{row['run']:>3} {row['engine']:<7} {row['wer']:>6.1%}"
            f" {row['exact']:>3}/{row['sentences']:<3} {row['wall_rtf_p50']:>9.3f}"
            f" {row['cpu_rtf_p50']:>8.3f} {load:>5.1f}s {machine:>8}"
        )
    lines.append(
        "RTF: synthesis time over audio length, median of the sentences; load: first load "
        "and one sentence"
    )
    return "\n".join(lines)

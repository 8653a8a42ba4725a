"""Monologues for the captions bench: sentences Piper says one after another, with where
each word ends in the audio.

A word's end comes from the embedded Whisper's word times on each sentence as Piper said it
(Piper's own phoneme timing needs a patched voice), aligned to the reference words and
cached beside the spoken sentence; where a sentence starts in a monologue is known exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.bench.report import BenchError
from hark.bench.spoken_questions import (
    RATE,
    SpokenQuestion,
    cache_path,
    default_cache_dir,
    last_voiced_sample,
    spoken_questions,
)
from hark.bench.word_alignment import align, words

# Plain words a recogniser can spell one way: no numbers, names or abbreviations.
MONOLOGUE: tuple[str, ...] = (
    "I went for a long walk by the river this morning.",
    "The water was calm and the air was still cold.",
    "A few people were out with their dogs near the old bridge.",
    "I stopped for a while to watch the birds on the other bank.",
    "Then I walked up the hill towards the little market.",
    "The baker had just opened his shop and the bread smelled wonderful.",
    "I bought a warm loaf and a jar of honey for breakfast.",
    "On the way back the sun came out from behind the clouds.",
    "Everything looked brighter and the path was full of light.",
    "I met my neighbour at the gate and we talked about the garden.",
    "She has planted beans and tomatoes along the south wall this year.",
    "We both hope that the summer will be warm enough for them.",
    "After that I made a pot of tea and sat down by the window.",
    "I like to read the news slowly before the day gets busy.",
    "Later I have to answer some letters and clean the kitchen.",
    "In the evening my brother is coming over for dinner.",
    "We will probably cook something simple and talk for hours.",
    "It feels good to have a quiet day after such a busy week.",
)
SENTENCE_GAP_S = 0.3
# Bump when the word timing changes, so that old cache entries are not used.
_TIMES_VERSION = "1"


@dataclass(frozen=True)
class Monologue:
    """Sentences said one after another as 24 kHz int16 speech.

    ``word_ends``: for each word of ``words(text)``, where its last sample is in ``pcm``
    (seconds), or ``None`` when the timing could not place it.
    """

    text: str
    pcm: npt.NDArray[np.int16]
    word_ends: tuple[float | None, ...]
    last_voiced: int

    @property
    def duration_s(self) -> float:
        """How long it takes to say."""
        return len(self.pcm) / RATE


@dataclass(frozen=True)
class _Sentence:
    text: str
    pcm: npt.NDArray[np.int16]
    word_ends: tuple[float | None, ...]


def first_voiced_sample(pcm: npt.NDArray[np.int16], rate: int) -> int:
    """The index of the first sample of the first voiced 10 ms frame (see
    ``last_voiced_sample``); ``len(pcm)`` if silent."""
    last_from_end = last_voiced_sample(pcm[::-1], rate)
    if last_from_end < 0:
        return len(pcm)
    return len(pcm) - 1 - last_from_end


async def monologues(
    lengths_s: Sequence[float],
    sentences: Sequence[str] = MONOLOGUE,
    cache_dir: Path | None = None,
) -> dict[float, Monologue]:
    """A monologue per length: the first ``sentences`` (cycling if need be) that last at
    least that long, each trimmed to its voice and followed by ``SENTENCE_GAP_S`` of
    silence."""
    if not sentences:
        raise BenchError("no sentences to say")
    spoken = await spoken_questions(sentences, cache_dir=cache_dir)
    timed = await _timed(spoken, cache_dir)
    result: dict[float, Monologue] = {}
    gap = np.zeros(round(SENTENCE_GAP_S * RATE), np.int16)
    for length in lengths_s:
        parts: list[npt.NDArray[np.int16]] = []
        ends: list[float | None] = []
        texts: list[str] = []
        samples = 0
        index = 0
        while samples < length * RATE or not parts:
            sentence = timed[index % len(timed)]
            index += 1
            offset = samples / RATE
            ends.extend(None if end is None else offset + end for end in sentence.word_ends)
            texts.append(sentence.text)
            parts.extend((sentence.pcm, gap))
            samples += len(sentence.pcm) + len(gap)
        pcm = np.concatenate(parts)
        result[length] = Monologue(
            " ".join(texts), pcm, tuple(ends), last_voiced_sample(pcm[: -len(gap)], RATE)
        )
    return result


async def _timed(spoken: Sequence[SpokenQuestion], cache_dir: Path | None) -> list[_Sentence]:
    """Each spoken sentence trimmed to its voice, with its words' end times (cached)."""
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    recogniser: Any = None
    timed = []
    for sentence in spoken:
        start = first_voiced_sample(sentence.pcm, RATE)
        pcm = sentence.pcm[start : sentence.last_voiced + 1]
        path = cache_path(directory, sentence.text).with_suffix(f".words{_TIMES_VERSION}.json")
        ends = _read_times(path, sentence.text)
        if ends is None:
            if recogniser is None:
                from hark.engines.asr.whisper import WhisperAsr

                recogniser = WhisperAsr()
            ends = await _word_ends(recogniser, pcm, sentence.text)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"text": sentence.text, "word_ends": ends}))
        timed.append(_Sentence(sentence.text, pcm, tuple(ends)))
    return timed


def _read_times(path: Path, text: str) -> list[float | None] | None:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("text") != text:
        return None
    ends = stored.get("word_ends")
    if not isinstance(ends, list) or len(ends) != len(words(text)):
        return None
    return [float(end) if isinstance(end, int | float) else None for end in ends]


async def _word_ends(recogniser: Any, pcm: npt.NDArray[np.int16], text: str) -> list[float | None]:
    """Where each word of ``text`` ends in ``pcm``: Whisper's word times, aligned to it."""
    from hark.audio.resample import resample
    from hark.engines.asr import AudioToTranscribe

    audio = resample(pcm, RATE, recogniser.sample_rate).astype(np.float32) / 32768.0
    heard = await recogniser.transcribe_timed(AudioToTranscribe(audio, words=True))
    reference = words(text)
    hypothesis: list[str] = []
    ends: list[float] = []
    for word in heard.words:
        for piece in words(word.word):
            hypothesis.append(piece)
            ends.append(float(word.end))
    result: list[float | None] = [None] * len(reference)
    for ref, hyp in align(reference, hypothesis).matches:
        result[ref] = round(ends[hyp], 3)
    return result

"""Whisper through faster-whisper: short audio on the trimmed window, long audio windowed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from difflib import SequenceMatcher
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines.activity import computing_now
from hark.engines.asr import AsrEngine, AudioToTranscribe
from hark.engines.asr.whisper import WhisperAsr, default_model_path
from tests.helpers.text import words

from .conftest import QUESTION, Say

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def asr() -> WhisperAsr:
    # One engine for the module: loading the model takes a second or two.
    return WhisperAsr()


@pytest.fixture(scope="module")
def full_window() -> Any:
    """faster-whisper's own transcription of the same model: 30 s windows, padded."""
    from faster_whisper import WhisperModel

    return WhisperModel(str(default_model_path()), compute_type="int8", cpu_threads=2)


async def transcript(engine: AsrEngine, audio: npt.NDArray[np.float32], **options: Any) -> str:
    return "".join(
        [delta async for delta in engine.transcribe(AudioToTranscribe(audio, **options))]
    )


async def test_transcribes_a_question(asr: WhisperAsr, question: npt.NDArray[np.float32]) -> None:
    await asr.warmup()
    deltas = [delta async for delta in asr.transcribe(AudioToTranscribe(question))]
    assert len(deltas) == 1
    assert not deltas[0].startswith(" ")
    assert {"capital", "france"} <= set(words(deltas[0]))
    # Decoding on a trimmed window without care loops: "What is … France? What is …".
    assert words(deltas[0]).count("capital") == 1


@pytest.mark.parametrize(
    ("text", "key_words"),
    [
        (QUESTION, {"capital", "france"}),
        ("Turn off the lights in the kitchen.", {"lights", "kitchen"}),
        (
            "Could you tell me what the capital of France is, and how many people live there?",
            {"capital", "france", "people", "live"},
        ),
    ],
)
async def test_trimmed_window_agrees_with_the_full_window(
    asr: WhisperAsr, full_window: Any, say: Say, text: str, key_words: set[str]
) -> None:
    audio = say(text)
    segments, _info = full_window.transcribe(
        audio, language="en", beam_size=1, temperature=0.0, without_timestamps=True
    )
    expected = "".join(segment.text for segment in segments)
    trimmed = words(await transcript(asr, audio))
    assert key_words <= set(words(expected))
    assert key_words <= set(trimmed)
    assert len(trimmed) <= len(words(expected)) + 1
    assert SequenceMatcher(None, trimmed, words(expected)).ratio() >= 0.8


async def test_silence_and_noise_give_no_words(asr: WhisperAsr) -> None:
    assert await transcript(asr, np.zeros(32000, dtype=np.float32)) == ""
    faint = 0.01 * np.random.default_rng(0).standard_normal(32000)
    assert len(words(await transcript(asr, faint.astype(np.float32)))) <= 1
    assert await transcript(asr, np.zeros(0, dtype=np.float32)) == ""


async def test_language_hint(
    asr: WhisperAsr, question: npt.NDArray[np.float32], caplog: pytest.LogCaptureFixture
) -> None:
    detected = await transcript(asr, question)
    assert await transcript(asr, question, language="en") == detected
    assert await transcript(asr, question, language="en-US") == detected
    with pytest.raises(ValueError):
        await transcript(asr, question, language="klingon")
    # The bundled model is English-only: another language is transcribed as English.
    with caplog.at_level(logging.WARNING, logger="hark.engines.asr.whisper"):
        assert await transcript(asr, question, language="fr") == detected
    assert "English-only" in caplog.text


async def test_prompt_is_accepted(asr: WhisperAsr, question: npt.NDArray[np.float32]) -> None:
    text = await transcript(asr, question, prompt="A geography quiz about European capitals.")
    assert {"capital", "france"} <= set(words(text))


async def test_long_audio_is_transcribed_window_by_window(
    asr: WhisperAsr, question: npt.NDArray[np.float32]
) -> None:
    gap = np.zeros(29 * 16000, dtype=np.float32)
    audio = np.concatenate((question, gap, question))
    deltas = [delta async for delta in asr.transcribe(AudioToTranscribe(audio, language="en"))]
    assert len(deltas) >= 2
    assert not deltas[0].startswith(" ")
    assert words("".join(deltas)).count("capital") == 2


async def test_timed_transcripts_place_segments_and_words_in_long_audio(
    asr: WhisperAsr, question: npt.NDArray[np.float32]
) -> None:
    gap = np.zeros(29 * 16000, dtype=np.float32)
    audio = np.concatenate((gap[:16000], question, gap, question))
    duration = audio.size / 16000
    timed = await asr.transcribe_timed(AudioToTranscribe(audio, words=True))
    assert timed.language == "en" and timed.duration == duration
    assert words(timed.text).count("capital") == 2
    said = [s for s in timed.segments if "capital" in words(s.text)]
    # The first question ends after a second of silence and its own length, the second
    # starts 29 s later. (Whisper's first word takes in the silence before it.)
    first_end = 1.0 + question.size / 16000
    assert len(said) == 2
    assert said[0].start < said[0].end and abs(said[0].end - first_end) <= 1.0
    assert said[0].end < 30.0 <= said[1].start < said[1].end <= duration
    assert [w for word in timed.words for w in words(word.word)] == words(timed.text)
    times = [t for word in timed.words for t in (word.start, word.end)]
    assert times == sorted(times) and times[-1] <= duration
    capitals = [w.start for w in timed.words if "capital" in words(w.word)]
    assert capitals[0] < first_end and capitals[1] >= 30.0
    # Without words asked for, none; silence gives no segments, in the model's language.
    assert (await asr.transcribe_timed(AudioToTranscribe(question))).words == ()
    silent = await asr.transcribe_timed(AudioToTranscribe(np.zeros(32000, dtype=np.float32)))
    assert (silent.segments, silent.language, silent.duration) == ((), "en", 2.0)
    with pytest.raises(ValueError):
        await asr.transcribe_timed(AudioToTranscribe(question, language="klingon"))


async def test_closing_midway_stops_cleanly(
    asr: WhisperAsr, question: npt.NDArray[np.float32], monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[str] = []
    released = asyncio.Event()
    loop = asyncio.get_running_loop()
    start_windows = asr._start_windows

    def watched(*args: Any, **options: Any) -> tuple[Iterator[Any], str]:
        segments, language = start_windows(*args, **options)

        def stepped() -> Iterator[Any]:
            # faster-whisper decodes a window each time its segment iterator is stepped.
            try:
                for segment in segments:
                    decoded.append(segment.text)
                    yield segment
            finally:
                loop.call_soon_threadsafe(released.set)

        return stepped(), language

    monkeypatch.setattr(asr, "_start_windows", watched)
    gap = np.zeros(29 * 16000, dtype=np.float32)
    deltas = asr.transcribe(
        AudioToTranscribe(np.concatenate((question, gap, question)), language="en")
    )
    assert "capital" in words(await anext(deltas))
    await deltas.aclose()  # type: ignore[attr-defined]
    assert computing_now() == 0
    with pytest.raises(StopAsyncIteration):
        await anext(deltas)
    # faster-whisper's iterator goes when the loop finalises the engine's inner generator.
    await asyncio.wait_for(released.wait(), 10)
    # The second window was never decoded.
    assert len(decoded) == 1


async def test_cancelling_midway_raises_only_cancelled_error(
    asr: WhisperAsr, question: npt.NDArray[np.float32]
) -> None:
    gap = np.zeros(29 * 16000, dtype=np.float32)
    audio = np.concatenate((question, gap, question))
    heard: list[str] = []
    first_delta = asyncio.Event()

    async def listen() -> None:
        async for delta in asr.transcribe(AudioToTranscribe(audio, language="en")):
            heard.append(delta)
            first_delta.set()

    task = asyncio.create_task(listen())
    await first_delta.wait()
    # The second window is still being decoded: the task is cancelled in the middle.
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(heard) == 1
    assert {"capital", "france"} <= set(words(await transcript(asr, question)))


async def test_rejects_bad_input(asr: WhisperAsr) -> None:
    with pytest.raises(ValueError):
        await transcript(asr, np.zeros((2, 16000), dtype=np.float32))
    with pytest.raises(ValueError):
        await transcript(asr, np.zeros(16000, dtype=np.int16))


def test_refuses_a_model_that_would_need_downloading() -> None:
    with pytest.raises(FileNotFoundError):
        WhisperAsr(model_path="tiny")


def test_long_pauses_inside_speech_are_shortened_before_recognition() -> None:
    from hark.engines.asr.whisper import _compact_silences

    rate = 16000
    t = np.arange(rate // 2) / rate
    word = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    lead = np.zeros(rate // 4, np.float32)
    audio = np.concatenate((lead, word, np.zeros(rate * 12 // 10, np.float32), word, lead))
    compacted = _compact_silences(audio)
    # The 1.2 s pause becomes 0.4 s; the words and the silence around the turn stay.
    assert len(compacted) == pytest.approx(len(audio) - 0.8 * rate, abs=rate * 0.03)
    assert np.count_nonzero(np.abs(compacted) > 0.1) == np.count_nonzero(np.abs(audio) > 0.1)
    assert np.array_equal(compacted[: len(lead)], lead)
    short = np.concatenate((word, np.zeros(rate // 5, np.float32), word))
    assert np.array_equal(_compact_silences(short), short)

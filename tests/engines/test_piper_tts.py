"""Piper speaks real speech with the bundled voice, sentence by sentence, and stops when told."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines import activity
from hark.engines.activity import computing
from hark.engines.tts import TtsEngine
from hark.engines.tts.piper import PiperTts
from tests.engines.renders import CountingRenders

pytestmark = pytest.mark.slow

THREE_SENTENCES = "The first sentence is here. Then comes a second one. And a third ends it."
# Bounds a hang, never speed.
LIVENESS_S = 30.0


def needs_piper() -> None:
    pytest.importorskip("piper", reason="the 'piper' extra is not installed")


@pytest.fixture(scope="module")
def tts() -> Iterator[PiperTts]:
    needs_piper()
    # One engine for the module: the voice takes seconds to load.
    yield PiperTts()


def voice_class() -> Any:
    """PiperVoice: each reply renders with a copy of the engine's voice, so a test counts
    renders on the class."""
    from piper import PiperVoice

    return PiperVoice


async def speak(engine: PiperTts, text: str, **options: Any) -> list[npt.NDArray[np.int16]]:
    return [chunk async for chunk in engine.synthesize(text, **options)]


def rms(audio: npt.NDArray[np.int16]) -> float:
    return float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))


async def test_hello_world_is_speech(tts: PiperTts) -> None:
    engine: TtsEngine = tts
    assert engine.sample_rate == 22050
    chunks = await speak(tts, "Hello, world.")
    assert len(chunks) == 1
    audio = chunks[0]
    assert audio.dtype == np.int16
    assert 0.5 <= audio.size / 22050 <= 3.0
    assert rms(audio) > 1000
    # Speech has pauses and loud parts: a steady tone or noise would not.
    frames = audio[: audio.size // 441 * 441].reshape(-1, 441).astype(np.float64)
    frame_levels = np.sqrt(np.mean(frames**2, axis=1))
    assert frame_levels.max() > 10 * max(frame_levels.min(), 1.0)


async def test_one_chunk_per_sentence(tts: PiperTts) -> None:
    chunks = await speak(tts, THREE_SENTENCES, voice="marin")
    assert len(chunks) == 3
    assert all(chunk.size > 0.5 * 22050 and rms(chunk) > 1000 for chunk in chunks)


async def test_faster_speed_gives_shorter_audio(tts: PiperTts) -> None:
    text = "This sentence is spoken at two different speeds for the test."
    # The voice draws its phoneme durations with noise: one rendering at 1.5x has come out
    # anywhere from 0.66 to 0.88 of one at 1x. Three of each make the ratio steady (about
    # 0.74), while an ignored speed would still give about 1.0.
    normal = fast = 0
    for _ in range(3):
        normal += np.concatenate(await speak(tts, text, speed=1.0)).size
        fast += np.concatenate(await speak(tts, text, speed=1.5)).size
    assert fast < 0.85 * normal
    with pytest.raises(ValueError):
        await speak(tts, text, speed=0)


async def test_empty_text_yields_nothing(tts: PiperTts) -> None:
    assert await speak(tts, "") == []
    assert await speak(tts, "   \n\t") == []


async def test_openai_voice_names_are_accepted(tts: PiperTts) -> None:
    for voice in ("alloy", "marin", "no-such-voice"):
        chunks = await speak(tts, "Okay.", voice=voice)
        assert len(chunks) == 1 and rms(chunks[0]) > 1000


async def test_closing_the_stream_stops_before_the_next_sentence(
    tts: PiperTts, monkeypatch: pytest.MonkeyPatch
) -> None:
    renders = CountingRenders(voice_class(), "phoneme_ids_to_audio", tts._queue, monkeypatch)
    stream = tts.synthesize(THREE_SENTENCES)
    first = await anext(stream)
    assert first.size > 0
    await stream.aclose()  # type: ignore[attr-defined]
    await renders.settled()
    assert len(renders.calls) == 1 and renders.count == 1


async def test_cancelling_mid_sentence_renders_no_further_sentence(
    tts: PiperTts, monkeypatch: pytest.MonkeyPatch
) -> None:
    renders = CountingRenders(voice_class(), "phoneme_ids_to_audio", tts._queue, monkeypatch)
    received: list[npt.NDArray[np.int16]] = []
    first_arrived = asyncio.Event()

    async def consume() -> None:
        async for chunk in tts.synthesize(THREE_SENTENCES):
            received.append(chunk)
            first_arrived.set()

    task = asyncio.create_task(consume())
    await first_arrived.wait()
    # The second sentence is now asked for (being rendered, or waiting for a worker).
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await renders.settled()
    assert len(received) == 1
    # Asked for, it may have been rendered unseen; nothing after it was asked for.
    assert len(renders.calls) == 2 and renders.count <= 2


async def test_first_words_overtake_sentences_with_audio_still_to_play() -> None:
    needs_piper()
    # One worker, as on a 2-core machine. Two replies with seconds of audio queued ahead of
    # them (slack 10 s) have each asked for a sentence when a third session's first words
    # (slack 0) come: those go before the sentence still waiting.
    engine = PiperTts(workers=1)
    await engine.warmup()
    order: list[str] = []

    async def speak_as(name: str, text: str, slack: float, after: int = 0) -> None:
        for _ in range(after):
            await asyncio.sleep(0)
        async for _ in engine.synthesize(text, slack_s=slack):
            order.append(name)

    await asyncio.gather(
        speak_as("a", THREE_SENTENCES, 10.0),
        speak_as("b", THREE_SENTENCES, 10.0),
        speak_as("first words", "Paris.", 0.0, after=2),
    )
    assert order.count("a") == order.count("b") == 3
    assert order.index("first words") < order.index("b")


async def test_warmup_loads_the_voice() -> None:
    needs_piper()
    engine = PiperTts(threads=2)
    await engine.warmup()
    assert engine._model is not None
    chunks = await speak(engine, "Sure.")
    assert len(chunks) == 1 and chunks[0].size > 0.2 * 22050


def test_a_voice_can_be_given_by_path(tts: PiperTts) -> None:
    engine = PiperTts(model_path=str(tts._model_path))
    assert engine.sample_rate == 22050


def test_missing_piper_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes "import piper" raise ImportError.
    monkeypatch.setitem(sys.modules, "piper", None)
    with pytest.raises(RuntimeError, match=r"uv sync --extra piper"):
        PiperTts()


async def test_first_words_spread_over_every_core_only_while_nothing_else_computes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    needs_piper()
    engine = PiperTts(threads=1, wide_threads=2)
    await engine.warmup()
    narrow, wide = engine._load().session, engine._wide_session()
    assert wide is not None and wide is not narrow
    runs: list[tuple[str, int]] = []
    for name, session in (("narrow", narrow), ("wide", wide)):

        def spy(*args: Any, name: str = name, run: Any = session.run, **kwargs: Any) -> Any:
            runs.append((name, activity.urgent_now()))
            return run(*args, **kwargs)

        monkeypatch.setattr(session, "run", spy)

    async def session_for(slack_s: float) -> list[tuple[str, int]]:
        runs.clear()
        assert len(await speak(engine, "The capital of France.", slack_s=slack_s)) == 1
        return runs

    # Someone waits in silence and nothing else computes: both cores, marked urgent (the
    # LLM's steps that can wait hold off meanwhile).
    assert await session_for(0.0) == [("wide", 1)]
    # The listener still has seconds of audio to hear.
    assert await session_for(10.0) == [("narrow", 0)]
    # Another model computes (Whisper, the end-of-turn model).
    with computing():
        assert await session_for(0.0) == [("narrow", 0)]
    llm = activity.Waited()
    try:
        # The LLM's one job someone waits for: the reply being voiced.
        llm.set(1)
        assert await session_for(0.0) == [("wide", 1)]
        # Two: another session waits for its first words.
        llm.set(2)
        assert await session_for(0.0) == [("narrow", 0)]
    finally:
        llm.set(0)


def test_no_wide_voice_when_it_would_be_no_wider() -> None:
    needs_piper()
    assert PiperTts(threads=2, wide_threads=2)._wide_session() is None

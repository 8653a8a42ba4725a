"""hibari speaks real speech with its bundled voice, sentence by sentence, that Whisper hears;
it stops when told, never fetches a voice, and a server started with ``--tts hibari`` uses it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.resample import resample
from hark.config import Settings
from hark.engines.asr import AudioToTranscribe
from hark.engines.asr.whisper import WhisperAsr
from hark.engines.registry import EngineUnavailableError, build_engines, engine_names
from hark.engines.tts import TtsEngine, installed_voices
from hark.engines.tts.hibari import HibariTts, readable_numbers
from hark.engines.tts.openai import OpenAITts
from hark.protocol.session_config import OPENAI_VOICES
from tests.engines.renders import CountingRenders
from tests.servers import HarkProcess

pytestmark = pytest.mark.slow

THREE_SENTENCES = "The first sentence is here. Then comes a second one. And a third ends it."
RATE = 24000
# Bounds a hang, never speed.
LIVENESS_S = 30.0
API_KEY = "sk-hibari-test-7a6b5c4d"


@pytest.fixture(scope="module")
def tts() -> Iterator[HibariTts]:
    yield HibariTts()


@pytest.fixture(scope="module")
def asr() -> Iterator[WhisperAsr]:
    whisper = WhisperAsr(workers=1)
    yield whisper
    whisper.close()


async def speak(engine: TtsEngine, text: str, **options: Any) -> list[npt.NDArray[np.int16]]:
    return [chunk async for chunk in engine.synthesize(text, **options)]


async def transcript(asr: WhisperAsr, audio: npt.NDArray[np.int16]) -> str:
    """What Whisper tiny.en writes for 24 kHz ``audio``."""
    pcm = resample(audio, RATE, 16000).astype(np.float32) / 32768.0
    return "".join([delta async for delta in asr.transcribe(AudioToTranscribe(pcm, language="en"))])


async def heard(asr: WhisperAsr, audio: npt.NDArray[np.int16]) -> list[str]:
    """The words Whisper tiny.en hears in 24 kHz ``audio``."""
    return re.findall(r"[a-z]+", (await transcript(asr, audio)).lower())


def rms(audio: npt.NDArray[np.int16]) -> float:
    return float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))


async def test_whisper_hears_what_it_says(tts: HibariTts, asr: WhisperAsr) -> None:
    engine: TtsEngine = tts
    assert engine.sample_rate == RATE
    chunks = await speak(tts, "Turn off the lights in the kitchen.")
    assert len(chunks) == 1 and chunks[0].dtype == np.int16
    assert 1.0 <= chunks[0].size / RATE <= 4.0
    assert await heard(asr, chunks[0]) == ["turn", "off", "the", "lights", "in", "the", "kitchen"]


async def test_one_heard_chunk_per_sentence(tts: HibariTts, asr: WhisperAsr) -> None:
    chunks = await speak(tts, THREE_SENTENCES, voice="marin")
    assert len(chunks) == 3
    said = [words.split() for words in ("first sentence", "second one", "third ends")]
    for chunk, words in zip(chunks, said, strict=True):
        assert set(words) <= set(await heard(asr, chunk))


async def test_it_speaks_about_as_loud_as_piper(tts: HibariTts) -> None:
    (audio,) = await speak(tts, "Can you recommend a good book?")
    # Piper's sentences reach 0.9 of full scale; hibari's own level is a third of that.
    peak = int(np.abs(audio.astype(np.int32)).max())
    assert 0.45 * 32767 < peak < 32767
    assert rms(audio) > 1500


async def test_faster_speed_gives_shorter_audio(tts: HibariTts) -> None:
    text = "This sentence is spoken at two different speeds for the test."
    normal = np.concatenate(await speak(tts, text, speed=1.0)).size
    fast = np.concatenate(await speak(tts, text, speed=1.5)).size
    assert fast < 0.8 * normal
    with pytest.raises(ValueError):
        await speak(tts, text, speed=0)


async def test_numbers_too_long_for_a_cardinal_are_read_digit_by_digit(
    tts: HibariTts, asr: WhisperAsr
) -> None:
    assert readable_numbers("Call 4155550123 now.") == "Call 4155550123 now."
    assert readable_numbers("It is 1,234,567,890,123,456 or 3.14159265358979323846.") == (
        "It is 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 or 3.14159265358979323846."
    )
    # hibari alone raises on these (10**36 and more); the reply is spoken all the same.
    for text in ("6" * 40, "$" + "9" * 40, "1" * 40 + "th", "1," + "000," * 13 + "000"):
        (audio,) = await speak(tts, f"The number is {text}.")
        assert audio.size > RATE
    # Whisper writes what it hears as digits ("1-2-3-4-…"): every digit, in order.
    (audio,) = await speak(tts, "It is 12345678901234567.")
    assert re.sub(r"\D", "", await transcript(asr, audio)) == "12345678901234567"


async def test_empty_text_yields_nothing(tts: HibariTts) -> None:
    assert await speak(tts, "") == []
    assert await speak(tts, "   \n\t") == []


async def test_every_voice_name_speaks_with_the_bundled_voice(tts: HibariTts) -> None:
    assert installed_voices(tts) == ("heart",)
    assert tts.voice_map() == {}
    assert HibariTts(voices=OPENAI_VOICES).voice_map() == dict.fromkeys(OPENAI_VOICES, "heart")
    for voice in ("alloy", "marin", "heart", "no-such-voice"):
        chunks = await speak(tts, "Okay.", voice=voice)
        assert len(chunks) == 1 and rms(chunks[0]) > 1000


def test_a_voice_not_on_this_machine_is_refused_not_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hibari would download "emma" into its cache on first use; an empty cache and no
    # network access must give an error at start instead.
    monkeypatch.setenv("HIBARI_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        HibariTts(voice="emma")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(EngineUnavailableError, match="emma"):
        build_engines(Settings(engines="fake", tts="hibari", tts_model="emma"))
    with pytest.raises(EngineUnavailableError, match="unknown voice 'nobody'"):
        build_engines(Settings(engines="fake", tts="hibari", tts_model="nobody"))


def test_settings_choose_it_by_name() -> None:
    settings = Settings(engines="fake", tts="hibari")
    assert engine_names(settings)["tts"] == "hibari"
    engines = build_engines(settings, voices=OPENAI_VOICES)
    assert isinstance(engines.tts, HibariTts)
    # The names the server passes are the ones the engine maps.
    assert engines.tts.voice_map() == dict.fromkeys(OPENAI_VOICES, "heart")
    assert engines.tts.voice_name == "heart"


async def test_closing_the_stream_stops_before_the_next_sentence(
    tts: HibariTts, monkeypatch: pytest.MonkeyPatch
) -> None:
    renders = CountingRenders(tts._load(), "from_ids", tts._queue, monkeypatch)
    stream = tts.synthesize(THREE_SENTENCES)
    first = await anext(stream)
    assert first.size > 0
    await stream.aclose()  # type: ignore[attr-defined]
    await renders.settled()
    assert len(renders.calls) == 1 and renders.count == 1


async def test_first_words_overtake_sentences_with_audio_still_to_play() -> None:
    # One worker, as on a 2-core machine. Two replies with seconds of audio queued ahead of
    # them (slack 10 s) have each asked for a sentence when a third session's first words
    # (slack 0) come: those go before the sentence still waiting.
    engine = HibariTts(workers=1)
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


async def test_a_server_started_with_tts_hibari_speaks_with_it(
    tmp_path: Path, asr: WhisperAsr
) -> None:
    args = ["--engines", "fake", "--tts", "hibari"]
    with HarkProcess(args, tmp_path / "server.log", env={"HARK_API_KEYS": API_KEY}) as server:
        engine = OpenAITts(server.url + "/v1", api_key=API_KEY)
        try:
            audio = np.concatenate(await speak(engine, "Tell me a joke about penguins, please."))
        finally:
            await engine.aclose()
    assert {"joke", "about", "penguins"} <= set(await heard(asr, audio))

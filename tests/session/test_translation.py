"""The translation session's core (``hark.session.translation``) with scripted VAD answers
and engine results: where utterances are cut, the order of the cascade, ``session.close``,
the backlog's bound and expiry."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import numpy as np
import pydantic
from openai.types.realtime.realtime_translation_server_event import (
    RealtimeTranslationServerEvent,
)

from hark.protocol.translation import TranslationConfig
from hark.session.translation import (
    CHUNK_SAMPLES,
    MAX_WAITING_S,
    Close,
    Listen,
    Recognise,
    Speak,
    Translate,
    TranslationSession,
)

SDK_EVENT = pydantic.TypeAdapter(RealtimeTranslationServerEvent)


class Driver:
    """A session whose events are checked against the SDK's types as they come."""

    def __init__(self, **config: Any) -> None:
        self.session = TranslationSession(
            TranslationConfig(id="sess_1", model="m", expires_at=0, **config)
        )
        self.events: list[dict[str, Any]] = []
        self.actions: list[Any] = []
        self.take()

    def take(self) -> None:
        events, actions = self.session.take()
        for event in events:
            wire = json.loads(msgspec.json.encode(event))
            SDK_EVENT.validate_python(wire)
            self.events.append(wire)
        self.actions += actions

    def send(self, event: dict[str, Any]) -> None:
        self.session.receive(json.dumps(event))
        self.take()

    def say(self, speech_chunks: int, silence_chunks: int) -> None:
        """Append speech then silence, and have the VAD hear them so."""
        chunks = speech_chunks + silence_chunks
        pcm = np.full(chunks * CHUNK_SAMPLES, 1000, dtype="<i2")
        self.send(
            {
                "type": "session.input_audio_buffer.append",
                "audio": base64.b64encode(pcm.tobytes()).decode(),
            }
        )
        self.session.on_vad([0.9] * speech_chunks + [0.1] * silence_chunks)
        self.take()

    def pop(self, kind: type) -> Any:
        found = [a for a in self.actions if isinstance(a, kind)]
        assert len(found) == 1, (kind, self.actions)
        self.actions.remove(found[0])
        return found[0]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def translate(self, heard: str, said: list[str]) -> None:
        """Carry the utterance in work through the engines."""
        recognise = self.pop(Recognise)
        self.session.on_recognised(recognise.utterance, heard)
        self.take()
        translate = self.pop(Translate)
        assert translate.text == heard
        for piece in said:
            self.session.on_translation_delta(translate.utterance, piece)
        self.session.on_translated(translate.utterance)
        self.take()
        speak = self.pop(Speak)
        assert speak.text == "".join(said).strip()
        self.session.on_speech(speak.utterance, np.ones(480, np.int16))
        self.session.on_spoken(speak.utterance)
        self.take()


def test_the_session_begins_with_its_configuration() -> None:
    driver = Driver(language="de")
    (created,) = driver.events
    assert created["type"] == "session.created"
    assert created["session"]["type"] == "translation"
    assert created["session"]["audio"]["output"] == {"language": "de"}


def test_an_utterance_ends_after_half_a_second_of_silence() -> None:
    driver = Driver()
    driver.say(speech_chunks=30, silence_chunks=14)
    assert not [a for a in driver.actions if isinstance(a, Recognise)]
    driver.say(speech_chunks=0, silence_chunks=1)
    recognise = driver.pop(Recognise)
    assert len(recognise.audio) == 45 * CHUNK_SAMPLES
    # All the audio went to the VAD, in whole chunks.
    listened = sum(len(a.chunks) for a in driver.actions if isinstance(a, Listen))
    assert listened == 45


def test_each_utterance_is_heard_translated_and_spoken_in_order() -> None:
    driver = Driver(language="fr")
    driver.send(
        {
            "type": "session.update",
            "session": {"audio": {"input": {"transcription": {"model": "whisper-1"}}}},
        }
    )
    driver.say(30, 16)
    driver.say(30, 16)
    # The second waits for the first to be spoken.
    assert len([a for a in driver.actions if isinstance(a, Recognise)]) == 1
    driver.translate("Hello.", ["Bonjour", "."])
    driver.translate("Goodbye.", ["Au revoir."])
    deltas = [
        (e["type"].split(".")[1], e["delta"])
        for e in driver.events
        if e["type"].endswith("transcript.delta")
    ]
    assert deltas == [
        ("input_transcript", "Hello."),
        ("output_transcript", "Bonjour"),
        ("output_transcript", "."),
        ("input_transcript", " Goodbye."),
        ("output_transcript", " Au revoir."),
    ]
    audio = [e for e in driver.events if e["type"] == "session.output_audio.delta"]
    assert len(audio) == 2 and audio[0]["sample_rate"] == 24000


def test_the_output_language_goes_to_the_llm_and_can_change() -> None:
    driver = Driver(language="fr")
    driver.say(30, 16)
    driver.session.on_recognised(driver.pop(Recognise).utterance, "Hello.")
    driver.take()
    assert "French" in driver.pop(Translate).instructions
    driver.send({"type": "session.update", "session": {"audio": {"output": {"language": "ja"}}}})
    assert driver.events[-1]["session"]["audio"]["output"]["language"] == "ja"
    assert driver.session.config.language == "ja"


def test_close_flushes_the_utterance_being_said_then_ends() -> None:
    driver = Driver()
    driver.say(30, 3)
    driver.send({"type": "session.close"})
    assert "session.closed" not in driver.types()
    driver.translate("Hello.", ["Bonjour."])
    assert driver.types()[-1] == "session.closed"
    assert driver.pop(Close) == Close()


def test_close_waits_for_the_vads_answers() -> None:
    driver = Driver()
    pcm = np.full(20 * CHUNK_SAMPLES, 1000, dtype="<i2")
    driver.send(
        {
            "type": "session.input_audio_buffer.append",
            "audio": base64.b64encode(pcm.tobytes()).decode(),
        }
    )
    driver.send({"type": "session.close"})
    assert not [a for a in driver.actions if isinstance(a, (Recognise, Close))]
    driver.session.on_vad([0.9] * 20)
    driver.take()
    assert len(driver.pop(Recognise).audio) == 20 * CHUNK_SAMPLES


def test_speech_waiting_for_its_translation_is_bounded() -> None:
    driver = Driver()
    utterance_s = 46 * 0.032
    fits = int(MAX_WAITING_S // utterance_s)
    # One is in work, the others wait: the last of these is one too many.
    for _ in range(fits + 2):
        driver.say(30, 16)
    errors = [e["error"] for e in driver.events if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["translation_backlog"]


def test_an_engine_failure_is_told_and_the_next_utterance_goes_on() -> None:
    driver = Driver()
    driver.say(30, 16)
    driver.say(30, 16)
    driver.session.on_failed(driver.pop(Recognise).utterance, "The recognition failed.")
    driver.take()
    (error,) = [e["error"] for e in driver.events if e["type"] == "error"]
    assert error["type"] == "server_error"
    assert driver.pop(Recognise).utterance == 2


def test_a_session_that_lasted_too_long_ends() -> None:
    driver = Driver()
    driver.session.expire(3600)
    driver.take()
    assert driver.events[-1]["error"]["code"] == "session_expired"
    assert "60 minutes" in driver.events[-1]["error"]["message"]
    assert driver.session.closed

"""Transcription sessions on the sans-I/O core: their shape, their configuration, and what
they refuse (a session of ``type: "transcription"`` never creates a response)."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.realtime import (
    ClientSecretCreateResponse,
    RealtimeSessionCreateRequest,
    RealtimeTranscriptionSessionCreateRequest,
    SessionCreatedEvent,
    SessionUpdatedEvent,
)

from hark.protocol.client_secrets import encode_client_secret, parse_client_secret_request
from hark.protocol.session_config import SessionConfig, transcription_defaults
from hark.session.actions import Generate, Prefill, Recognise, Speculate, Transcribe
from tests.session.conftest import Driver, silence, voiced

TRANSCRIPTION_ONLY_FIELDS = {"object", "id", "expires_at", "type", "audio", "include"}


@pytest.fixture
def driver() -> Driver:
    """A transcription session as ``?intent=transcription`` opens one."""
    return Driver(config=transcription_defaults())


def update(driver: Driver, session: dict[str, Any], **event: Any) -> list[dict[str, Any]]:
    return driver.send({"type": "session.update", "session": session, **event})


def errors(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["error"] for e in events if e["type"] == "error"]


def assert_transcribed(events: list[dict[str, Any]], item_id: str, transcript: str) -> None:
    """The item's transcript completed once; deltas, where the engine sent any, add up to it."""
    kinds = ("delta", "completed")
    mine = [
        e
        for e in events
        if e["type"] in {f"conversation.item.input_audio_transcription.{k}" for k in kinds}
    ]
    assert {e["item_id"] for e in mine} == {item_id}
    (completed,) = [e for e in mine if e["type"].endswith(".completed")]
    assert completed["transcript"] == transcript
    deltas = [e["delta"] for e in mine if e["type"].endswith(".delta")]
    assert not deltas or "".join(deltas).strip() == transcript


def test_session_created_has_the_ga_transcription_shape(driver: Driver) -> None:
    created = driver.events[0]
    session = created["session"]
    assert session.keys() == TRANSCRIPTION_ONLY_FIELDS
    assert session["type"] == "transcription"
    assert session["object"] == "realtime.transcription_session"
    assert session["audio"].keys() == {"input"}
    assert session["audio"]["input"]["transcription"]["model"] == "whisper-1"
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    parsed = SessionCreatedEvent.model_validate(created)
    assert isinstance(parsed.session, RealtimeTranscriptionSessionCreateRequest)
    # A realtime session keeps the realtime shape.
    realtime = Driver().events[0]
    assert isinstance(
        SessionCreatedEvent.model_validate(realtime).session, RealtimeSessionCreateRequest
    )


def test_update_configures_input_and_include_and_echoes_any_model_name(driver: Driver) -> None:
    (updated,) = update(
        driver,
        {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcmu"},
                    "transcription": {
                        "model": "gpt-realtime-whisper",
                        "language": "fr",
                        "prompt": "Bonjour",
                        "delay": "low",
                    },
                    "noise_reduction": {"type": "far_field"},
                    "turn_detection": None,
                }
            },
            "include": ["item.input_audio_transcription.logprobs"],
        },
    )
    assert updated["type"] == "session.updated"
    assert isinstance(
        SessionUpdatedEvent.model_validate(updated).session,
        RealtimeTranscriptionSessionCreateRequest,
    )
    session = updated["session"]
    assert session.keys() == TRANSCRIPTION_ONLY_FIELDS
    audio_input = session["audio"]["input"]
    assert audio_input["format"] == {"type": "audio/pcmu"}
    assert audio_input["transcription"]["model"] == "gpt-realtime-whisper"
    assert audio_input["transcription"]["delay"] == "low"
    assert audio_input["noise_reduction"]["type"] == "far_field"
    assert audio_input["turn_detection"] is None
    assert session["include"] == ["item.input_audio_transcription.logprobs"]
    assert driver.session.input_rate == 8000
    # The language and prompt reach recognition.
    driver.append(voiced(300, 8000)[: 8000 * 300 // 1000])
    driver.send({"type": "input_audio_buffer.commit"})
    asked = [a.request for a in driver.take(Recognise)] + driver.take(Transcribe)
    assert asked
    for request in asked:
        assert request.language == "fr"
        assert request.prompt is not None and request.prompt.startswith("Bonjour")


def test_manual_commits_are_transcribed_and_never_answered(driver: Driver) -> None:
    update(driver, {"type": "transcription", "audio": {"input": {"turn_detection": None}}})
    driver.asr_text = "Set a timer for ten minutes."
    driver.append(voiced(800))
    new = driver.send({"type": "input_audio_buffer.commit"})
    assert driver.types(new)[:3] == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert_transcribed(new, new[0]["item_id"], "Set a timer for ten minutes.")
    assert not [a for a in driver.actions if isinstance(a, Generate | Prefill | Speculate)]


def test_server_vad_turns_are_transcribed_and_never_answered(driver: Driver) -> None:
    driver.asr_text = "Turn off the lights in the kitchen."
    driver.append(silence(500))
    driver.append(voiced(1200))
    driver.append(silence(800))
    types = driver.types()
    assert types[1:6] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert_transcribed(
        driver.events, driver.events[3]["item_id"], "Turn off the lights in the kitchen."
    )
    assert not [t for t in types if t.startswith("response.")]
    assert not [a for a in driver.actions if isinstance(a, Generate | Prefill | Speculate)]


@pytest.mark.parametrize(
    "event",
    [
        {"type": "response.create"},
        {"type": "response.create", "response": {"instructions": "Say hi."}},
        {"type": "response.cancel"},
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hello"}],
            },
        },
        {
            "type": "conversation.item.truncate",
            "item_id": "item_1",
            "content_index": 0,
            "audio_end_ms": 10,
        },
        {"type": "output_audio_buffer.clear"},
    ],
)
def test_realtime_only_events_are_refused_and_the_session_goes_on(
    driver: Driver, event: dict[str, Any]
) -> None:
    new = driver.send({**event, "event_id": "evt_client_7"})
    (error,) = errors(new)
    assert len(new) == 1
    assert error["code"] == "invalid_event"
    assert error["event_id"] == "evt_client_7"
    assert event["type"] in error["message"] and "transcription session" in error["message"]
    assert not driver.take(Generate)
    # The session goes on: it still takes updates and transcribes.
    assert driver.types(update(driver, {"type": "transcription"})) == ["session.updated"]


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"type": "transcription", "instructions": "Be brief."}, "session.instructions"),
        ({"type": "transcription", "model": "gpt-realtime"}, "session.model"),
        (
            {"type": "transcription", "audio": {"output": {"voice": "alloy"}}},
            "session.audio.output",
        ),
        ({"type": "transcription", "include": ["hark.turn_timings"]}, "session.include[0]"),
    ],
)
def test_realtime_fields_in_a_transcription_update_are_named(
    driver: Driver, session: dict[str, Any], param: str
) -> None:
    (error,) = errors(update(driver, session))
    assert error["param"] == param
    assert error["code"] in ("unknown_parameter", "invalid_value")


def test_a_session_keeps_its_type() -> None:
    realtime = Driver()
    (error,) = errors(update(realtime, {"type": "transcription"}, event_id="evt_switch_1"))
    assert error["code"] == "invalid_parameter"
    assert error["event_id"] == "evt_switch_1"
    assert error["message"] == (
        "Passing a transcription session update event to a realtime session is not allowed."
    )
    assert realtime.session.config.type == "realtime"

    transcription = Driver(config=transcription_defaults())
    (error,) = errors(update(transcription, {"type": "realtime", "instructions": "Hi."}))
    assert error["code"] == "invalid_parameter"
    assert "realtime session update event to a transcription session" in error["message"]
    assert transcription.session.config.type == "transcription"
    # An update without a type is one of the session's own type.
    (updated,) = update(transcription, {"audio": {"input": {"turn_detection": None}}})
    assert updated["session"]["type"] == "transcription"


def test_client_secret_for_a_transcription_session() -> None:
    body = (
        b'{"session": {"type": "transcription", "audio": {"input": {"transcription": '
        b'{"model": "gpt-4o-transcribe", "language": "en"}}}}}'
    )
    _, config = parse_client_secret_request(body)
    assert isinstance(config, SessionConfig) and config.type == "transcription"
    answer = ClientSecretCreateResponse.model_validate_json(
        encode_client_secret("ek_test", 1_000_600, config, "sess_1")
    )
    assert answer.session.type == "transcription"
    assert answer.session.object == "realtime.transcription_session"
    assert answer.session.audio is not None and answer.session.audio.input is not None
    transcription = answer.session.audio.input.transcription
    assert transcription is not None and transcription.model == "gpt-4o-transcribe"
    with pytest.raises(Exception, match=r"session\.tools"):
        parse_client_secret_request(b'{"session": {"type": "transcription", "tools": []}}')

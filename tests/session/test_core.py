"""Protocol behaviour of the sans-I/O session core, driven by the sample clock."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.codecs.g711 import ulaw_decode, ulaw_encode
from hark.engines.asr import Urgency
from hark.engines.llm import Finished
from hark.session.actions import AnalyzeSpeech, CancelGeneration, Close, Generate
from hark.session.core import Session
from hark.session.ids import IdGenerator
from hark.session.results import (
    AudioGenerated,
    GenerationFailed,
    GenerationFinished,
    Recognised,
    TextGenerated,
    ToolCallDelta,
    ToolCallFinished,
    ToolCallStarted,
)

from .conftest import RATE, Driver, manual, silence, timed, voiced


def spoken_turn(driver: Driver, speech_ms: int = 1000, pause_ms: int = 700) -> None:
    driver.append(silence(500))
    driver.append(voiced(speech_ms))
    driver.append(silence(pause_ms))


# ---------------------------------------------------------------- session


def test_session_created_first_with_full_config(driver: Driver) -> None:
    first = driver.events[0]
    assert first["type"] == "session.created"
    session = first["session"]
    assert session["id"].startswith("sess_")
    assert session["object"] == "realtime.session"
    assert session["model"] == "gpt-realtime"
    assert session["expires_at"] == 1000 + 3600
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}


def test_partial_update_keeps_other_fields(driver: Driver) -> None:
    driver.send(
        {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}
    )
    new = driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}
                }
            },
        }
    )
    assert driver.types(new) == ["session.updated"]
    session = new[0]["session"]
    assert session["instructions"] == "Be brief."
    td = session["audio"]["input"]["turn_detection"]
    assert td["silence_duration_ms"] == 800
    assert td["threshold"] == 0.5  # merged, not reset
    assert session["audio"]["output"]["voice"] == "alloy"


@pytest.mark.parametrize(
    ("session", "param", "code"),
    [
        ({"audio": {"output": {"speed": "fast"}}}, "session.audio.output.speed", "invalid_type"),
        ({"audio": {"output": {"speed": 3.0}}}, "session.audio.output.speed", "invalid_value"),
        (
            {"audio": {"input": {"format": {"type": "audio/mp3"}}}},
            "session.audio.input.format.type",
            "invalid_value",
        ),
        ({"output_modalities": ["video"]}, "session.output_modalities[0]", "invalid_value"),
        ({"max_output_tokens": 0}, "session.max_output_tokens", "invalid_value"),
        ({"tool_choice": "sometimes"}, "session.tool_choice", "invalid_value"),
        ({"frobnicate": 1}, "session.frobnicate", "unknown_parameter"),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
            "session.audio.input.turn_detection.threshold",
            "invalid_value",
        ),
        ({"tools": [{"type": "function"}]}, "session.tools[0].name", "missing_required_parameter"),
        ({"output_modalities": ["audio", "text"]}, "session.output_modalities", "invalid_value"),
    ],
)
def test_update_errors_name_the_param(driver: Driver, session: dict, param: str, code: str) -> None:
    new = driver.send({"type": "session.update", "event_id": "evt_9", "session": session})
    assert driver.types(new) == ["error"]
    error = new[0]["error"]
    assert error["param"] == param
    assert error["code"] == code
    assert error["event_id"] == "evt_9"
    assert error["type"] == "invalid_request_error"
    # The failed update changed nothing.
    ok = driver.send({"type": "session.update", "session": {}})
    assert ok[0]["session"]["audio"]["output"]["speed"] == 1.0


def test_null_turn_detection_and_clearing(driver: Driver) -> None:
    new = driver.send(
        {
            "type": "session.update",
            "session": {
                "instructions": "",
                "tools": [],
                "audio": {"input": {"turn_detection": None}},
            },
        }
    )
    session = new[0]["session"]
    assert session["instructions"] == ""
    assert session["audio"]["input"]["turn_detection"] is None
    # No VAD: speech produces no turn events.
    assert "input_audio_buffer.speech_started" not in driver.types(driver.append(voiced(500)))


def test_semantic_vad_accepted(driver: Driver) -> None:
    new = driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}
                }
            },
        }
    )
    assert new[0]["session"]["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": True,
    }
    # Without a judgement of the utterance, a pause ends as server_vad's default would.
    spoken_turn(driver, pause_ms=400)
    assert "input_audio_buffer.speech_stopped" not in driver.types()
    driver.append(silence(200))
    assert "input_audio_buffer.speech_stopped" in driver.types()


# ---------------------------------------------------------------- input buffer


def test_commit_creates_user_item_and_transcription(driver: Driver) -> None:
    manual(driver)
    driver.append(voiced(300))
    new = driver.send({"type": "input_audio_buffer.commit"})
    assert driver.types(new) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    item = new[1]["item"]
    assert item["role"] == "user" and item["content"][0]["type"] == "input_audio"
    # The buffer was recognised as it came: a final step decodes what no step had.
    (action,) = driver.steps(Urgency.ANSWER)
    assert action.request_id.startswith(item["id"])
    assert len(action.request.audio) == 16000 * 300 // 1000
    assert not driver.take(Generate)  # commit does not start a response


def test_commit_empty_is_an_error_and_clear_works(driver: Driver) -> None:
    manual(driver)
    new = driver.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    assert new[0]["error"]["code"] == "input_audio_buffer_commit_empty"
    assert new[0]["error"]["event_id"] == "c1"
    driver.append(voiced(300))
    assert driver.types(driver.send({"type": "input_audio_buffer.clear"})) == [
        "input_audio_buffer.cleared"
    ]
    assert driver.send({"type": "input_audio_buffer.commit"})[0]["type"] == "error"


def test_input_transcription_events_only_when_configured(driver: Driver) -> None:
    manual(driver)
    driver.append(voiced(300))
    driver.send({"type": "input_audio_buffer.commit"})
    assert driver.types(driver.transcribe_all("hello")) == []
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"}}}
            },
        }
    )
    driver.append(voiced(300))
    (committed,) = driver.send({"type": "input_audio_buffer.commit"})[:1]
    (action,) = driver.steps(Urgency.ANSWER)
    assert action.request.language == "en"
    driver.session.handle(Recognised(action.request_id, timed("hello there", 0.3)), now=driver.now)
    new = driver.pump()
    assert driver.types(new) == [
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
    ]
    assert new[0]["delta"] == new[1]["transcript"] == "hello there"
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": committed["item_id"]})
    assert retrieved[0]["item"]["content"][0]["transcript"] == "hello there"


# ---------------------------------------------------------------- server VAD turns


def test_server_vad_turn_sequence(driver: Driver) -> None:
    spoken_turn(driver, speech_ms=1000, pause_ms=700)
    types = driver.types()
    assert types[1:6] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    started = driver.events[1]
    stopped = driver.events[2]
    # Speech began at 500 ms; 300 ms of prefix padding; the turn ends 500 ms into the silence.
    assert started["audio_start_ms"] == pytest.approx(200, abs=40)
    assert stopped["audio_end_ms"] == pytest.approx(2000, abs=40)
    assert started["item_id"] == stopped["item_id"] == driver.events[3]["item_id"]
    assert "response.created" in types
    # The response waits for the transcript before the LLM starts.
    assert not driver.take(Generate)
    # Recognition started during the pause, on the speech (padding included) and the silence
    # the VAD had heard (about 100 ms); its result becomes the item's transcript, so there is
    # no second request.
    (asr,) = driver.steps(Urgency.SPECULATION, Urgency.ANSWER)
    assert asr.request.urgency == Urgency.SPECULATION
    assert len(asr.request.audio) / 16000 == pytest.approx(1.4, abs=0.05)
    driver.session.handle(
        Recognised(asr.request_id, timed("What is the capital of France?", 1.3)), now=driver.now
    )
    driver.pump()
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].content == "What is the capital of France?"
    assert generate.request.messages[0].role == "system"


def test_short_pause_does_not_end_the_turn(driver: Driver) -> None:
    driver.append(voiced(600))
    driver.append(silence(300))
    driver.append(voiced(600))
    assert "input_audio_buffer.speech_stopped" not in driver.types()
    driver.append(silence(600))
    assert driver.types().count("input_audio_buffer.speech_stopped") == 1


def test_create_response_false(driver: Driver) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "create_response": False}}
                }
            },
        }
    )
    spoken_turn(driver)
    assert "input_audio_buffer.committed" in driver.types()
    assert "response.created" not in driver.types()


def response_in_progress(driver: Driver) -> Generate:
    spoken_turn(driver)
    driver.transcribe_all()
    (generate,) = driver.take(Generate)
    driver.session.handle(
        AudioGenerated(generate.response_id, voiced(400), "The capital"), now=driver.now
    )
    driver.pump()
    return generate


def test_barge_in_cancels_with_turn_detected(driver: Driver) -> None:
    generate = response_in_progress(driver)
    new = driver.append(voiced(300))
    types = driver.types(new)
    assert types[0] == "input_audio_buffer.speech_started"
    done = next(e for e in new if e["type"] == "response.done")
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    assert done["response"]["output"][0]["status"] == "incomplete"
    assert any(
        isinstance(a, CancelGeneration) and a.response_id == generate.response_id
        for a in driver.actions
    )
    # Late engine output for the cancelled response is ignored.
    driver.session.handle(
        AudioGenerated(generate.response_id, voiced(100), " is Paris."), now=driver.now
    )
    assert driver.pump() == []


def test_no_barge_in_when_interrupt_response_false(driver: Driver) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}
                }
            },
        }
    )
    response_in_progress(driver)
    new = driver.append(voiced(300))
    assert "input_audio_buffer.speech_started" in driver.types(new)
    assert "response.done" not in driver.types(new)


def test_idle_timeout_triggers_a_response(driver: Driver) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 2000}}
                }
            },
        }
    )
    generate = response_in_progress(driver)
    driver.speak_reply(generate, [" is Paris."])
    driver.append(silence(2000))
    assert "input_audio_buffer.timeout_triggered" not in driver.types()
    new = driver.append(silence(1500))
    types = driver.types(new)
    assert "input_audio_buffer.timeout_triggered" in types
    assert "response.created" in types


# ---------------------------------------------------------------- responses


def test_full_audio_response_sequence(driver: Driver) -> None:
    generate = response_in_progress(driver)
    start = len(driver.events)
    driver.speak_reply(generate, [" is Paris."])
    types = driver.types(driver.events[start:])
    assert types == [
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    head = driver.types()
    i = head.index("response.created")
    assert head[i + 1 : i + 6] == [
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
    ]
    done = driver.events[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["transcript"] == "The capital is Paris."
    # The LLM's 20 tokens of text, and the user's turn's audio as OpenAI would count it.
    details = done["usage"]["input_token_details"]
    assert details["text_tokens"] == 20 and details["audio_tokens"] > 0
    assert done["usage"]["input_tokens"] == 20 + details["audio_tokens"]
    assert done["usage"]["output_token_details"]["audio_tokens"] == 16  # 800 ms / 50 ms
    audio = b"".join(
        base64.b64decode(e["delta"])
        for e in driver.events
        if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) == 2 * RATE * 800 // 1000


def test_one_in_band_response_at_a_time(driver: Driver) -> None:
    manual(driver)
    driver.send({"type": "response.create"})
    new = driver.send({"type": "response.create", "event_id": "r2"})
    assert new[0]["error"]["code"] == "conversation_already_has_active_response"
    # An out-of-band response may run beside it.
    oob = driver.send(
        {
            "type": "response.create",
            "response": {"conversation": "none", "metadata": {"topic": "x"}},
        }
    )
    assert oob[0]["type"] == "response.created"
    assert oob[0]["response"]["conversation_id"] is None
    assert oob[0]["response"]["metadata"] == {"topic": "x"}


def test_text_response_with_overrides(driver: Driver) -> None:
    manual(driver)
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            },
        }
    )
    driver.send(
        {
            "type": "response.create",
            "response": {
                "instructions": "Answer in French.",
                "output_modalities": ["text"],
                "max_output_tokens": 5,
            },
        }
    )
    (generate,) = driver.take(Generate)
    assert not generate.audio
    assert generate.request.max_tokens == 5
    assert generate.request.messages[0].content == "Answer in French."
    assert generate.request.messages[1].content == "Hi"
    for word in ["Bon", "jour"]:
        driver.session.handle(TextGenerated(generate.response_id, word), now=driver.now)
    driver.session.handle(
        GenerationFinished(generate.response_id, Finished("length", 10, 5)), now=driver.now
    )
    new = driver.pump()
    assert driver.types(new)[:3] == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert [e["delta"] for e in new if e["type"] == "response.output_text.delta"] == ["Bon", "jour"]
    text_done = next(e for e in new if e["type"] == "response.output_text.done")
    assert text_done["text"] == "Bonjour"
    done = new[-1]["response"]
    assert done["status"] == "incomplete"
    assert done["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}


def test_out_of_band_response_leaves_conversation_alone(driver: Driver) -> None:
    manual(driver)
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            },
        }
    )
    before = len(driver.session.conversation)
    driver.send(
        {
            "type": "response.create",
            "response": {
                "conversation": "none",
                "output_modalities": ["text"],
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Classify: hello"}],
                    }
                ],
            },
        }
    )
    (generate,) = driver.take(Generate)
    assert [m.content for m in generate.request.messages[1:]] == ["Classify: hello"]
    driver.session.handle(TextGenerated(generate.response_id, "greeting"), now=driver.now)
    driver.session.handle(
        GenerationFinished(generate.response_id, Finished("stop")), now=driver.now
    )
    new = driver.pump()
    assert "conversation.item.added" not in driver.types(new)
    assert len(driver.session.conversation) == before


def test_response_input_item_reference(driver: Driver) -> None:
    manual(driver)
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "id": "u1",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "one"}],
            },
        }
    )
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "id": "u2",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "two"}],
            },
        }
    )
    driver.send(
        {
            "type": "response.create",
            "response": {"conversation": "none", "input": [{"type": "item_reference", "id": "u2"}]},
        }
    )
    (generate,) = driver.take(Generate)
    assert [m.content for m in generate.request.messages[1:]] == ["two"]
    new = driver.send(
        {
            "type": "response.create",
            "response": {
                "conversation": "none",
                "input": [{"type": "item_reference", "id": "nope"}],
            },
        }
    )
    assert new[0]["error"]["param"] == "response.input[0].id"


def test_cancel(driver: Driver) -> None:
    new = driver.send({"type": "response.cancel", "event_id": "x1"})
    assert new[0]["error"]["code"] == "response_cancel_not_active"
    assert new[0]["error"]["event_id"] == "x1"
    manual(driver)
    created = driver.send({"type": "response.create"})[0]
    new = driver.send({"type": "response.cancel"})
    assert new[-1]["type"] == "response.done"
    assert new[-1]["response"]["id"] == created["response"]["id"]
    assert new[-1]["response"]["status_details"] == {
        "type": "cancelled",
        "reason": "client_cancelled",
    }


def test_forced_tool_call_and_output(driver: Driver) -> None:
    manual(driver)
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
    driver.send(
        {
            "type": "session.update",
            "session": {
                "tools": [tool],
                "tool_choice": {"type": "function", "name": "get_weather"},
            },
        }
    )
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in Paris?"}],
            },
        }
    )
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert generate.request.tool_choice.mode == "function"
    assert generate.request.tool_choice.name == "get_weather"
    assert generate.request.tools[0].parameters["required"] == ["city"]
    rid = generate.response_id
    driver.session.handle(ToolCallStarted(rid, "call_1", "get_weather"), now=driver.now)
    driver.session.handle(ToolCallDelta(rid, "call_1", '{"city":'), now=driver.now)
    driver.session.handle(ToolCallDelta(rid, "call_1", '"Paris"}'), now=driver.now)
    driver.session.handle(ToolCallFinished(rid, "call_1", '{"city":"Paris"}'), now=driver.now)
    driver.session.handle(GenerationFinished(rid, Finished("tool_calls")), now=driver.now)
    new = driver.pump()
    assert driver.types(new) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert new[4]["name"] == "get_weather" and new[4]["arguments"] == '{"city":"Paris"}'
    assert new[-1]["response"]["output"][0]["type"] == "function_call"
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": '{"temp_c": 18}',
            },
        }
    )
    driver.send({"type": "response.create", "response": {"tool_choice": "none"}})
    (second,) = driver.take(Generate)
    roles = [m.role for m in second.request.messages]
    assert roles[-2:] == ["assistant", "tool"]
    assert second.request.messages[-2].tool_calls[0].name == "get_weather"
    assert second.request.messages[-1].tool_call_id == "call_1"


def test_rate_limits_and_engine_failure(driver: Driver) -> None:
    manual(driver)
    new = driver.send({"type": "response.create"})
    assert driver.types(new) == ["response.created", "rate_limits.updated"]
    names = [r["name"] for r in new[1]["rate_limits"]]
    assert names == ["requests", "tokens"]
    (generate,) = driver.take(Generate)
    driver.session.handle(GenerationFailed(generate.response_id, "LLM unreachable"), now=driver.now)
    done = driver.pump()[-1]["response"]
    assert done["status"] == "failed"
    assert done["status_details"]["error"]["message"] == "LLM unreachable"
    assert driver.send({"type": "response.create"})[0]["type"] == "response.created"


# ---------------------------------------------------------------- conversation items


def test_item_create_order_retrieve_delete(driver: Driver) -> None:
    def create(item_id: str, previous: str | None = None) -> dict:
        event = {
            "type": "conversation.item.create",
            "item": {
                "id": item_id,
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": item_id}],
            },
        }
        if previous is not None:
            event["previous_item_id"] = previous
        return driver.send(event)[0]

    assert create("a")["previous_item_id"] is None
    assert create("c")["previous_item_id"] == "a"
    assert create("b", "a")["previous_item_id"] == "a"
    assert create("z", "root")["previous_item_id"] is None
    assert [e.id for e in driver.session.conversation.entries()] == ["z", "a", "b", "c"]
    assert (
        driver.send({"type": "conversation.item.retrieve", "item_id": "b"})[0]["item"]["content"][
            0
        ]["text"]
        == "b"
    )
    assert driver.send({"type": "conversation.item.delete", "item_id": "b"})[0] == {
        "type": "conversation.item.deleted",
        "event_id": driver.events[-1]["event_id"],
        "item_id": "b",
    }
    for event in (
        {"type": "conversation.item.retrieve", "item_id": "b"},
        {"type": "conversation.item.delete", "item_id": "b"},
    ):
        assert driver.send(event)[0]["error"]["code"] == "item_not_found"
    assert (
        driver.send(
            {
                "type": "conversation.item.create",
                "previous_item_id": "nope",
                "item": {"type": "message", "role": "user", "content": []},
            }
        )[0]["error"]["param"]
        == "previous_item_id"
    )
    bad = driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "system",
                "content": [{"type": "output_text", "text": "x"}],
            },
        }
    )
    assert bad[0]["error"]["param"] == "item.content[0].type"


def test_user_audio_item_is_recognised(driver: Driver) -> None:
    manual(driver)
    audio = base64.b64encode(voiced(400).astype("<i2").tobytes()).decode()
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": audio}],
            },
        }
    )
    driver.send({"type": "response.create"})
    assert not driver.take(Generate)
    driver.transcribe_all("good morning")
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].content == "good morning"


def test_truncate_cuts_audio_and_transcript(driver: Driver) -> None:
    generate = response_in_progress(driver)
    driver.speak_reply(generate, [" is Paris, and", " it is lovely."], ms_per_clause=400)
    item = driver.events[-1]["response"]["output"][0]
    # Clauses: "The capital" 0-400, " is Paris, and" 400-800, " it is lovely." 800-1200;
    # at 700 ms three quarters of the second clause was heard: two of its three words.
    new = driver.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item["id"],
            "content_index": 0,
            "audio_end_ms": 700,
        }
    )
    assert new[0] == {
        "type": "conversation.item.truncated",
        "event_id": new[0]["event_id"],
        "item_id": item["id"],
        "content_index": 0,
        "audio_end_ms": 700,
    }
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": item["id"]})[0][
        "item"
    ]["content"][0]
    assert len(base64.b64decode(retrieved["audio"])) == 2 * RATE * 700 // 1000
    assert retrieved["transcript"] == "The capital is Paris,"
    # What the LLM sees next is what was heard.
    driver.send({"type": "response.create"})
    (nxt,) = driver.take(Generate)
    assert nxt.request.messages[-1].content == "The capital is Paris,"
    driver.send({"type": "response.cancel"})
    past = driver.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item["id"],
            "content_index": 0,
            "audio_end_ms": 5000,
        }
    )
    assert past[0]["error"]["param"] == "audio_end_ms"
    unknown = driver.send(
        {
            "type": "conversation.item.truncate",
            "item_id": "item_nope",
            "content_index": 0,
            "audio_end_ms": 10,
        }
    )
    assert unknown[0]["error"]["code"] == "item_not_found"


# ---------------------------------------------------------------- formats


def test_g711_in_and_out(driver: Driver) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"format": {"type": "audio/pcmu"}},
                    "output": {"format": {"type": "audio/pcmu"}},
                }
            },
        }
    )
    tone = voiced(1000, 8000)
    for i in range(0, len(tone), 160):
        driver.send(
            {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(ulaw_encode(tone[i : i + 160])).decode(),
            }
        )
    for _ in range(0, 8000 * 7 // 10, 160):
        driver.send(
            {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(ulaw_encode(np.zeros(160, np.int16))).decode(),
            }
        )
    assert "input_audio_buffer.speech_stopped" in driver.types()
    (asr,) = driver.steps(Urgency.SPECULATION)
    # Speech from 0 ms (no room for prefix padding) to the start of the pause, and the
    # silence the VAD had heard.
    assert len(asr.request.audio) / 16000 == pytest.approx(1.1, abs=0.06)
    driver.session.handle(
        Recognised(asr.request_id, timed("What is the capital of France?", 1.0)), now=driver.now
    )
    driver.pump()
    (generate,) = driver.take(Generate)
    assert generate.output_rate == 8000
    driver.speak_reply(generate, ["Paris."], ms_per_clause=500)
    delta = next(e for e in driver.events if e["type"] == "response.output_audio.delta")
    assert len(ulaw_decode(base64.b64decode(delta["delta"]))) == 4000


# ---------------------------------------------------------------- limits and bad input


def test_session_limit(driver: Driver) -> None:
    assert driver.session.next_deadline() == 1000 + 3600
    driver.session.handle_timer(1000 + 3599)
    assert driver.pump() == []
    driver.session.handle_timer(1000 + 3600)
    new = driver.pump()
    assert new[-1]["error"]["code"] == "session_expired"
    assert any(isinstance(a, Close) for a in driver.actions)


BAD_INPUTS = [
    ("{not json", "invalid_json", None),
    ('{"event_id": "e1"}', "invalid_event", None),
    ('["a"]', "invalid_event", None),
    ('{"type": "nope", "event_id": "e1"}', "invalid_value", "type"),
    (
        '{"type": "input_audio_buffer.append", "audio": 5, "event_id": "e1"}',
        "invalid_type",
        "audio",
    ),
    (
        '{"type": "input_audio_buffer.append", "audio": "@@@not base64", "event_id": "e1"}',
        "invalid_value",
        "audio",
    ),
    (
        '{"type": "conversation.item.truncate", "item_id": "x", "content_index": "0", '
        '"audio_end_ms": 1, "event_id": "e1"}',
        "invalid_type",
        "content_index",
    ),
    (
        '{"type": "response.create", "response": {"output_modalities": "audio"}, "event_id": "e1"}',
        "invalid_type",
        "response.output_modalities",
    ),
    (
        '{"type": "conversation.item.create", "item": {"type": "message"}, "event_id": "e1"}',
        "missing_required_parameter",
        "item.role",
    ),
    ('{"type": "response.cancel", "event_id": "e1"}', "response_cancel_not_active", None),
    (
        '{"type": "input_audio_buffer.commit", "event_id": "e1"}',
        "input_audio_buffer_commit_empty",
        None,
    ),
]


@pytest.mark.parametrize(("raw", "code", "param"), BAD_INPUTS)
def test_bad_input_gets_one_error_and_the_session_goes_on(
    driver: Driver, raw: str, code: str, param: str | None
) -> None:
    manual(driver)
    new = driver.send(raw)
    assert driver.types(new) == ["error"]
    error = new[0]["error"]
    assert error["code"] == code
    assert error["param"] == param
    assert set(error) == {"type", "code", "message", "param", "event_id"}
    if '"event_id": "e1"' in raw:
        assert error["event_id"] == "e1"
    assert driver.send({"type": "session.update", "session": {}})[0]["type"] == "session.updated"


def test_oversized_append_and_binary(driver: Driver) -> None:
    big = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (15 * 1024 * 1024 + 4)})
    new = driver.send(big)
    assert new[0]["error"]["param"] == "audio"
    assert "15 MiB" in new[0]["error"]["message"]
    driver.session.receive_binary(b"\x00\x01", now=driver.now)
    assert driver.pump()[0]["error"]["code"] == "invalid_event"
    assert (
        driver.send({"type": "input_audio_buffer.clear"})[0]["type"] == "input_audio_buffer.cleared"
    )


def test_odd_pcm_bytes_rejected(driver: Driver) -> None:
    new = driver.send(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x00\x01\x02").decode()}
    )
    assert new[0]["error"]["param"] == "audio"


def test_audio_errors_speak_of_base64_text(driver: Driver) -> None:
    wrong_type = driver.send({"type": "input_audio_buffer.append", "audio": 5})[0]["error"]
    assert "string of base64" in wrong_type["message"]
    assert "bytes" not in wrong_type["message"]
    not_base64 = driver.send({"type": "input_audio_buffer.append", "audio": "ab"})[0]["error"]
    assert not_base64["message"] == "Invalid 'audio': expected base64-encoded audio."


@pytest.mark.parametrize("sizes", [[480], [100, 1000, 7], [768], [2000, 1, 767], [5000]])
def test_vad_chunks_are_the_appended_audio_whatever_the_append_sizes(sizes: list[int]) -> None:
    session = Session(
        model="gpt-realtime", ids=IdGenerator(seed=7), vad_chunk_ms=32, asr_rate=16000
    )
    session.drain()
    rng = np.random.default_rng(3)
    sent: list[npt.NDArray[np.int16]] = []
    chunks: list[npt.NDArray[np.int16]] = []
    for _ in range(6):
        for size in sizes:
            pcm = rng.integers(-3000, 3000, size, dtype=np.int16)
            sent.append(pcm)
            audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
            append = json.dumps({"type": "input_audio_buffer.append", "audio": audio})
            session.receive(append, now=0.0)
            # Kept as handed out, not copied: a chunk the VAD may still be reading must never
            # be written again.
            chunks += [c for a in session.drain() if isinstance(a, AnalyzeSpeech) for c in a.chunks]
    # 32 ms chunks at 24 kHz, cut from the audio in order, the last partial one held back.
    everything = np.concatenate(sent)
    assert all(len(chunk) == 768 for chunk in chunks)
    assert len(chunks) == len(everything) // 768
    assert np.array_equal(np.concatenate(chunks), everything[: len(chunks) * 768])


def test_mcp_items_are_stored_and_seen_by_the_model(driver: Driver) -> None:
    manual(driver)
    items: list[dict[str, Any]] = [
        {
            "type": "mcp_list_tools",
            "server_label": "shop",
            "tools": [{"name": "price", "input_schema": {}}],
        },
        {
            "id": "call_a",
            "type": "mcp_call",
            "server_label": "shop",
            "name": "price",
            "arguments": '{"item":"tea"}',
            "output": "3 euros",
        },
        {"type": "mcp_approval_request", "server_label": "shop", "name": "buy", "arguments": "{}"},
    ]
    for item in items:
        added = driver.send({"type": "conversation.item.create", "item": item})
        assert added[0]["type"] == "conversation.item.added"
        assert added[0]["item"]["type"] == item["type"]
    approval_id = added[0]["item"]["id"]
    answer = {"type": "mcp_approval_response", "approval_request_id": approval_id, "approve": False}
    assert (
        driver.send({"type": "conversation.item.create", "item": answer})[0]["item"]["approve"]
        is False
    )
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": "call_a"})[0]["item"]
    assert retrieved["output"] == "3 euros"
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert any(
        m.role == "tool" and m.content == "3 euros" and m.tool_call_id == "call_a"
        for m in generate.request.messages
    )
    bad = driver.send(
        {"type": "conversation.item.create", "item": {"type": "mcp_call", "name": "x"}}
    )
    assert bad[0]["error"]["code"] == "missing_required_parameter"

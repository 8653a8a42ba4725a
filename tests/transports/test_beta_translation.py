"""The beta dialect's translation, both ways, around the sans-I/O core: a client of the preview
(flat session, ``response.audio.delta``, ``conversation.item.created``…) and the older
``transcription_session.update``, which GA connections still take."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from hark.engines.llm import Finished
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import SessionConfig, transcription_defaults
from hark.session.actions import Generate
from hark.session.results import GenerationFinished, TextGenerated
from hark.transports.beta import (
    MAX_WAITING,
    Dialect,
    DialectSession,
    beta_error,
    flat_session,
    ga_session_update,
    is_beta,
    parse_flat_session,
)
from tests.session.conftest import Driver

GA_ONLY = {"conversation.item.added", "conversation.item.done", "response.output_audio.delta"}


class Client:
    """A client of one dialect talking to the core through ``Dialect``."""

    def __init__(self, *, beta: bool, config: SessionConfig | None = None) -> None:
        self.dialect = Dialect(beta=beta)
        self.driver = Driver(config=config)
        self.events = self.translate(self.driver.events)

    def translate(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            text = msgspec.json.encode(event).decode()
            out += [json.loads(t) for t in self.dialect.outgoing(text)]
        return out

    def send(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        return self.translate(self.driver.send(self.dialect.incoming(json.dumps(event))))

    def generate(self) -> Generate:
        (generate,) = self.driver.take(Generate)
        return generate

    def finish(self, generate: Generate) -> list[dict[str, Any]]:
        session = self.driver.session
        session.handle(
            GenerationFinished(generate.response_id, Finished("stop", 10, 3)), now=self.driver.now
        )
        return self.translate(self.driver.pump())


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def error_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    (error,) = [e["error"] for e in events if e["type"] == "error"]
    assert isinstance(error, dict)
    return error


def test_the_dialect_is_chosen_by_header_or_subprotocol() -> None:
    assert is_beta({"OpenAI-Beta": "realtime=v1"})
    assert is_beta({"OpenAI-Beta": "assistants=v2, realtime=v1"})
    assert is_beta({"Sec-WebSocket-Protocol": "realtime, openai-beta.realtime-v1"})
    assert not is_beta({"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.ek_1"})
    assert not is_beta({"OpenAI-Beta": "assistants=v2"})
    assert not is_beta({})


def test_session_created_is_flat_and_followed_by_conversation_created() -> None:
    client = Client(beta=True)
    assert types(client.events) == ["session.created", "conversation.created"]
    session = client.events[0]["session"]
    assert session["object"] == "realtime.session"
    assert session["id"].startswith("sess_")
    assert session["modalities"] == ["audio", "text"]
    assert session["input_audio_format"] == session["output_audio_format"] == "pcm16"
    assert session["voice"] == "alloy"
    assert session["turn_detection"]["type"] == "server_vad"
    assert session["max_response_output_tokens"] == "inf"
    assert not {"audio", "output_modalities", "type"} & session.keys()
    assert client.events[1]["conversation"]["object"] == "realtime.conversation"


def test_a_transcription_session_is_created_as_one_without_a_conversation() -> None:
    # As the preview announced a connection made with ?intent=transcription (or a key from
    # POST /v1/realtime/transcription_sessions): no client_secret, which only the REST answer
    # carried.
    client = Client(beta=True, config=transcription_defaults())
    assert types(client.events) == ["transcription_session.created"]
    session = client.events[0]["session"]
    assert session["object"] == "realtime.transcription_session"
    assert session["input_audio_format"] == "pcm16"
    assert "client_secret" not in session
    assert not {"audio", "type", "voice", "instructions"} & session.keys()
    # A GA client is told in GA names.
    assert types(Client(beta=False, config=transcription_defaults()).events) == ["session.created"]


def test_flat_session_update_configures_the_ga_session() -> None:
    client = Client(beta=True)
    (updated,) = client.send(
        {
            "type": "session.update",
            "event_id": "evt_1",
            "session": {
                "modalities": ["text"],
                "instructions": "Be terse.",
                "voice": "echo",
                "input_audio_format": "g711_ulaw",
                "output_audio_format": "g711_alaw",
                "input_audio_transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {"silence_duration_ms": 800},
                "temperature": 0.7,
                "max_response_output_tokens": 300,
                "tools": [{"type": "function", "name": "lookup", "parameters": {}}],
                "tool_choice": "auto",
            },
        }
    )
    config = client.driver.session.config
    assert config.output_modalities == ["text"]
    assert config.instructions == "Be terse."
    assert config.audio.output.voice == "echo"
    assert config.audio.input.format.__struct_config__.tag == "audio/pcmu"
    assert config.audio.output.format.__struct_config__.tag == "audio/pcma"
    assert config.max_output_tokens == 300 and config.temperature == 0.7
    assert config.audio.input.transcription is not None
    assert config.audio.input.transcription.language == "en"
    assert [tool["name"] for tool in msgspec.to_builtins(config.tools)] == ["lookup"]
    assert updated["type"] == "session.updated"
    session = updated["session"]
    assert session["modalities"] == ["text"]
    assert session["input_audio_format"] == "g711_ulaw"
    assert session["output_audio_format"] == "g711_alaw"
    assert session["input_audio_transcription"] == {
        "model": "whisper-1",
        "language": "en",
        "prompt": None,
    }
    assert session["turn_detection"]["type"] == "server_vad"
    assert session["turn_detection"]["silence_duration_ms"] == 800
    assert session["max_response_output_tokens"] == 300
    # GA's ["audio"] reads as beta's ["audio", "text"].
    (updated,) = client.send({"type": "session.update", "session": {"modalities": ["audio"]}})
    assert client.driver.session.config.output_modalities == ["audio"]
    assert updated["session"]["modalities"] == ["audio", "text"]


@pytest.mark.parametrize(
    ("session", "param", "code"),
    [
        ({"voice": 5}, "session.voice", "invalid_type"),
        ({"max_response_output_tokens": 0}, "session.max_response_output_tokens", None),
        ({"turn_detection": {"threshold": 5}}, "session.turn_detection.threshold", None),
        ({"input_audio_format": "opus"}, "session.input_audio_format", "invalid_value"),
        ({"audio": {}}, "session.audio", "unknown_parameter"),
        ({"speed": 9}, "session.speed", None),
    ],
)
def test_errors_name_the_beta_parameter(
    session: dict[str, Any], param: str, code: str | None
) -> None:
    client = Client(beta=True)
    before = client.driver.session.config
    error = error_of(client.send({"type": "session.update", "session": session, "event_id": "e7"}))
    assert error["param"] == param
    assert param in error["message"]
    assert error["event_id"] == "e7"
    if code is not None:
        assert error["code"] == code
    assert client.driver.session.config == before
    # Without an event_id, none is echoed (not the one hark used on the way through).
    error = error_of(client.send({"type": "session.update", "session": session}))
    assert error["event_id"] is None and error["param"] == param


def test_a_text_turn_in_beta_names() -> None:
    client = Client(beta=True)
    created = client.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Say hi."}],
            },
        }
    )
    assert types(created) == ["conversation.item.created"]
    assert created[0]["item"]["content"][0]["type"] == "input_text"
    started = client.send({"type": "response.create", "response": {"modalities": ["text"]}})
    (response_created,) = [e for e in started if e["type"] == "response.created"]
    response = response_created["response"]
    assert response["modalities"] == ["text"]
    assert not {"output_modalities", "audio"} & response.keys()
    generate = client.generate()
    client.driver.session.handle(TextGenerated(generate.response_id, "Hi"), now=client.driver.now)
    events = started + client.translate(client.driver.pump()) + client.finish(generate)
    kinds = types(events)
    assert not GA_ONLY & set(kinds)
    assert "response.text.delta" in kinds and "response.text.done" in kinds
    (part,) = [e["part"] for e in events if e["type"] == "response.content_part.added"]
    assert part["type"] == "text"
    (done,) = [e for e in events if e["type"] == "response.done"]
    (item,) = done["response"]["output"]
    assert item["content"] == [{"type": "text", "text": "Hi"}]
    assert done["response"]["status"] == "completed"


def test_an_audio_turn_in_beta_names() -> None:
    client = Client(beta=True)
    client.send({"type": "session.update", "session": {"voice": "sage"}})
    events = client.send(
        {"type": "response.create", "response": {"output_audio_format": "g711_ulaw"}}
    )
    generate = client.generate()
    assert generate.output_rate == 8000
    seen = len(client.driver.events)
    client.driver.speak_reply(generate, ["Hello there."])
    events += client.translate(client.driver.events[seen:])
    kinds = types(events)
    assert "response.audio.delta" in kinds and "response.audio.done" in kinds
    assert "response.audio_transcript.delta" in kinds
    assert "response.audio_transcript.done" in kinds
    assert not GA_ONLY & set(kinds)
    (done,) = [e for e in events if e["type"] == "response.done"]
    assert done["response"]["voice"] == "sage"
    assert done["response"]["output_audio_format"] == "g711_ulaw"
    (item,) = done["response"]["output"]
    assert item["content"][0]["type"] == "audio"
    assert item["content"][0]["transcript"] == "Hello there."


def test_beta_response_create_fields_and_their_errors() -> None:
    client = Client(beta=True)
    error = error_of(
        client.send(
            {
                "type": "response.create",
                "event_id": "r1",
                "response": {"max_response_output_tokens": 0},
            }
        )
    )
    assert error["param"] == "response.max_response_output_tokens"
    assert error["event_id"] == "r1"
    client.send(
        {
            "type": "response.create",
            "response": {"modalities": ["text"], "max_response_output_tokens": 5},
        }
    )
    generate = client.generate()
    assert generate.request.max_tokens == 5


def test_assistant_items_from_a_beta_client() -> None:
    client = Client(beta=True)
    (created,) = client.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": "Earlier answer."}],
            },
        }
    )
    assert created["type"] == "conversation.item.created"
    assert created["item"]["content"] == [{"type": "text", "text": "Earlier answer."}]
    (entry,) = client.driver.session.conversation.entries()
    assert msgspec.to_builtins(entry.to_wire())["content"][0]["type"] == "output_text"


def test_ga_connections_pass_events_through_unchanged() -> None:
    client = Client(beta=False)
    assert types(client.events) == ["session.created"]
    assert client.events == client.driver.events
    events = client.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi."}],
            },
        }
    )
    assert types(events) == ["conversation.item.added", "conversation.item.done"]
    # A beta name means nothing on a GA connection.
    error = error_of(client.send({"type": "session.update", "session": {"modalities": ["text"]}}))
    assert error["param"] == "session.modalities" and error["code"] == "unknown_parameter"


# ------------------------------------------------------------------ transcription_session.update


@pytest.mark.parametrize("beta", [False, True])
def test_the_older_transcription_session_update(beta: bool) -> None:
    client = Client(beta=beta, config=transcription_defaults())
    (updated,) = client.send(
        {
            "type": "transcription_session.update",
            "session": {
                "input_audio_format": "g711_alaw",
                "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "de"},
                "input_audio_noise_reduction": {"type": "near_field"},
                "turn_detection": {"silence_duration_ms": 700},
                "include": ["item.input_audio_transcription.logprobs"],
            },
        }
    )
    assert updated["type"] == "transcription_session.updated"
    session = updated["session"]
    assert session["object"] == "realtime.transcription_session"
    assert session["input_audio_format"] == "g711_alaw"
    assert session["input_audio_transcription"]["model"] == "gpt-4o-transcribe"
    assert session["input_audio_noise_reduction"]["type"] == "near_field"
    assert session["turn_detection"]["type"] == "server_vad"
    assert session["turn_detection"]["silence_duration_ms"] == 700
    assert session["include"] == ["item.input_audio_transcription.logprobs"]
    audio_input = client.driver.session.config.audio.input
    assert client.driver.session.input_rate == 8000
    assert audio_input.transcription is not None and audio_input.transcription.language == "de"
    (manual,) = client.send(
        {"type": "transcription_session.update", "session": {"turn_detection": None}}
    )
    assert manual["session"]["turn_detection"] is None
    assert client.driver.session.config.audio.input.turn_detection is None


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"input_audio_format": "opus"}, "session.input_audio_format"),
        ({"turn_detection": {"threshold": 5}}, "session.turn_detection.threshold"),
        ({"input_audio_transcription": {"modle": "x"}}, "session.input_audio_transcription.modle"),
        ({"instructions": "Be brief."}, "session.instructions"),
    ],
)
def test_the_alias_names_its_own_fields_in_errors(session: dict[str, Any], param: str) -> None:
    client = Client(beta=False, config=transcription_defaults())
    error = error_of(
        client.send({"type": "transcription_session.update", "session": session, "event_id": "a"})
    )
    assert error["param"] == param
    assert param in error["message"]
    assert error["event_id"] == "a"


def test_the_alias_on_a_realtime_session_is_refused() -> None:
    client = Client(beta=False)
    error = error_of(
        client.send({"type": "transcription_session.update", "session": {}, "event_id": "a"})
    )
    assert error["code"] == "invalid_parameter" and error["event_id"] == "a"
    assert error["message"] == (
        "Passing a transcription session update event to a realtime session is not allowed."
    )
    assert client.driver.session.config.type == "realtime"


def test_updates_are_answered_in_order_around_the_alias() -> None:
    # A GA update between two aliases keeps its GA answer and its own (absent) event_id.
    client = Client(beta=False, config=transcription_defaults())
    alias = {"type": "transcription_session.update", "session": {"turn_detection": None}}
    ga_update = {"type": "session.update", "session": {"include": None}}
    bad_ga = {"type": "session.update", "session": {"audio": {"input": {"format": 3}}}}
    answers = [
        *client.send(alias),
        *client.send(ga_update),
        *client.send(bad_ga),
        *client.send(alias),
    ]
    assert types(answers) == [
        "transcription_session.updated",
        "session.updated",
        "error",
        "transcription_session.updated",
    ]
    assert answers[1]["session"]["type"] == "transcription"
    assert answers[2]["error"]["event_id"] is None
    assert answers[2]["error"]["param"].startswith("session.audio.input.format")
    # Nothing is left waiting: later GA answers pass untouched.
    (later,) = client.send(ga_update)
    assert later["type"] == "session.updated" and "audio" in later["session"]


# ------------------------------------------------------------------ pieces


def test_flat_and_ga_sessions_round_trip() -> None:
    flat = {
        "modalities": ["audio", "text"],
        "instructions": "Hi.",
        "voice": "verse",
        "input_audio_format": "pcm16",
        "output_audio_format": "g711_ulaw",
        "input_audio_noise_reduction": {"type": "far_field"},
        "turn_detection": None,
        "max_response_output_tokens": 100,
    }
    config = parse_flat_session(flat)
    ga = msgspec.to_builtins(config)
    back = flat_session(ga)
    for key, value in flat.items():
        assert back[key] == value, key
    with pytest.raises(ProtocolError) as raised:
        parse_flat_session({"speed": 3})
    assert raised.value.param == "session.speed"
    assert ga_session_update({"turn_detection": {}}, transcription=True) == {
        "type": "transcription",
        "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
    }


def test_beta_error_leaves_other_parameters_alone() -> None:
    error = ProtocolError("Bad 'session.tools[0].name'.", "session.tools[0].name")
    assert beta_error(error) is error
    renamed = beta_error(
        ProtocolError("Bad 'response.audio.output.voice'.", "response.audio.output.voice")
    )
    assert renamed.param == "response.voice" and renamed.message == "Bad 'response.voice'."


class Recorded:
    """The part of a session ``DialectSession`` drives: texts in, and texts out the way the
    runner offers them (``send`` first, ``outgoing`` for what it refuses and after)."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.send: Callable[[str], bool] | None = None

    async def start(self) -> None:
        return None

    def catch_up(self) -> None:
        return None

    def receive_text(self, text: str) -> None:
        self.received.append(text)

    def receive_bytes(self, data: bytes) -> None:
        return None

    async def outgoing(self) -> AsyncIterator[str]:
        while (text := await self.queue.get()) is not None:
            yield text

    def send_with(
        self, send: Callable[[str], bool] | None, stalled: Callable[[str], None] | None = None
    ) -> None:
        self.send = send

    def emit(self, text: str) -> None:
        if self.queue.qsize() or self.send is None or not self.send(text):
            self.queue.put_nowait(text)

    async def close(self) -> None:
        self.queue.put_nowait(None)


async def test_a_refused_event_is_translated_once() -> None:
    inner = Recorded()
    session = DialectSession(inner, Dialect(beta=False))
    written: list[str] = []
    accepting = False

    def send(text: str) -> bool:
        if accepting:
            written.append(text)
        return accepting

    session.send_with(send)
    session.receive_text(
        json.dumps({"type": "transcription_session.update", "session": {}, "event_id": "t"})
    )
    (sent,) = inner.received
    assert json.loads(sent)["type"] == "session.update"
    # The answer is refused (the peer is slow), waits in the queue, and is translated once.
    answer = '{"type":"session.updated","event_id":"s1","session":{"type":"transcription"}}'
    inner.emit(answer)
    inner.emit('{"type":"session.updated","event_id":"s2","session":{}}')
    await inner.close()
    later = [json.loads(text) async for text in session.outgoing()]
    assert [e["type"] for e in later] == ["transcription_session.updated", "session.updated"]
    assert written == []


def test_what_waits_for_an_answer_is_bounded() -> None:
    # A session that has ended answers nothing; a client may still write to it.
    dialect = Dialect(beta=True)
    for _ in range(3 * MAX_WAITING):
        dialect.incoming('{"type": "session.update", "session": {}}')
        dialect.incoming('{"type": "session.update", "session": {"voice": 1, "x": 2}}')
    assert len(dialect._updates) == MAX_WAITING
    assert len(dialect._rejected) == MAX_WAITING

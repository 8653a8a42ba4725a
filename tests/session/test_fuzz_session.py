"""Property-based tests of the sans-I/O session core: hypothesis state machines that send
valid, invalid and mutated client events, audio, VAD answers, engine and playout results in
any order and move the wall time on, checking the protocol's invariants after every step.

The default number of examples keeps the suite fast; ``HARK_FUZZ_EXAMPLES`` (and
``HARK_FUZZ_STEPS``) make a longer run, e.g. ``HARK_FUZZ_EXAMPLES=2000 pytest
tests/session/test_fuzz_session.py``.
"""

from __future__ import annotations

import base64
import json
import os
import random
from collections import deque
from typing import Any, Literal

import numpy as np
import pydantic
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from hark.bench.fuzz import KnownIds, mutate, valid_event
from hark.engines.asr import TimedTranscript
from hark.engines.llm import Finished
from hark.protocol.errors import ProtocolError
from hark.protocol.server_events import ServerEvent, encode_event
from hark.session.actions import (
    AdoptSpeculation,
    AnalyzeSpeech,
    ClearAudio,
    Close,
    FinishAudio,
    Generate,
    PlayAudio,
    Recognise,
    ScoreTurn,
    Transcribe,
)
from hark.session.core import Session
from hark.session.ids import IdGenerator
from hark.session.results import (
    AudioGenerated,
    GenerationFailed,
    GenerationFinished,
    PlayoutCleared,
    PlayoutStarted,
    PlayoutStopped,
    Recognised,
    TextGenerated,
    ToolCallDelta,
    ToolCallFinished,
    ToolCallStarted,
    TranscriptionDelta,
    TranscriptionDone,
    TranscriptionFailed,
    TurnScored,
    TurnScoreFailed,
    VadScored,
)

from .conftest import ASR_RATE, VAD_CHUNK_MS, timed

EXAMPLES = int(os.environ.get("HARK_FUZZ_EXAMPLES", "100"))
STEPS = int(os.environ.get("HARK_FUZZ_STEPS", "80"))
CREATED_AT = 1000.0
SDK_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
# Server events the SDK's GA union does not have: the preview's, which hark still answers.
NOT_IN_SDK = {"transcription_session.updated"}
# Events about a response's playout, which go on after its response.done.
PLAYOUT = {"output_audio_buffer.started", "output_audio_buffer.stopped"}
PLAYOUT |= {"output_audio_buffer.cleared"}
UNKNOWN_RESPONSE = "resp_unknown"
TEXT_REPLIES = {"type": "realtime", "output_modalities": ["text"]}
REASONS: tuple[Literal["stop", "length", "tool_calls"], ...] = ("stop", "length", "tool_calls")
WORDS = st.sampled_from(["", "hello", "What is the capital of France?", " a", "\u00e9t\u00e9 ?"])

# ---------------------------------------------------------------- client events


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


AUDIO = st.one_of(
    st.binary(max_size=64).map(_b64),
    st.integers(0, 48_000).map(lambda n: _b64(bytes(n))),
    st.sampled_from(["", "!!!!", "AAA", "A===", "\u00e9\u00e9", "AAAA" * 1000 + "="]),
)
FORMAT = st.sampled_from(
    [
        {"type": "audio/pcm", "rate": 24000},
        {"type": "audio/pcmu"},
        {"type": "audio/pcma"},
        {"type": "audio/pcm", "rate": 16000},
        {"type": "audio/mp3"},
    ]
)
TURN_DETECTION = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"type": st.just("server_vad")},
        optional={
            "threshold": st.floats(-0.5, 1.5),
            "prefix_padding_ms": st.integers(-10, 1000),
            "silence_duration_ms": st.integers(0, 800),
            "create_response": st.booleans(),
            "interrupt_response": st.booleans(),
            "idle_timeout_ms": st.sampled_from([None, 500, 1000, 5000]),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("semantic_vad")},
        optional={
            "eagerness": st.sampled_from(["low", "medium", "high", "auto", "never"]),
            "create_response": st.booleans(),
            "interrupt_response": st.booleans(),
        },
    ),
)
TOOL = st.fixed_dictionaries(
    {"type": st.just("function"), "name": st.sampled_from(["lookup", "get_weather", "", "a b"])},
    optional={"description": st.text(max_size=20), "parameters": st.just({"type": "object"})},
)
SESSION = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["realtime", "realtime", "transcription", "other"]),
        "model": st.sampled_from(["gpt-realtime", "gpt-realtime-2.1", 7]),
        "instructions": st.text(max_size=40),
        "output_modalities": st.sampled_from([["audio"], ["text"], ["audio", "text"], []]),
        "tools": st.lists(TOOL, max_size=2),
        "tool_choice": st.sampled_from(
            ["auto", "none", "required", "sometimes", {"type": "function", "name": "lookup"}]
        ),
        "max_output_tokens": st.sampled_from(["inf", 1, 20, 0, 5000, "lots"]),
        "temperature": st.floats(-1, 3),
        "include": st.sampled_from([None, ["item.input_audio_transcription.logprobs"], ["x"]]),
        "audio": st.fixed_dictionaries(
            {},
            optional={
                "input": st.fixed_dictionaries(
                    {},
                    optional={
                        "format": FORMAT,
                        "turn_detection": TURN_DETECTION,
                        "transcription": st.sampled_from(
                            [None, {"model": "whisper-1"}, {"model": "whisper-1", "delay": "low"}]
                        ),
                    },
                ),
                "output": st.fixed_dictionaries(
                    {},
                    optional={
                        "format": FORMAT,
                        "voice": st.sampled_from(["alloy", "marin", {"id": "alloy"}, 3]),
                        "speed": st.floats(0, 2),
                    },
                ),
            },
        ),
        "frobnicate": st.just(1),
    },
)


class Ids:
    """The ids a machine knows of, for strategies that pick real ones or unknown ones."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.responses: list[str] = []
        self.calls: list[str] = []


def item_id(ids: Ids) -> st.SearchStrategy[str]:
    """A real item id (now or once in the conversation) or an unknown one."""
    return st.sampled_from([*ids.items, "item_unknown", ""])


def content(role: str) -> st.SearchStrategy[list[dict[str, Any]]]:
    """A message's content for ``role``: right types mostly, wrong ones too."""
    text = st.fixed_dictionaries(
        {"type": st.just("input_text" if role != "assistant" else "output_text"), "text": WORDS}
    )
    audio = st.fixed_dictionaries(
        {"type": st.just("input_audio")},
        optional={"audio": AUDIO, "transcript": st.one_of(st.none(), WORDS)},
    )
    wrong = st.sampled_from(
        [{"type": "output_audio"}, {"type": "input_image", "image_url": "data:,"}, {"type": "x"}]
    )
    return st.lists(st.one_of(text, audio, wrong), max_size=2)


def item(ids: Ids) -> st.SearchStrategy[dict[str, Any]]:
    """A conversation item of any type, sometimes with an id of its own."""
    message = st.sampled_from(["user", "assistant", "system"]).flatmap(
        lambda role: st.fixed_dictionaries(
            {"type": st.just("message"), "role": st.just(role), "content": content(role)}
        )
    )
    call = st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "name": st.just("lookup"),
            "call_id": st.sampled_from(["call_1", *ids.calls]),
            "arguments": st.sampled_from(["{}", "{", ""]),
        }
    )
    output = st.fixed_dictionaries(
        {
            "type": st.just("function_call_output"),
            "call_id": st.sampled_from(["call_1", *ids.calls]),
            "output": st.just("42"),
        }
    )
    reference = st.fixed_dictionaries({"type": st.just("item_reference"), "id": item_id(ids)})
    base = st.one_of(message, call, output, reference, st.just({"type": "mcp_call"}))
    with_id = st.tuples(base, st.one_of(st.none(), st.sampled_from(["item_mine", *ids.items])))
    return with_id.map(lambda pair: pair[0] if pair[1] is None else {**pair[0], "id": pair[1]})


def response_params(ids: Ids) -> st.SearchStrategy[dict[str, Any]]:
    """``response.create``'s ``response``: valid and invalid parameters."""
    return st.fixed_dictionaries(
        {},
        optional={
            "conversation": st.sampled_from(["auto", "none", "conv_x"]),
            "output_modalities": st.sampled_from([["audio"], ["text"], ["video"]]),
            "instructions": st.text(max_size=20),
            "input": st.lists(item(ids), max_size=2),
            "tools": st.lists(TOOL, max_size=2),
            "tool_choice": st.sampled_from(
                ["auto", "required", {"type": "function", "name": "lookup"}]
            ),
            "max_output_tokens": st.sampled_from(["inf", 1, 16, -1]),
            "metadata": st.sampled_from([{"k": "v"}, {"k": 1}]),
            "temperature": st.floats(0, 2),
            "audio": st.fixed_dictionaries(
                {"output": st.fixed_dictionaries({}, optional={"format": FORMAT})}
            ),
        },
    )


def client_event(ids: Ids) -> st.SearchStrategy[dict[str, Any]]:
    """Any client event, valid or not, naming real ids and unknown ones."""
    events = st.one_of(
        st.fixed_dictionaries({"type": st.just("session.update"), "session": SESSION}),
        st.fixed_dictionaries({"type": st.just("input_audio_buffer.append"), "audio": AUDIO}),
        st.just({"type": "input_audio_buffer.commit"}),
        st.just({"type": "input_audio_buffer.clear"}),
        st.fixed_dictionaries(
            {"type": st.just("conversation.item.create"), "item": item(ids)},
            optional={"previous_item_id": st.one_of(st.none(), st.just("root"), item_id(ids))},
        ),
        st.fixed_dictionaries(
            {"type": st.just("conversation.item.retrieve"), "item_id": item_id(ids)}
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("conversation.item.truncate"),
                "item_id": item_id(ids),
                "content_index": st.integers(-1, 2),
                "audio_end_ms": st.integers(-10, 3000),
            }
        ),
        st.fixed_dictionaries(
            {"type": st.just("conversation.item.delete"), "item_id": item_id(ids)}
        ),
        st.fixed_dictionaries(
            {"type": st.just("response.create")}, optional={"response": response_params(ids)}
        ),
        st.fixed_dictionaries(
            {"type": st.just("response.cancel")},
            optional={"response_id": st.sampled_from([*ids.responses, UNKNOWN_RESPONSE])},
        ),
        st.just({"type": "output_audio_buffer.clear"}),
        st.fixed_dictionaries(
            {"type": st.just("transcription_session.update"), "session": st.just({})}
        ),
    )
    return st.tuples(events, st.one_of(st.none(), st.text(max_size=8))).map(
        lambda pair: pair[0] if pair[1] is None else {**pair[0], "event_id": pair[1]}
    )


# ---------------------------------------------------------------- the machine


class SessionMachine(RuleBasedStateMachine):
    """A session, a driver that plays the engines and the player, and the invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.ids = Ids()
        # Work the core asked for and nobody answered yet.
        self.vad: deque[int] = deque()
        self.transcribe: list[str] = []
        self.recognise: list[Recognise] = []
        self.scores: list[str] = []
        self.generating: dict[str, int] = {}
        self.playing: dict[str, int] = {}
        # What the client was told.
        self.event_ids: set[str] = set()
        self.open: set[str] = set()
        self.done: set[str] = set()
        self.response_rates: dict[str, tuple[int, int]] = {}
        self.server_items: set[str] = set()
        self.live_items: set[str] = set()
        self.audio_ms: dict[str, float] = {}
        self.closed = False
        self.now = CREATED_AT

    @initialize(
        plays_audio=st.booleans(),
        limit_s=st.sampled_from([60.0, 3600.0]),
        text_replies=st.booleans(),
    )
    def start(self, plays_audio: bool, limit_s: float, text_replies: bool) -> None:
        """A session on a WebSocket (the client plays audio) or on WebRTC/SIP (the server
        does), with a short session limit or the usual hour, replying in audio or text."""
        self.plays_audio = plays_audio
        self.session = Session(
            model="gpt-realtime",
            ids=IdGenerator(seed=11),
            created_at=CREATED_AT,
            plays_audio=plays_audio,
            max_duration_s=limit_s,
            vad_chunk_ms=VAD_CHUNK_MS,
            asr_rate=ASR_RATE,
        )
        self.session.start()
        self.collect()
        if text_replies:
            self.send(json.dumps({"type": "session.update", "session": TEXT_REPLIES}))

    # ------------------------------------------------------------ plumbing and checks

    def send(self, data: str | bytes) -> None:
        """A client text frame."""
        self.session.receive(data, now=self.now)
        self.collect()

    def collect(self) -> None:
        """Take the core's outputs, check each, and note the work it asks for."""
        for out in self.session.drain():
            assert not self.closed, f"{out!r} after the session closed"
            if isinstance(out, ServerEvent):
                self.check_event(out)
            elif isinstance(out, AnalyzeSpeech):
                self.vad.extend([out.epoch] * len(out.chunks))
            elif isinstance(out, Transcribe):
                self.transcribe.append(out.request_id)
            elif isinstance(out, Recognise):
                self.recognise.append(out)
            elif isinstance(out, ScoreTurn):
                self.scores.append(out.key)
            elif isinstance(out, Generate):
                self.generating[out.response_id] = out.output_rate
            elif isinstance(out, AdoptSpeculation):
                self.generating[out.response_id] = 24000
            elif isinstance(out, PlayAudio):
                assert self.plays_audio
                self.playing[out.response_id] = (
                    self.playing.get(out.response_id, 0) + len(out.pcm) * 1000 // out.rate
                )
                self.audio_ms[out.item_id] = (
                    self.audio_ms.get(out.item_id, 0.0) + len(out.pcm) * 1000 / out.rate
                )
            elif isinstance(out, FinishAudio | ClearAudio):
                assert self.plays_audio
            elif isinstance(out, Close):
                # Only the session limit ends a session from inside: never an error.
                assert out.reason == "session_expired", out
                assert self.now >= self.session.expires_at
                self.closed = True

    def check_event(self, event: ServerEvent) -> None:
        """Check one server event against the SDK's type and what came before it."""
        text = encode_event(event)
        body = json.loads(text)
        kind = body["type"]
        if kind not in NOT_IN_SDK:
            SDK_EVENT.validate_json(text)
        assert body["event_id"] not in self.event_ids, f"event id reused: {body}"
        self.event_ids.add(body["event_id"])
        if kind == "response.created":
            response = body["response"]
            assert response["id"] not in self.open | self.done, f"response id reused: {body}"
            self.open.add(response["id"])
            self.ids.responses.append(response["id"])
            fmt = response["audio"]["output"]["format"]
            # Bytes per sample and samples per second of the response's audio deltas.
            self.response_rates[response["id"]] = (
                (2, 24000) if fmt["type"] == "audio/pcm" else (1, 8000)
            )
        elif kind == "response.done":
            response_id = body["response"]["id"]
            assert response_id in self.open, f"response.done without response.created: {body}"
            self.open.discard(response_id)
            self.done.add(response_id)
        elif "response_id" in body and kind not in PLAYOUT:
            assert body["response_id"] in self.open, f"{kind} outside its response: {body}"
        if kind == "response.output_item.added":
            item_id = body["item"]["id"]
            assert item_id not in self.server_items, f"item id reused: {body}"
            self.server_items.add(item_id)
            if body["item"].get("call_id"):
                self.ids.calls.append(body["item"]["call_id"])
        elif kind == "conversation.item.added":
            item_id = body["item"]["id"]
            assert item_id not in self.live_items, f"two items with one id: {body}"
            self.live_items.add(item_id)
            self.ids.items.append(item_id)
        elif kind == "conversation.item.deleted":
            self.live_items.discard(body["item_id"])
        elif kind == "response.output_audio.delta":
            size, rate = self.response_rates[body["response_id"]]
            samples = len(base64.b64decode(body["delta"])) // size
            self.audio_ms[body["item_id"]] = (
                self.audio_ms.get(body["item_id"], 0.0) + samples * 1000 / rate
            )
        elif kind == "conversation.item.truncated":
            sent = self.audio_ms.get(body["item_id"], 0.0)
            assert body["audio_end_ms"] <= sent + 1, f"truncated past {sent} ms: {body}"

    @invariant()
    def conversation_ids_unique(self) -> None:
        """No two items of the conversation share an id."""
        if hasattr(self, "session"):
            entries = [e.id for e in self.session.conversation.entries()]
            assert len(entries) == len(set(entries))

    def teardown(self) -> None:
        """The server ends the session: every response created is done by then."""
        if not hasattr(self, "session"):
            return
        if not self.closed:
            self.session.end(
                ProtocolError("The server is shutting down.", code="server_shutdown"),
                "server_shutdown",
                now=self.now,
            )
            for out in self.session.drain():
                if isinstance(out, ServerEvent):
                    self.check_event(out)
        assert not self.open, f"responses never done: {self.open}"

    # ------------------------------------------------------------ the client

    @rule(data=st.data())
    def client_sends(self, data: st.DataObject) -> None:
        """A client event, valid or not."""
        self.send(json.dumps(data.draw(client_event(self.ids))))

    @rule(data=st.data(), seed=st.integers(0, 2**32 - 1))
    def client_sends_a_mutation(self, data: st.DataObject, seed: int) -> None:
        """A mutated event: bit flips, truncations, wrong types, huge values, deep nesting."""
        rng = random.Random(seed)
        known = KnownIds()
        known.items.extend(self.ids.items[-8:])
        known.responses.extend(self.ids.responses[-8:])
        frame = mutate(rng, valid_event(rng, known))
        if isinstance(frame, bytes):
            self.session.receive_binary(frame, now=self.now)
            self.collect()
        else:
            self.send(frame)

    @rule(
        ms=st.integers(1, 1200),
        loud=st.booleans(),
        track=st.booleans(),
        dtmf=st.integers(0, 9),
    )
    def client_streams(self, ms: int, loud: bool, track: bool, dtmf: int) -> None:
        """Audio at the input rate, from a media track (WebRTC, SIP) or in appends; or, now
        and then, a keypad press (SIP)."""
        if dtmf == 0:
            self.session.receive_dtmf("#", now=self.now)
            self.collect()
            return
        rate = self.session.input_rate
        pcm = np.full(rate * ms // 1000, 8000 if loud else 0, np.int16)
        if track:
            self.session.append_audio(pcm, now=self.now)
            self.collect()
        else:
            # Appends carry the input format's bytes; G.711's are one byte a sample.
            size = 2 if rate == 24000 else 1
            audio = _b64(bytes(len(pcm) * size) if not loud else b"\x40" * (len(pcm) * size))
            self.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))

    @rule(
        text=st.booleans(),
        out_of_band=st.booleans(),
        said=st.one_of(st.none(), WORDS),
    )
    def client_asks_for_a_response(self, text: bool, out_of_band: bool, said: str | None) -> None:
        """A well-formed turn: perhaps a user message, then ``response.create``."""
        if said is not None:
            part = {"type": "input_text", "text": said}
            item = {"type": "message", "role": "user", "content": [part]}
            self.send(json.dumps({"type": "conversation.item.create", "item": item}))
        response: dict[str, Any] = {"output_modalities": ["text"]} if text else {}
        if out_of_band:
            response["conversation"] = "none"
        self.send(json.dumps({"type": "response.create", "response": response}))

    @precondition(lambda self: bool(self.audio_ms))
    @rule(data=st.data())
    def client_truncates_what_it_played(self, data: st.DataObject) -> None:
        """``conversation.item.truncate`` of reply audio, within what was sent or beyond."""
        item_id = data.draw(st.sampled_from(sorted(self.audio_ms)))
        end = data.draw(st.integers(0, int(self.audio_ms[item_id]) + 50))
        self.send(
            json.dumps(
                {
                    "type": "conversation.item.truncate",
                    "item_id": item_id,
                    "content_index": 0,
                    "audio_end_ms": end,
                }
            )
        )

    # ------------------------------------------------------------ the engines

    @precondition(lambda self: bool(self.vad))
    @rule(count=st.integers(1, 40), probability=st.sampled_from([0.0, 0.2, 0.6, 1.0]))
    def vad_answers(self, count: int, probability: float) -> None:
        """The VAD answers its oldest chunks, in order."""
        for _ in range(min(count, len(self.vad))):
            epoch = self.vad.popleft()
            self.session.handle(VadScored(probability, epoch), now=self.now)
            self.collect()

    @precondition(lambda self: bool(self.transcribe or self.recognise))
    @rule(data=st.data(), words=WORDS, outcome=st.sampled_from(["delta", "done", "failed"]))
    def asr_answers(self, data: st.DataObject, words: str, outcome: str) -> None:
        """Recognition answers one request (or a step nobody waits for any more)."""
        requests = [*self.transcribe, *(r.request_id for r in self.recognise)]
        request_id = data.draw(st.sampled_from(requests))
        step = next((r for r in self.recognise if r.request_id == request_id), None)
        if outcome == "failed":
            self.session.handle(TranscriptionFailed(request_id, "the engine failed"), now=self.now)
        elif step is not None:
            seconds = len(step.request.audio) / ASR_RATE
            heard: TimedTranscript = timed(words, max(seconds, 0.01))
            self.session.handle(Recognised(request_id, heard), now=self.now)
        elif outcome == "delta":
            self.session.handle(TranscriptionDelta(request_id, words), now=self.now)
        else:
            self.session.handle(TranscriptionDone(request_id, words, 1.0), now=self.now)
        if outcome != "delta":
            self.transcribe = [r for r in self.transcribe if r != request_id]
            self.recognise = [r for r in self.recognise if r.request_id != request_id]
        self.collect()

    @precondition(lambda self: bool(self.scores))
    @rule(data=st.data(), probability=st.floats(0, 1))
    def turn_models_answer(self, data: st.DataObject, probability: float) -> None:
        """The end-of-turn model scores a pause, or fails to."""
        key = self.scores.pop(data.draw(st.integers(0, len(self.scores) - 1)))
        if data.draw(st.booleans()):
            self.session.handle(TurnScored(key, probability), now=self.now)
        else:
            self.session.handle(TurnScoreFailed(key), now=self.now)
        self.collect()

    @rule(
        data=st.data(),
        outputs=st.lists(
            st.sampled_from(["text", "audio", "call", "delta", "call_done"]), min_size=1, max_size=6
        ),
        ending=st.sampled_from(["finished", None, "failed"]),
    )
    def llm_answers(self, data: st.DataObject, outputs: list[str], ending: str | None) -> None:
        """Engine output for a response, and perhaps its end: mostly a running response, but
        also one finished long ago or one never heard of."""
        running = bool(self.generating) and data.draw(st.integers(0, 3)) < 3
        late = [*sorted(self.done), UNKNOWN_RESPONSE]
        response_id = data.draw(st.sampled_from(list(self.generating) if running else late))
        rate = self.generating.get(response_id, 24000)
        now = self.now
        session = self.session
        for kind in outputs:
            if kind == "text":
                session.handle(TextGenerated(response_id, data.draw(WORDS)), now=now)
            elif kind == "audio":
                pcm = np.full(data.draw(st.integers(0, rate)), 1000, np.int16)
                session.handle(AudioGenerated(response_id, pcm, data.draw(WORDS)), now=now)
            elif kind == "call":
                call_id = f"call_{len(self.ids.calls)}"
                session.handle(ToolCallStarted(response_id, call_id, "lookup"), now=now)
            else:
                call_id = data.draw(st.sampled_from(["call_unknown", *self.ids.calls]))
                if kind == "delta":
                    session.handle(ToolCallDelta(response_id, call_id, '{"a"'), now=now)
                else:
                    session.handle(ToolCallFinished(response_id, call_id, '{"a": 1}'), now=now)
            self.collect()
        if ending == "finished":
            reason = data.draw(st.sampled_from(REASONS))
            session.handle(GenerationFinished(response_id, Finished(reason, 10, 5)), now=now)
        elif ending == "failed":
            session.handle(GenerationFailed(response_id, "the engine failed"), now=now)
        if ending is not None:
            self.generating.pop(response_id, None)
        self.collect()

    # ------------------------------------------------------------ the player (WebRTC, SIP)

    @precondition(lambda self: bool(self.playing))
    @rule(data=st.data(), outcome=st.sampled_from(["started", "stopped", "cleared"]))
    def player_reports(self, data: st.DataObject, outcome: str) -> None:
        """The player starts, finishes or drops a response's audio (never more than queued)."""
        response_id = data.draw(st.sampled_from(sorted(self.playing)))
        if outcome == "started":
            self.session.handle(PlayoutStarted(response_id), now=self.now)
        elif outcome == "stopped":
            self.session.handle(PlayoutStopped(response_id), now=self.now)
            del self.playing[response_id]
        else:
            played = data.draw(st.integers(0, self.playing.pop(response_id)))
            self.session.handle(PlayoutCleared(response_id, played), now=self.now)
        self.collect()

    # ------------------------------------------------------------ time

    @rule(seconds=st.sampled_from([0.0, 0.02, 0.3, 1.0, 5.0, 30.0]))
    def time_passes(self, seconds: float) -> None:
        """The wall time moves on; the driver's timer fires once its deadline has passed.
        With no time passing it fires early (a wall clock stepped back): nothing breaks."""
        self.now += seconds
        deadline = self.session.next_deadline()
        if seconds == 0 or (deadline is not None and deadline <= self.now):
            self.session.handle_timer(self.now)
            self.collect()


SessionMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSession = SessionMachine.TestCase


@pytest.mark.parametrize(
    "frame",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"type": "session.update", "session": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"type": "session.update", "session": {"instructions": ' + "[" * 100_000 + "}}",
        # A wrong value first, then malformed JSON: the typed decoder sees only the value.
        '{"type":""conversation.item.create", "item": {}}',
        '{"type": "session.update", "session": 1, }',
    ],
)
def test_unparsable_json_is_an_error(frame: str) -> None:
    """Malformed JSON, and JSON nested deeper than the decoder recurses, are ``error``
    events, not exceptions (found by the state machine above)."""
    session = Session(model="gpt-realtime", vad_chunk_ms=VAD_CHUNK_MS, asr_rate=ASR_RATE)
    session.start()
    session.drain()
    session.receive(frame, now=0.0)
    (error,) = session.drain()
    assert isinstance(error, ServerEvent)
    body = json.loads(encode_event(error))
    assert body["type"] == "error"
    assert body["error"]["code"] == "invalid_json"

"""Out-of-band responses (``conversation: "none"``) running side by side, and cancelling one
of several by ``response_id``: on the core with the sample clock, then through the runner."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hark.audio.formats import decode_audio
from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.fake import FakeLlm
from hark.engines.llm import Finished, GenerationRequest, LlmEvent, TextDelta
from hark.engines.registry import build_engines
from hark.protocol.session_config import PcmFormat
from hark.session.actions import CancelGeneration, Generate
from hark.session.results import AudioGenerated, GenerationFinished, TextGenerated

from .conftest import RATE, Driver, voiced


def manual(driver: Driver) -> None:
    """No turn detection, and one user message in the conversation."""
    driver.send(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
    )
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "id": "item_user",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            },
        }
    )


def out_of_band(driver: Driver, name: str, modality: str) -> Generate:
    """Create an out-of-band response; returns the engine work it asked for."""
    new = driver.send(
        {
            "type": "response.create",
            "response": {
                "conversation": "none",
                "output_modalities": [modality],
                "metadata": {"name": name},
            },
        }
    )
    created = new[0]
    assert created["type"] == "response.created"
    assert created["response"]["conversation_id"] is None
    (generate,) = driver.take(Generate)
    assert generate.response_id == created["response"]["id"]
    return generate


def conversation_snapshot(driver: Driver) -> list[Any]:
    return [e.to_wire() for e in driver.session.conversation.entries()]


def of_response(events: list[dict[str, Any]], response_id: str) -> list[dict[str, Any]]:
    """The events naming ``response_id``, directly or in their ``response``."""
    return [
        e
        for e in events
        if e.get("response_id") == response_id or e.get("response", {}).get("id") == response_id
    ]


def test_two_out_of_band_responses_interleave_to_completion(driver: Driver) -> None:
    manual(driver)
    before = conversation_snapshot(driver)
    start = len(driver.events)
    text = out_of_band(driver, "text", "text")
    audio = out_of_band(driver, "audio", "audio")
    assert text.response_id != audio.response_id
    assert not text.audio and audio.audio

    # Both in flight at once, their engine results arriving alternately.
    driver.session.handle(TextGenerated(text.response_id, "one"), now=driver.now)
    driver.session.handle(AudioGenerated(audio.response_id, voiced(200), "uno"), now=driver.now)
    driver.session.handle(TextGenerated(text.response_id, " two"), now=driver.now)
    driver.session.handle(AudioGenerated(audio.response_id, voiced(300), " dos"), now=driver.now)
    driver.pump()
    # Neither finished yet: no response.done so far.
    assert "response.done" not in driver.types(driver.events[start:])
    driver.session.handle(
        GenerationFinished(audio.response_id, Finished("stop", 5, 2)), now=driver.now
    )
    driver.session.handle(TextGenerated(text.response_id, " three"), now=driver.now)
    driver.session.handle(
        GenerationFinished(text.response_id, Finished("stop", 5, 3)), now=driver.now
    )
    driver.pump()
    events = driver.events[start:]

    text_events = of_response(events, text.response_id)
    audio_events = of_response(events, audio.response_id)
    # Every response event belongs to exactly one of the two.
    with_response = [e for e in events if "response_id" in e or "response" in e]
    assert len(with_response) == len(text_events) + len(audio_events)

    text_deltas = [e for e in text_events if e["type"] == "response.output_text.delta"]
    assert [e["delta"] for e in text_deltas] == ["one", " two", " three"]
    assert not [e for e in text_events if e["type"].startswith("response.output_audio")]
    transcript_deltas = [
        e for e in audio_events if e["type"] == "response.output_audio_transcript.delta"
    ]
    assert [e["delta"] for e in transcript_deltas] == ["uno", " dos"]
    audio_deltas = [e for e in audio_events if e["type"] == "response.output_audio.delta"]
    pcm = b"".join(base64.b64decode(e["delta"]) for e in audio_deltas)
    assert len(decode_audio(PcmFormat(), pcm)) == RATE * 500 // 1000
    assert not [e for e in audio_events if e["type"] == "response.output_text.delta"]

    # Each response's deltas name its own item, and the two items differ.
    (text_item,) = [e["item"] for e in text_events if e["type"] == "response.output_item.added"]
    (audio_item,) = [e["item"] for e in audio_events if e["type"] == "response.output_item.added"]
    assert text_item["id"] != audio_item["id"]
    assert {e["item_id"] for e in text_deltas} == {text_item["id"]}
    assert {e["item_id"] for e in audio_deltas + transcript_deltas} == {audio_item["id"]}

    dones = {e["response"]["id"]: e["response"] for e in events if e["type"] == "response.done"}
    assert set(dones) == {text.response_id, audio.response_id}
    assert dones[text.response_id]["status"] == "completed"
    assert dones[text.response_id]["metadata"] == {"name": "text"}
    assert dones[text.response_id]["output"][0]["content"][0]["text"] == "one two three"
    assert dones[audio.response_id]["status"] == "completed"
    assert dones[audio.response_id]["metadata"] == {"name": "audio"}
    assert dones[audio.response_id]["output"][0]["content"][0]["transcript"] == "uno dos"

    # The conversation is as it was: nothing was added, nothing changed.
    assert not [e for e in events if e["type"].startswith("conversation.")]
    assert conversation_snapshot(driver) == before
    # Neither took the conversation's slot: an in-band response can start.
    assert driver.send({"type": "response.create"})[0]["type"] == "response.created"


def test_cancel_by_response_id_cancels_only_the_named_response(driver: Driver) -> None:
    manual(driver)
    before = conversation_snapshot(driver)
    other = out_of_band(driver, "other", "text")
    named = out_of_band(driver, "named", "text")
    driver.session.handle(TextGenerated(other.response_id, "b"), now=driver.now)
    driver.session.handle(TextGenerated(named.response_id, "a"), now=driver.now)
    driver.pump()
    driver.actions.clear()

    new = driver.send(
        {"type": "response.cancel", "event_id": "evt_cancel", "response_id": named.response_id}
    )
    (done,) = [e for e in new if e["type"] == "response.done"]
    assert done["response"]["id"] == named.response_id
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert all(e.get("response_id", named.response_id) == named.response_id for e in new)
    assert [a.response_id for a in driver.take(CancelGeneration)] == [named.response_id]

    # Late results of the cancelled response are dropped; the other one goes on.
    driver.session.handle(TextGenerated(named.response_id, " late"), now=driver.now)
    driver.session.handle(TextGenerated(other.response_id, " c"), now=driver.now)
    driver.session.handle(GenerationFinished(named.response_id, Finished("stop")), now=driver.now)
    driver.session.handle(GenerationFinished(other.response_id, Finished("stop")), now=driver.now)
    after = driver.pump()
    assert of_response(after, named.response_id) == []
    (other_done,) = [e for e in after if e["type"] == "response.done"]
    assert other_done["response"]["id"] == other.response_id
    assert other_done["response"]["status"] == "completed"
    assert other_done["response"]["output"][0]["content"][0]["text"] == "b c"
    assert conversation_snapshot(driver) == before

    # A response that is over cannot be cancelled again.
    again = driver.send(
        {"type": "response.cancel", "event_id": "evt_again", "response_id": named.response_id}
    )
    assert again[0]["type"] == "error"
    assert again[0]["error"]["code"] == "response_cancel_not_active"
    assert again[0]["error"]["event_id"] == "evt_again"


def test_cancel_by_response_id_leaves_the_in_band_response_running(driver: Driver) -> None:
    manual(driver)
    in_band_id = driver.send({"type": "response.create"})[0]["response"]["id"]
    (in_band,) = driver.take(Generate)
    side = out_of_band(driver, "side", "text")
    new = driver.send({"type": "response.cancel", "response_id": side.response_id})
    assert [e["response"]["id"] for e in new if e["type"] == "response.done"] == [side.response_id]
    assert [a.response_id for a in driver.take(CancelGeneration)] == [side.response_id]
    driver.speak_reply(in_band, ["Hello."])
    done = driver.events[-1]["response"]
    assert done["id"] == in_band_id == in_band.response_id
    assert done["status"] == "completed"


# ---------------------------------------------------------------- through the runner


class GatedLlm(FakeLlm):
    """FakeLlm whose replies say their instructions, one word at a time; a reply waits at
    its second word until the test opens its instructions' gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, asyncio.Event] = {}
        self.cancelled: list[str] = []
        self.cancelled_one = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        """Yield ``<instructions> says hello``, pausing after the first word."""
        name = request.messages[0].content
        gate = self.gates.setdefault(name, asyncio.Event())
        try:
            yield TextDelta(name)
            await gate.wait()
            yield TextDelta(" says")
            yield TextDelta(" hello")
        except asyncio.CancelledError:
            self.cancelled.append(name)
            self.cancelled_one.set()
            raise
        yield Finished("stop", prompt_tokens=1, completion_tokens=3)


def create(name: str) -> str:
    return json.dumps(
        {
            "type": "response.create",
            "response": {
                "conversation": "none",
                "output_modalities": ["text"],
                "instructions": name,
            },
        }
    )


async def events_until(
    runner: SessionRunner, events: list[dict[str, Any]], done: int
) -> list[dict[str, Any]]:
    """Read the runner's events into ``events`` until ``done`` responses are done."""
    async with asyncio.timeout(30):
        async for text in runner.outgoing():
            events.append(json.loads(text))
            if sum(e["type"] == "response.done" for e in events) == done:
                return events
    raise AssertionError("the session ended")


@pytest.fixture
async def gated() -> AsyncIterator[tuple[SessionRunner, GatedLlm]]:
    engines = build_engines(Settings(engines="fake"))
    llm = engines.llm = GatedLlm()
    runner = SessionRunner(engines, model="m")
    await runner.start()
    runner.receive_text(
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
        )
    )
    yield runner, llm
    await runner.close()
    await engines.aclose()


def text_of(events: list[dict[str, Any]], response_id: str) -> str:
    return "".join(
        e["delta"]
        for e in events
        if e["type"] == "response.output_text.delta" and e["response_id"] == response_id
    )


async def both_in_flight(runner: SessionRunner) -> list[dict[str, Any]]:
    """Start out-of-band responses "alpha" and "beta"; the events until both have said their
    first word, so that both are in flight at once."""
    runner.receive_text(create("alpha"))
    runner.receive_text(create("beta"))
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        async for text in runner.outgoing():
            events.append(json.loads(text))
            if sum(e["type"] == "response.output_text.delta" for e in events) == 2:
                break
    return events


async def test_runner_interleaves_two_out_of_band_responses(
    gated: tuple[SessionRunner, GatedLlm],
) -> None:
    runner, llm = gated
    events = await both_in_flight(runner)
    ids = {e["response"]["id"]: e for e in events if e["type"] == "response.created"}
    assert len(ids) == 2
    llm.gates["beta"].set()
    llm.gates["alpha"].set()
    await events_until(runner, events, done=2)
    names = {}
    for done in (e["response"] for e in events if e["type"] == "response.done"):
        assert done["status"] == "completed"
        names[done["output"][0]["content"][0]["text"].split()[0]] = done["id"]
    assert set(names) == {"alpha", "beta"}
    for name, response_id in names.items():
        assert text_of(events, response_id) == f"{name} says hello"
    assert not [e for e in events if e["type"].startswith("conversation.")]
    assert len(runner.session.conversation) == 0
    assert llm.cancelled == []


async def test_runner_cancels_only_the_named_response(
    gated: tuple[SessionRunner, GatedLlm],
) -> None:
    runner, llm = gated
    events = await both_in_flight(runner)
    first_words = {
        e["delta"]: e["response_id"] for e in events if e["type"] == "response.output_text.delta"
    }
    alpha, beta = first_words["alpha"], first_words["beta"]
    # The one created second: "the first response" is not the named one.
    runner.receive_text(json.dumps({"type": "response.cancel", "response_id": beta}))
    await events_until(runner, events, done=1)
    (cancelled,) = [e["response"] for e in events if e["type"] == "response.done"]
    assert cancelled["id"] == beta
    assert cancelled["status"] == "cancelled"
    # The cancelled reply's generation was stopped, the other one was not.
    await asyncio.wait_for(llm.cancelled_one.wait(), timeout=10)
    assert llm.cancelled == ["beta"]
    llm.gates["alpha"].set()
    llm.gates["beta"].set()
    await events_until(runner, events, done=2)
    completed = events[-1]["response"]
    assert completed["id"] == alpha
    assert completed["status"] == "completed"
    assert text_of(events, alpha) == "alpha says hello"
    assert text_of(events, beta) == "beta"
    assert llm.cancelled == ["beta"]

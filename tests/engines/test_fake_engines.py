"""The fake engines follow the engine interfaces and behave as documented."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import numpy as np
import pytest

from hark.engines.asr import AsrEngine, AudioToTranscribe, RecognitionRequest
from hark.engines.fake import FakeAsr, FakeLlm, FakeTts
from hark.engines.llm import (
    ChatMessage,
    Finished,
    FunctionTool,
    GenerationRequest,
    LlmEngine,
    LlmEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoice,
)
from hark.engines.tts import TtsEngine
from tests.helpers.streams import collect

T = TypeVar("T")

QUESTION = (
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "What is the capital of France?"),
)

WEATHER = FunctionTool(
    name="get_weather",
    description="Current weather",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
            "detailed": {"type": "boolean"},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "tags": {"type": "array"}},
                "required": ["lat", "tags"],
            },
            "note": {"type": ["null", "string"]},
            "optional": {"type": "string"},
        },
        "required": ["city", "unit", "days", "detailed", "where", "note"],
    },
)
HANG_UP = FunctionTool(name="hang_up")


async def test_fakes_satisfy_the_engine_interfaces() -> None:
    asr: AsrEngine = FakeAsr()
    llm: LlmEngine = FakeLlm()
    tts: TtsEngine = FakeTts()
    for engine in (asr, llm, tts):
        await engine.warmup()
    assert asr.sample_rate == 16000
    assert tts.sample_rate == 24000


async def test_fake_asr_hears_its_transcript_in_any_audio() -> None:
    asr = FakeAsr("Hello there.")
    speech = np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)
    assert "".join(await collect(asr.transcribe(AudioToTranscribe(speech)))) == "Hello there."
    silence = np.zeros(0, dtype=np.float32)
    assert "".join(
        await collect(asr.transcribe(AudioToTranscribe(silence, language="fr", prompt="x")))
    ) == ("Hello there.")
    assert (
        "".join(await collect(FakeAsr().transcribe(AudioToTranscribe(speech))))
        == "What is the capital of France?"
    )


async def test_fake_asr_recognises_its_transcript_spread_over_the_window() -> None:
    window = np.zeros(32000, dtype=np.float32)
    timed = await FakeAsr("Hello there. Bye.").recognise(RecognitionRequest(window, prompt="x"))
    assert [(w.word, w.start, w.end, w.probability) for w in timed.words] == [
        ("Hello", 0.0, 2 / 3, 1.0),
        ("there.", 2 / 3, 4 / 3, 1.0),
        ("Bye.", 4 / 3, 2.0, 1.0),
    ]
    assert [s.text for s in timed.segments] == ["Hello there.", "Bye."]


async def test_fake_llm_streams_the_reply_word_by_word() -> None:
    events = await collect(FakeLlm().generate(GenerationRequest(messages=QUESTION)))
    deltas = [event.text for event in events if isinstance(event, TextDelta)]
    assert deltas == ["The", " capital", " of", " France", " is", " Paris."]
    assert events[-1] == Finished("stop", prompt_tokens=8, completion_tokens=6)
    assert len(events) == 7


async def test_fake_llm_stops_at_max_tokens() -> None:
    request = GenerationRequest(messages=QUESTION, max_tokens=3)
    events = await collect(FakeLlm("one two three four").generate(request))
    assert events == [
        TextDelta("one"),
        TextDelta(" two"),
        TextDelta(" three"),
        Finished("length", prompt_tokens=8, completion_tokens=3),
    ]
    exact = GenerationRequest(messages=QUESTION, max_tokens=4)
    events = await collect(FakeLlm("one two three four").generate(exact))
    assert events[-1] == Finished("stop", prompt_tokens=8, completion_tokens=4)


async def test_fake_llm_answers_in_text_unless_a_tool_is_forced() -> None:
    for mode in ("auto", "none"):
        request = GenerationRequest(
            messages=QUESTION,
            tools=(WEATHER,),
            tool_choice=ToolChoice(mode),
        )
        events = await collect(FakeLlm().generate(request))
        assert all(isinstance(event, TextDelta) for event in events[:-1])
        assert isinstance(events[-1], Finished) and events[-1].reason == "stop"


def check_tool_call(events: list[LlmEvent], name: str) -> dict[str, Any]:
    started, *deltas, finished, end = events
    assert isinstance(started, ToolCallStarted) and started.name == name
    assert started.call_id.startswith("call_")
    assert deltas and all(isinstance(delta, ToolCallArgumentsDelta) for delta in deltas)
    assert all(delta.call_id == started.call_id for delta in deltas)  # type: ignore[union-attr]
    assert isinstance(finished, ToolCallFinished) and finished.call_id == started.call_id
    assert "".join(delta.delta for delta in deltas) == finished.arguments  # type: ignore[union-attr]
    assert isinstance(end, Finished) and end.reason == "tool_calls"
    assert end.completion_tokens == len(deltas) and end.prompt_tokens == 8
    arguments: dict[str, Any] = json.loads(finished.arguments)
    return arguments


async def test_fake_llm_calls_the_named_function_with_schema_shaped_arguments() -> None:
    request = GenerationRequest(
        messages=QUESTION,
        tools=(HANG_UP, WEATHER),
        tool_choice=ToolChoice("function", "get_weather"),
    )
    arguments = check_tool_call(await collect(FakeLlm().generate(request)), "get_weather")
    assert arguments == {
        "city": "example",
        "unit": "celsius",
        "days": 0,
        "detailed": False,
        "where": {"lat": 0.0, "tags": []},
        "note": "example",
    }


async def test_fake_llm_required_calls_the_first_tool() -> None:
    request = GenerationRequest(
        messages=QUESTION, tools=(HANG_UP, WEATHER), tool_choice=ToolChoice("required")
    )
    arguments = check_tool_call(await collect(FakeLlm().generate(request)), "hang_up")
    assert arguments == {}


async def test_fake_llm_call_ids_differ_between_calls() -> None:
    request = GenerationRequest(
        messages=QUESTION, tools=(HANG_UP,), tool_choice=ToolChoice("required")
    )
    first = (await collect(FakeLlm().generate(request)))[0]
    second = (await collect(FakeLlm().generate(request)))[0]
    assert isinstance(first, ToolCallStarted) and isinstance(second, ToolCallStarted)
    assert first.call_id != second.call_id


async def test_fake_llm_rejects_a_forced_tool_it_does_not_have() -> None:
    missing = GenerationRequest(
        messages=QUESTION, tools=(WEATHER,), tool_choice=ToolChoice("function", "nope")
    )
    with pytest.raises(ValueError, match="nope"):
        await collect(FakeLlm().generate(missing))
    no_tools = GenerationRequest(messages=QUESTION, tool_choice=ToolChoice("required"))
    with pytest.raises(ValueError):
        await collect(FakeLlm().generate(no_tools))


async def test_fake_llm_can_be_cancelled_midway() -> None:
    received: list[LlmEvent] = []

    async def consume() -> None:
        async for event in FakeLlm(" ".join(["word"] * 10_000)).generate(
            GenerationRequest(messages=QUESTION)
        ):
            received.append(event)

    task = asyncio.create_task(consume())
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 0 < len(received) < 100


async def test_fake_tts_tone_lasts_as_long_as_the_words() -> None:
    tts = FakeTts()
    chunks = await collect(tts.synthesize("The capital of France is Paris.", voice="alloy"))
    audio = np.concatenate(chunks)
    assert audio.dtype == np.int16
    assert audio.size == round(6 * 0.4 * 24000)
    assert all(chunk.size == 2400 for chunk in chunks)
    spectrum = np.abs(np.fft.rfft(audio.astype(np.float64)))
    assert np.fft.rfftfreq(audio.size, 1 / 24000)[np.argmax(spectrum)] == pytest.approx(440, abs=1)
    assert np.abs(audio).max() == pytest.approx(0.2 * 32767, rel=0.01)
    # Continuous phase: no jump bigger than one sample step of the sine anywhere.
    max_step = 0.2 * 32767 * 2 * np.pi * 440 / 24000
    assert np.abs(np.diff(audio.astype(np.float64))).max() <= max_step + 1


async def test_fake_tts_speed_and_rate() -> None:
    chunks = await collect(FakeTts(16000).synthesize("one two three four", speed=1.5))
    assert sum(chunk.size for chunk in chunks) == round(4 * 0.4 / 1.5 * 16000) == 17067
    assert [chunk.size for chunk in chunks] == [1600] * 10 + [1067]
    slow = await collect(FakeTts(16000).synthesize("one two three four", speed=0.5))
    assert sum(chunk.size for chunk in slow) == 4 * 0.4 / 0.5 * 16000
    with pytest.raises(ValueError):
        await collect(FakeTts().synthesize("hi", speed=0))


async def test_fake_tts_says_nothing_for_empty_text() -> None:
    assert await collect(FakeTts().synthesize("")) == []
    assert await collect(FakeTts().synthesize("  \n ")) == []

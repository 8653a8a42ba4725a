"""The embedded llama.cpp LLM, on the real SmolLM2-135M-Instruct model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import llama_cpp
import pytest

from hark.engines.llm import (
    ChatMessage,
    Finished,
    FunctionTool,
    GenerationRequest,
    LlmEvent,
    TextDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoice,
)
from hark.engines.llm.chat_template import render_chatml
from hark.engines.llm.llama_cpp import LlamaCppLlm, _parse_tool_calls, default_model_path
from hark.engines.llm.tool_grammar import arguments_gbnf, schema_to_gbnf, tool_call_gbnf
from tests.helpers.llm import text_of
from tests.helpers.streams import collect

SHORT = "You are a helpful assistant. Answer in one short sentence."

WEATHER = FunctionTool(
    name="get_weather",
    description="Get the current weather in a city.",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
)
TIME = FunctionTool(
    name="get_time",
    description="Get the current local time in a timezone.",
    parameters={
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "IANA timezone"}},
        "required": ["timezone"],
    },
)
ORDER = {
    "type": "object",
    "$defs": {
        "item": {
            "type": "object",
            "properties": {
                "sku": {"type": "string", "maxLength": 12},
                "quantity": {"type": "integer"},
            },
            "required": ["sku", "quantity"],
        }
    },
    "properties": {
        "customer": {"type": "string", "minLength": 1},
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
        "express": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "priority": {"enum": [1, 2, 3]},
        "price": {"type": "number"},
    },
    "required": ["customer", "items"],
}


def check(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> None:
    """A strict validator for the subset of JSON schema these tests use (no jsonschema here)."""
    root = root or schema
    if "$ref" in schema:
        check(value, root["$defs"][schema["$ref"].rsplit("/", 1)[1]], root)
        return
    if "enum" in schema:
        assert value in schema["enum"], (value, schema["enum"])
        return
    kinds = schema.get("type")
    if isinstance(kinds, list):
        errors = []
        for kind in kinds:
            try:
                check(value, {**schema, "type": kind}, root)
                return
            except AssertionError as exc:
                errors.append(exc)
        raise AssertionError(errors)
    python_types: dict[str, Any] = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "null": type(None),
    }
    assert isinstance(kinds, str) and isinstance(value, python_types[kinds]), (value, kinds)
    if kinds in ("integer", "number"):
        assert not isinstance(value, bool)
    if kinds == "object":
        properties = schema.get("properties", {})
        assert set(value) <= set(properties), (value, properties)
        assert set(schema.get("required", ())) <= set(value), value
        for key, sub in value.items():
            check(sub, properties[key], root)
    if kinds == "array":
        assert schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value))
        for item in value:
            check(item, schema["items"], root)
    if kinds == "string":
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))


def finished(events: list[LlmEvent]) -> Finished:
    assert isinstance(events[-1], Finished), events[-1]
    assert sum(isinstance(e, Finished) for e in events) == 1
    return events[-1]


def single_call(events: list[LlmEvent]) -> tuple[str, Any]:
    """The one tool call in ``events``, checked for shape; returns (name, parsed arguments)."""
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    done = [e for e in events if isinstance(e, ToolCallFinished)]
    assert len(started) == 1 and len(done) == 1, events
    call_id = started[0].call_id
    assert call_id.startswith("call_") and done[0].call_id == call_id
    deltas = [e for e in events if isinstance(e, ToolCallArgumentsDelta)]
    assert deltas and all(d.call_id == call_id for d in deltas)
    assert "".join(d.delta for d in deltas) == done[0].arguments
    assert not any(isinstance(e, TextDelta) for e in events)
    assert finished(events).reason == "tool_calls"
    return started[0].name, json.loads(done[0].arguments)


@pytest.fixture(scope="module")
def llm() -> Iterator[LlamaCppLlm]:
    # One model for the module; each test's loop is its own, which the engine allows: it
    # posts results to whichever loop is running the generation.
    engine = LlamaCppLlm()
    yield engine
    asyncio.run(engine.aclose())


def ask(question: str, **kwargs: Any) -> GenerationRequest:
    messages = (ChatMessage("system", SHORT), ChatMessage("user", question))
    return GenerationRequest(messages=messages, **kwargs)


def test_model_is_chatml() -> None:
    vocab = llama_cpp.Llama(model_path=default_model_path(), vocab_only=True, verbose=False)
    template = vocab.metadata["tokenizer.chat_template"]
    assert "<|im_start|>" in template and "<|im_end|>" in template


@pytest.mark.slow
async def test_answers_a_question(llm: LlamaCppLlm) -> None:
    await llm.warmup()
    events = await collect(llm.generate(ask("What is the capital of France?")))
    assert "Paris" in text_of(events)
    end = finished(events)
    assert end.reason == "stop"
    assert end.prompt_tokens > 10 and 0 < end.completion_tokens < 200


@pytest.mark.slow
async def test_max_tokens_ends_with_length(llm: LlamaCppLlm) -> None:
    question = "Tell me about the history of Rome."
    events = await collect(llm.generate(ask(question, max_tokens=3, temperature=0.0)))
    end = finished(events)
    assert end.reason == "length" and end.completion_tokens == 3
    # The cap cuts the same greedy reply short; it does not make another one.
    longer = await collect(llm.generate(ask(question, max_tokens=12, temperature=0.0)))
    assert finished(longer).reason == "length"
    assert len(text_of(events)) >= 3
    assert text_of(longer).startswith(text_of(events))
    assert len(text_of(longer)) > len(text_of(events))


@pytest.mark.slow
async def test_default_cap_ends_the_reply_at_a_sentence(
    llm: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client set no limit: the engine's own cap ends the reply at a sentence, complete.
    monkeypatch.setattr(llm, "max_tokens_default", 20)
    request = ask("Tell me a long story about a dragon.", temperature=0.0)
    events = await collect(llm.generate(request))
    end = finished(events)
    assert end.reason == "stop" and end.completion_tokens > 20
    assert text_of(events).rstrip().endswith((".", "!", "?", '."', '!"', '?"'))
    # The same reply given room: the capped one is its beginning, cut at a sentence end.
    monkeypatch.setattr(llm, "max_tokens_default", 400)
    whole = text_of(await collect(llm.generate(request)))
    assert whole.startswith(text_of(events)) and len(whole) > len(text_of(events))


@pytest.mark.slow
async def test_forced_call_fits_the_schema(llm: LlamaCppLlm) -> None:
    request = ask(
        "What's the weather like in Paris?",
        tools=(WEATHER, TIME),
        tool_choice=ToolChoice("function", "get_weather"),
        temperature=0.0,
    )
    name, arguments = single_call(await collect(llm.generate(request)))
    assert name == "get_weather"
    check(arguments, WEATHER.parameters)
    # The grammar fixes the shape; the city comes from the model reading the question.
    assert arguments["city"] == "Paris"


def order_call() -> GenerationRequest:
    """A request forcing a call whose arguments nest objects in arrays (sampled, not greedy)."""
    return ask(
        "Order two apples (sku A1) for Alice, express.",
        tools=(FunctionTool("place_order", "Place an order for a customer.", ORDER),),
        tool_choice=ToolChoice("function", "place_order"),
        temperature=0.8,
    )


@pytest.mark.slow
async def test_forced_call_with_a_nested_schema(llm: LlamaCppLlm) -> None:
    request = order_call()
    name, arguments = single_call(await collect(llm.generate(request)))
    assert name == "place_order"
    check(arguments, ORDER)


@pytest.mark.slow
async def test_required_picks_one_of_the_tools(llm: LlamaCppLlm) -> None:
    request = ask(
        "What time is it in Tokyo right now?",
        tools=(WEATHER, TIME),
        tool_choice=ToolChoice("required"),
        temperature=0.0,
    )
    name, arguments = single_call(await collect(llm.generate(request)))
    assert name == "get_time"
    check(arguments, TIME.parameters)


@pytest.mark.slow
async def test_unknown_forced_function_is_an_error(llm: LlamaCppLlm) -> None:
    request = ask("Hi", tools=(WEATHER,), tool_choice=ToolChoice("function", "nope"))
    with pytest.raises(ValueError, match="nope"):
        await collect(llm.generate(request))
    assert "Paris" in text_of(await collect(llm.generate(ask("What is the capital of France?"))))


def conversation_with_a_tool_call() -> tuple[ChatMessage, ...]:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    return (
        ChatMessage("system", SHORT),
        ChatMessage("user", "What's the weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", '{"temperature_c": 18, "sky": "sunny"}', tool_call_id="call_1"),
    )


def test_tool_call_and_output_render_into_the_prompt() -> None:
    prompt = render_chatml(conversation_with_a_tool_call(), (WEATHER,))
    assert prompt.startswith("<|im_start|>system\n" + SHORT)
    assert '"name": "get_weather"' in prompt.split("<|im_end|>")[0]
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n"
        '{"temperature_c": 18, "sky": "sunny"}\n</tool_response><|im_end|>\n'
    ) in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert "<tools>" not in render_chatml(conversation_with_a_tool_call())


@pytest.mark.slow
async def test_answers_after_a_tool_output(llm: LlamaCppLlm) -> None:
    request = GenerationRequest(
        messages=conversation_with_a_tool_call(), tools=(WEATHER,), temperature=0.0
    )
    events = await collect(llm.generate(request))
    # The tool's answer is used, not asked for again.
    assert finished(events).reason == "stop"
    assert not any(isinstance(e, ToolCallStarted | ToolCallFinished) for e in events)
    assert "sunny" in text_of(events).lower()
    # Without the tool on offer, the same conversation gets a spoken answer from its output.
    plain = GenerationRequest(messages=conversation_with_a_tool_call(), temperature=0.0)
    events = await collect(llm.generate(plain))
    assert finished(events).reason == "stop"
    assert "Paris" in text_of(events) and "sunny" in text_of(events).lower()


@pytest.mark.slow
async def test_cancelling_stops_and_frees_the_engine(llm: LlamaCppLlm) -> None:
    long = ask("Write a long story about a dragon.", max_tokens=400, temperature=0.8)
    received: list[LlmEvent] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for event in llm.generate(long):
            received.append(event)
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not any(isinstance(e, Finished) for e in received)

    stream = llm.generate(long)
    assert isinstance(await anext(stream), TextDelta)
    await stream.aclose()

    events = await collect(llm.generate(ask("What is the capital of France?")))
    assert "Paris" in text_of(events)


@pytest.mark.slow
async def test_next_turn_reuses_the_cached_prefix(llm: LlamaCppLlm) -> None:
    first_turn = ask("What is the capital of France?")
    events = await collect(llm.generate(first_turn))
    reply = text_of(events)
    second_turn = GenerationRequest(
        messages=(
            *first_turn.messages,
            ChatMessage("assistant", reply),
            ChatMessage("user", "And of Italy?"),
        )
    )
    end = finished(await collect(llm.generate(second_turn)))
    # Everything up to the end of the first reply was already in the KV cache.
    assert finished(events).prompt_tokens + finished(events).completion_tokens <= end.cached_tokens
    assert end.cached_tokens < end.prompt_tokens


@pytest.mark.parametrize(
    "schema",
    [
        WEATHER.parameters,
        TIME.parameters,
        ORDER,
        {},
        {"type": "object", "properties": {}},
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"type": "object", "properties": {"a": {"type": "array", "maxItems": 1}}},
        {"type": "object", "properties": {"a": {"type": "array", "minItems": 2}}},
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": 0}}},
        {
            "type": "object",
            "properties": {"a": {"type": "array", "prefixItems": [{}, {"const": 1}]}},
        },
        {"type": "object", "properties": {"a": {"anyOf": [{"type": "number"}, {"enum": ["x"]}]}}},
        {
            "properties": {"t": {"$ref": "#/definitions/t"}},
            "definitions": {"t": {"type": "string"}},
        },
    ],
)
def test_grammars_compile_in_llama_cpp(schema: dict[str, Any]) -> None:
    vocab_model = llama_cpp.Llama(model_path=default_model_path(), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(vocab_model.model)
    grammars = [arguments_gbnf(schema), schema_to_gbnf(schema), tool_call_gbnf({"f": schema})]
    for text in grammars:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        assert sampler, text
        llama_cpp.llama_sampler_free(sampler)


def test_bad_grammar_is_rejected_by_llama_cpp() -> None:
    vocab_model = llama_cpp.Llama(model_path=default_model_path(), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(vocab_model.model)
    assert not llama_cpp.llama_sampler_init_grammar(vocab, b"root ::= (", b"root")


def test_parses_tool_calls_written_in_free_text() -> None:
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>[{"name": "get_time", "arguments": "{\\"timezone\\": \\"UTC\\"}"}]'
    )
    assert _parse_tool_calls(text, {"get_weather", "get_time"}) == [
        ("get_weather", '{"city": "Oslo"}'),
        ("get_time", '{"timezone": "UTC"}'),
    ]
    assert _parse_tool_calls("<tool_call>{broken", {"get_weather"}) == []
    assert _parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}', {"get_weather"}) == []


@pytest.mark.slow
async def test_prefill_reads_the_next_turns_prompt_ahead(llm: LlamaCppLlm) -> None:
    history = (
        ChatMessage(role="system", content="Answer in one short sentence."),
        ChatMessage(role="user", content="What is the capital of France?"),
        ChatMessage(role="assistant", content="The capital of France is Paris."),
    )
    await llm.prefill(GenerationRequest(messages=history))
    follow_up = GenerationRequest(
        messages=(*history, ChatMessage(role="user", content="And of Spain?")), max_tokens=3
    )
    done = finished(await collect(llm.generate(follow_up)))
    # Everything up to the new user message was read before the question came.
    assert done.prompt_tokens > 30
    assert done.prompt_tokens - done.cached_tokens <= 12


@pytest.mark.slow
async def test_interleaved_conversations_keep_their_cache(llm: LlamaCppLlm) -> None:
    def history(city: str) -> tuple[ChatMessage, ...]:
        return (
            ChatMessage(role="system", content=f"You are a guide to {city}. Be brief."),
            ChatMessage(role="user", content=f"Tell me one thing about {city}."),
            ChatMessage(role="assistant", content=f"{city} has a famous old bridge."),
        )

    first, second = history("Paris"), history("Prague")
    await llm.prefill(GenerationRequest(messages=first))
    await llm.prefill(GenerationRequest(messages=second))
    # The first conversation comes back after the second used the model.
    follow_up = GenerationRequest(
        messages=(*first, ChatMessage(role="user", content="And its river?")), max_tokens=2
    )
    done = finished(await collect(llm.generate(follow_up)))
    assert done.prompt_tokens - done.cached_tokens <= 12


@pytest.mark.slow
async def test_a_turn_read_while_it_is_spoken_leaves_only_its_tail(llm: LlamaCppLlm) -> None:
    said = (
        "I am planning a long walk along the coast next weekend with two friends and a dog "
        "and we would like to start early in the morning from the old harbour then follow "
        "the cliffs to the lighthouse and have lunch somewhere quiet before we walk back "
        "through the woods so could you tell me what we should pack and what to watch out "
        "for near the sea"
    )
    words = said.split(" ")
    system = ChatMessage(role="system", content="You are a hiking guide. Be brief.")

    def turn(text: str, *, spoken: bool = True) -> GenerationRequest:
        return GenerationRequest(
            messages=(system, ChatMessage(role="user", content=text)),
            open_turn=spoken,
            max_tokens=2,
        )

    # The words committed so far, as the speaker goes on; the last ends where the final
    # text merges it with more letters ("sea" → "seashore"): a different last token.
    await llm.prefill(turn(" ".join(words[:30])))
    await llm.prefill(turn(" ".join(words)))
    final = turn(" ".join(words) + "shore tomorrow?", spoken=False)
    done = finished(await collect(llm.generate(final)))
    assert done.prompt_tokens > 80
    # Only the tail is read at reply time: the changed last word, the new ones, and the
    # closing and assistant header.
    assert done.prompt_tokens - done.cached_tokens <= 12
    # The same turn in a conversation nobody read ahead is read whole.
    other = ChatMessage(role="system", content="You are a sailing guide. Be brief.")
    cold = GenerationRequest(messages=(other, *final.messages[1:]), max_tokens=2)
    done = finished(await collect(llm.generate(cold)))
    assert done.prompt_tokens - done.cached_tokens > 80

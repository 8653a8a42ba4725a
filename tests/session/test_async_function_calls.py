"""Asynchronous function calling on the sans-I/O core (issue 28, point 5): the user speaks while
a function call is pending, and its output comes later. The prompt the LLM gets must keep
every call's result slot right after the call, as strict OpenAI-compatible backends and chat
templates need (the checker below is the order vLLM's tool parsers and Mistral's tokenizer
enforce), whatever order the conversation's items are in.
"""

from __future__ import annotations

from typing import Any

from hark.engines.llm import ChatMessage, Finished
from hark.engines.llm.chat_template import render_chatml
from hark.session.actions import Generate
from hark.session.conversation import PENDING_RESULT
from hark.session.results import (
    GenerationFinished,
    TextGenerated,
    ToolCallFinished,
    ToolCallStarted,
)
from tests.e2e.chat_peer import order_problem

from .conftest import Driver

LOOKUP = {
    "type": "function",
    "name": "book_table",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
}


def wire(messages: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    """The messages as chat-completions carries them (what ``order_problem`` reads)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = [{"id": c.call_id} for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def shape(messages: tuple[ChatMessage, ...]) -> list[str]:
    """Each message after the instructions as ``role`` (``assistant+N`` with N calls), with
    a tool result's text."""
    assert messages[0].role == "system"
    return [
        f"assistant+{len(m.tool_calls)}"
        if m.tool_calls
        else f"tool:{m.content}"
        if m.role == "tool"
        else m.role
        for m in messages[1:]
    ]


def session(driver: Driver) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                "tools": [LOOKUP],
            },
        }
    )


def say(driver: Driver, text: str) -> None:
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            },
        }
    )


def output(driver: Driver, call_id: str, text: str) -> None:
    driver.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": call_id, "output": text},
        }
    )


def respond(driver: Driver) -> Generate:
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert order_problem(wire(generate.request.messages)) is None, shape(generate.request.messages)
    return generate


def calls(driver: Driver, generate: Generate, *call_ids: str) -> None:
    rid = generate.response_id
    for call_id in call_ids:
        driver.session.handle(ToolCallStarted(rid, call_id, "book_table"), now=driver.now)
        driver.session.handle(ToolCallFinished(rid, call_id, '{"name": "Ada"}'), now=driver.now)
    driver.session.handle(GenerationFinished(rid, Finished("tool_calls")), now=driver.now)
    driver.pump()


def answers(driver: Driver, generate: Generate, text: str) -> None:
    driver.session.handle(TextGenerated(generate.response_id, text), now=driver.now)
    driver.session.handle(
        GenerationFinished(generate.response_id, Finished("stop")), now=driver.now
    )
    driver.pump()


def test_a_pending_call_keeps_its_slot_and_a_late_output_is_read_where_it_came() -> None:
    driver = Driver()
    session(driver)
    say(driver, "Book a table for Ada.")
    calls(driver, respond(driver), "call_1")
    # The user speaks while the call runs: the call's slot holds a placeholder.
    say(driver, "And is it raining?")
    generate = respond(driver)
    assert shape(generate.request.messages) == [
        "user",
        "assistant+1",
        f"tool:{PENDING_RESULT}",
        "user",
    ]
    answers(driver, generate, "I am booking it. No rain today.")
    # The output comes after the user's turn and the answer: it is read there, as the call
    # made again with its result, after the placeholder in the slot.
    output(driver, "call_1", "Booked for 8 pm.")
    generate = respond(driver)
    messages = generate.request.messages
    assert shape(messages) == [
        "user",
        "assistant+1",
        f"tool:{PENDING_RESULT}",
        "user",
        "assistant+1",
        "tool:Booked for 8 pm.",
    ]
    assert messages[-2].content == "I am booking it. No rain today."
    (again,) = messages[-2].tool_calls
    assert (again.name, again.arguments) == ("book_table", '{"name": "Ada"}')
    assert again.call_id != "call_1" and messages[-1].tool_call_id == again.call_id
    assert "error" not in driver.types()


def test_an_output_right_after_its_call_fills_the_slot() -> None:
    driver = Driver()
    session(driver)
    say(driver, "Book two tables.")
    calls(driver, respond(driver), "call_1", "call_2")
    output(driver, "call_2", "Second booked.")
    output(driver, "call_1", "First booked.")
    generate = respond(driver)
    assert shape(generate.request.messages) == [
        "user",
        "assistant+2",
        "tool:First booked.",
        "tool:Second booked.",
    ]


def test_one_output_on_time_and_one_late() -> None:
    driver = Driver()
    session(driver)
    say(driver, "Book two tables.")
    calls(driver, respond(driver), "call_1", "call_2")
    output(driver, "call_1", "First booked.")
    say(driver, "Hurry up.")
    answers(driver, respond(driver), "Working on it.")
    output(driver, "call_2", "Second booked.")
    generate = respond(driver)
    assert shape(generate.request.messages) == [
        "user",
        "assistant+2",
        "tool:First booked.",
        f"tool:{PENDING_RESULT}",
        "user",
        "assistant+1",
        "tool:Second booked.",
    ]


def test_a_late_output_while_another_call_waits_comes_after_that_calls_slot() -> None:
    driver = Driver()
    session(driver)
    say(driver, "Book a table.")
    calls(driver, respond(driver), "call_1")
    say(driver, "And another one.")
    calls(driver, respond(driver), "call_2")
    output(driver, "call_1", "First booked.")
    output(driver, "call_2", "Second booked.")
    generate = respond(driver)
    assert shape(generate.request.messages) == [
        "user",
        "assistant+1",
        f"tool:{PENDING_RESULT}",
        "user",
        "assistant+1",
        "tool:Second booked.",
        "assistant+1",
        "tool:First booked.",
    ]


def test_the_embedded_models_template_gets_alternating_turns() -> None:
    # The embedded LLM's ChatML puts tool results in a user turn: with the result slot kept,
    # the user's words never follow the call in the same turn as a result.
    driver = Driver()
    session(driver)
    say(driver, "Book a table for Ada.")
    calls(driver, respond(driver), "call_1")
    say(driver, "And is it raining?")
    answers(driver, respond(driver), "No rain.")
    output(driver, "call_1", "Booked for 8 pm.")
    prompt = render_chatml(respond(driver).request.messages)
    turns = [t.split("\n", 1)[0] for t in prompt.split("<|im_start|>")[1:]]
    assert turns == [
        "system",
        "user",
        "assistant",
        "user",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert "<tool_response>\nBooked for 8 pm.\n</tool_response>" in prompt.split("No rain.")[1]

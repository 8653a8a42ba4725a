"""The truncation policy (``hark.engines.llm.truncation``) on conversations of known sizes."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from hark.engines.llm import ChatMessage, FunctionTool, ToolCall, Truncation
from hark.engines.llm.truncation import ContextOverflow, fit

AUTO = Truncation()
DISABLED = Truncation(mode="disabled")
TOOLS = (FunctionTool("get_weather", "The weather in a city"),)


class WordCounter:
    """One token per word, two per message for its markers, ``join`` more per message in a
    whole prompt (what per-message counts miss), ten per tool."""

    def __init__(self, join: int = 0) -> None:
        self.join = join

    def message(self, message: ChatMessage) -> int:
        calls = sum(len(c.arguments.split()) + 3 for c in message.tool_calls)
        return len(message.content.split()) + 2 + calls

    def prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]) -> int:
        return sum(self.message(m) + self.join for m in messages) + 10 * len(tools) + 3


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def conversation(turns: int, size: int = 8) -> list[ChatMessage]:
    messages = [ChatMessage("system", words(10, "rule"))]
    for t in range(turns):
        messages.append(ChatMessage("user", words(size, f"q{t}_")))
        messages.append(ChatMessage("assistant", words(size, f"a{t}_")))
    return messages


def test_a_prompt_that_fits_is_sent_whole() -> None:
    messages = conversation(3)
    counter = WordCounter()
    budget = counter.prompt(messages, TOOLS)
    assert fit(messages, TOOLS, counter, budget, AUTO) == tuple(messages)
    assert fit(messages, TOOLS, counter, budget, DISABLED) == tuple(messages)


def test_auto_drops_the_oldest_whole_turns_and_keeps_the_instructions() -> None:
    messages = conversation(10)  # each turn: 10 + 10 tokens
    counter = WordCounter()
    budget = counter.prompt(messages, TOOLS) - 25  # two turns too many, by 5 tokens
    kept = fit(messages, TOOLS, counter, budget, AUTO)
    assert kept[0] == messages[0]
    assert kept[1:] == tuple(messages[5:])  # turns 0 and 1 dropped, no more
    assert counter.prompt(kept, TOOLS) <= budget


def test_disabled_fails_with_a_clear_error_when_the_context_is_full() -> None:
    messages = conversation(10)
    counter = WordCounter()
    budget = counter.prompt(messages, TOOLS) - 1
    with pytest.raises(ContextOverflow, match="truncation is disabled"):
        fit(messages, TOOLS, counter, budget, DISABLED)


def test_instructions_and_tools_too_long_for_the_context_fail() -> None:
    messages = conversation(2)
    with pytest.raises(ContextOverflow, match="instructions and tool definitions"):
        fit(messages, TOOLS, WordCounter(), 20, AUTO)


def test_a_last_message_too_long_for_the_context_fails() -> None:
    messages = [*conversation(2), ChatMessage("user", words(200, "w"))]
    with pytest.raises(ContextOverflow, match="last message alone"):
        fit(messages, TOOLS, WordCounter(), 100, AUTO)


def tool_conversation() -> list[ChatMessage]:
    """A turn with two tool round trips and long results, answered: the conversation as the
    reply after the last result reads it."""
    messages = [ChatMessage("system", "be brief")]
    messages.append(ChatMessage("user", words(5, "u")))
    for n in range(2):
        call = ToolCall(f"call_{n}", "get_weather", '{"city": "Paris"}')
        messages.append(ChatMessage("assistant", "", tool_calls=(call,)))
        messages.append(ChatMessage("tool", words(30, f"r{n}_"), tool_call_id=f"call_{n}"))
    messages.append(ChatMessage("tool", words(3, "late"), tool_call_id="call_0"))
    return messages


@pytest.mark.parametrize("join", [0, 3])
def test_a_tool_call_and_its_result_stay_or_go_together(join: int) -> None:
    messages = tool_conversation()
    counter = WordCounter(join)
    whole = counter.prompt(messages, TOOLS)
    fitted = 0
    for budget in range(whole - 1, 0, -1):
        try:
            kept = fit(messages, TOOLS, counter, budget, AUTO)
        except ContextOverflow:
            continue
        fitted += 1
        assert counter.prompt(kept, TOOLS) <= budget
        assert kept[0] == messages[0] and kept[-1] == messages[-1]
        assert kept[1].role != "tool"
        calls = {c.call_id for m in kept for c in m.tool_calls}
        results = {m.tool_call_id for m in kept if m.role == "tool"}
        assert calls == results
    assert fitted >= 5


def test_retention_ratio_cuts_rarely_and_keeps_the_beginning_stable() -> None:
    counter = WordCounter()
    budget = 250
    ratio = Truncation(mode="retention_ratio", retention_ratio=0.5)
    starts: dict[str, list[ChatMessage]] = {"auto": [], "ratio": []}
    for turns in range(1, 40):
        messages = conversation(turns)
        for name, truncation in (("auto", AUTO), ("ratio", ratio)):
            kept = fit(messages, (), counter, budget, truncation)
            assert counter.prompt(kept, ()) <= budget
            assert kept[1].role == "user"
            starts[name].append(kept[1])
    moves = {name: sum(a != b for a, b in itertools.pairwise(s)) for name, s in starts.items()}
    # auto moves its cut on nearly every turn once full; the ratio once every few turns.
    assert moves["auto"] >= 25
    assert 3 <= moves["ratio"] <= 8


def test_retention_ratio_drops_down_to_the_ratio_at_once() -> None:
    counter = WordCounter()
    limit = 200
    instructions_cost = counter.prompt(conversation(0), ())
    ratio = Truncation(mode="retention_ratio", retention_ratio=0.6)
    previous = conversation(1)
    for turns in range(2, 40):
        messages = conversation(turns)
        kept = fit(messages, (), counter, instructions_cost + limit, ratio)
        conversation_tokens = sum(counter.message(m) for m in kept[1:])
        if kept[1] != previous[1]:
            # At a cut the conversation falls to the ratio (up to one turn of rounding).
            assert conversation_tokens <= 0.6 * limit + 20
        previous = list(kept)


def test_retention_ratio_token_limit_lowers_the_limit() -> None:
    counter = WordCounter()
    messages = conversation(20)
    limited = Truncation(mode="retention_ratio", retention_ratio=1.0, post_instructions_tokens=60)
    kept = fit(messages, (), counter, counter.prompt(messages, ()) - 1, limited)
    assert sum(counter.message(m) for m in kept[1:]) <= 60
    assert kept[-1] == messages[-1]

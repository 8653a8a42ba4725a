"""The embedded llama.cpp LLM at the edges: conversations longer than its context (truncation
with the model's own tokenizer), and the bounded mailbox between its batching thread and a
generation's reader."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence

import pytest

from hark.engines.llm import (
    ChatMessage,
    Finished,
    GenerationRequest,
    LlmEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
    Truncation,
)
from hark.engines.llm.llama_cpp import EventMailbox, LlamaCppLlm
from hark.engines.llm.truncation import ContextOverflow
from tests.helpers.streams import collect

SYSTEM = "You are a helpful assistant. Answer in one short sentence."
N_CTX = 512


def post_all(mailbox: EventMailbox, items: Sequence[LlmEvent | None]) -> list[bool]:
    """Post ``items`` from a thread of its own, as the batching thread does; returns what
    each post answered. Should a post block, the join guards against a hung test."""
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: answers.extend(mailbox.post(i) for i in items))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "posting blocked the thread"
    return answers


async def test_a_lagging_reader_gets_merged_text_and_the_mailbox_stays_small() -> None:
    mailbox = EventMailbox(asyncio.get_running_loop(), limit=8)
    words = [TextDelta(f"w{i} ") for i in range(10_000)]
    # The reader is not reading while the thread posts ten thousand deltas.
    answers = post_all(mailbox, [ToolCallStarted("c", "f"), *words])
    assert all(answers)
    assert len(mailbox) == 2
    more = post_all(
        mailbox,
        [ToolCallArgumentsDelta("c", '{"a"'), ToolCallArgumentsDelta("c", ": 1}"), None],
    )
    assert all(more)
    items = await mailbox.take()
    assert items == [
        ToolCallStarted("c", "f"),
        TextDelta("".join(w.text for w in words)),
        ToolCallArgumentsDelta("c", '{"a": 1}'),
        None,
    ]


async def test_a_mailbox_full_of_events_that_cannot_merge_fails_the_generation() -> None:
    mailbox = EventMailbox(asyncio.get_running_loop(), limit=8)
    calls = [ToolCallStarted(f"c{i}", "f") for i in range(20)]
    answers = post_all(mailbox, calls)
    # The thread is told to stop at once, and the reader gets what fitted, then an error.
    assert answers == [True] * 8 + [False] * 12
    items = await mailbox.take()
    assert items[:8] == calls[:8]
    assert isinstance(items[8], RuntimeError) and len(items) == 9


async def test_take_waits_for_a_post() -> None:
    mailbox = EventMailbox(asyncio.get_running_loop())
    waiting = asyncio.create_task(mailbox.take())
    await asyncio.sleep(0)
    assert not waiting.done()
    await asyncio.to_thread(mailbox.post, TextDelta("hi"))
    assert await waiting == [TextDelta("hi")]


@pytest.fixture(scope="module")
def small() -> Iterator[LlamaCppLlm]:
    """SmolLM2 with a context of 512 tokens and a short reply budget."""
    engine = LlamaCppLlm(n_ctx=N_CTX, max_tokens_default=16)
    yield engine
    asyncio.run(engine.aclose())


def long_conversation(turns: int) -> list[ChatMessage]:
    messages = [ChatMessage("system", SYSTEM)]
    for t in range(turns):
        messages.append(
            ChatMessage("user", f"Here is fact number {t}: the box {t} holds {t * 7} red marbles.")
        )
        messages.append(ChatMessage("assistant", f"Noted: box {t} holds {t * 7} red marbles."))
    messages.append(ChatMessage("user", "What is the capital of France?"))
    return messages


def finished(events: list[LlmEvent]) -> Finished:
    end = events[-1]
    assert isinstance(end, Finished)
    return end


@pytest.mark.slow
async def test_a_conversation_past_the_context_keeps_being_answered(small: LlamaCppLlm) -> None:
    messages = tuple(long_conversation(40))  # about 1500 tokens
    for truncation in (Truncation(), Truncation("retention_ratio", retention_ratio=0.5)):
        request = GenerationRequest(messages, temperature=0.0, truncation=truncation)
        events = await collect(small.generate(request))
        end = finished(events)
        assert end.reason == "stop"
        assert 100 < end.prompt_tokens <= N_CTX - 32
        assert "Paris" in "".join(e.text for e in events if isinstance(e, TextDelta))


@pytest.mark.slow
async def test_disabled_truncation_fails_when_the_context_is_full(small: LlamaCppLlm) -> None:
    request = GenerationRequest(tuple(long_conversation(40)), truncation=Truncation("disabled"))
    with pytest.raises(ContextOverflow, match="truncation is disabled"):
        await collect(small.generate(request))
    # The same conversation while it still fits is answered.
    short = GenerationRequest(tuple(long_conversation(2)), truncation=Truncation("disabled"))
    assert finished(await collect(small.generate(short))).reason == "stop"


@pytest.mark.slow
async def test_instructions_too_long_for_the_context_fail(small: LlamaCppLlm) -> None:
    instructions = "Always be polite and answer briefly. " * 80
    request = GenerationRequest((ChatMessage("system", instructions), ChatMessage("user", "Hi")))
    with pytest.raises(ContextOverflow, match="instructions"):
        await collect(small.generate(request))


@pytest.mark.slow
async def test_retention_ratio_keeps_the_cached_beginning_over_the_next_turns(
    small: LlamaCppLlm,
) -> None:
    """Turn after turn past the context: ``auto`` drops a turn each time, so the cached
    prompt is lost each time; ``retention_ratio`` drops once and the next turns reuse it."""
    cached: dict[str, list[int]] = {}
    for name, truncation in (
        ("auto", Truncation()),
        ("ratio", Truncation("retention_ratio", retention_ratio=0.5)),
    ):
        cached[name] = []
        for turns in range(24, 28):
            question = ChatMessage("user", f"How many marbles are in box {turns - 1}?")
            messages = (*long_conversation(turns)[:-1], question)
            request = GenerationRequest(messages, temperature=0.0, truncation=truncation)
            events = await collect(small.generate(request))
            cached[name].append(finished(events).cached_tokens)
    # The first turn of each run starts cold or from the other run's cache; after it, only
    # the ratio's prompts begin with what was read before.
    assert all(c > 100 for c in cached["ratio"][1:]), cached
    assert all(c < 50 for c in cached["auto"][1:]), cached

"""Many generations on one embedded llama.cpp model at once, on the real SmolLM2-135M-Instruct.

Greedy decoding (temperature 0) makes a reply a function of its prompt and of where its KV
cells sit in the shared cache. With flash attention, llama.cpp sums a sequence's cells in cell
order and skips the others, so a sequence whose cells are in position order gets the same reply
whatever else shares the batch and the cache: a reply produced beside other generations must be
the one the request gets alone on a fresh engine, token for token. Without it (the default,
faster on long conversations) the sums run over every cell, other sequences' too, and rounding
may part two runs after a couple of dozen tokens, so the default engine is held to the first
words.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import llama_cpp
import pytest

from hark.engines import activity
from hark.engines.activity import computing
from hark.engines.llm import (
    ChatMessage,
    GenerationRequest,
    LlmEvent,
    TextDelta,
    ToolChoice,
    Urgency,
)
from hark.engines.llm.continuous_batching import BatchScheduler
from hark.engines.llm.llama_cpp import LlamaCppLlm
from hark.engines.llm.step_policy import OPENING_TOKENS
from tests.helpers.llm import text_of
from tests.helpers.streams import collect

from .test_llama_cpp_llm import (
    ORDER,
    WEATHER,
    ask,
    check,
    finished,
    order_call,
    single_call,
)

QUESTIONS = (
    "What is the capital of France?",
    "How many days are in a week?",
    "What do bees make?",
    "Who wrote Romeo and Juliet?",
)
STORY = "Write a long story about a dragon."
# Batch-invariant greedy replies (see the module doc).
EXACT: dict[str, Any] = {"flash_attention": True}

# Every test here loads SmolLM2. Its batches use every core, and its waits for a generation
# to start assume nothing else computes: another test beside it timed one out.
pytestmark = [pytest.mark.slow, pytest.mark.realtime]


@pytest.fixture
async def llm() -> AsyncIterator[LlamaCppLlm]:
    engine = LlamaCppLlm()
    await engine.warmup()
    yield engine
    await engine.aclose()


@pytest.fixture
async def exact() -> AsyncIterator[LlamaCppLlm]:
    engine = LlamaCppLlm(**EXACT)
    await engine.warmup()
    yield engine
    await engine.aclose()


def greedy(question: str, max_tokens: int = 40, system: str | None = None) -> GenerationRequest:
    request = ask(question, temperature=0.0, max_tokens=max_tokens)
    if system is None:
        return request
    return GenerationRequest(
        messages=(ChatMessage("system", system), request.messages[1]),
        temperature=0.0,
        max_tokens=max_tokens,
    )


async def solo(requests: list[GenerationRequest], **settings: Any) -> list[str]:
    """Each request's reply on an engine of its own."""
    texts = []
    for request in requests:
        engine = LlamaCppLlm(**settings)
        try:
            texts.append(text_of(await collect(engine.generate(request))))
        finally:
            await engine.aclose()
    return texts


def long_history(topic: str, turns: int) -> tuple[ChatMessage, ...]:
    """A conversation of ``turns`` exchanges about ``topic``: a few hundred tokens to read."""
    messages = [ChatMessage("system", f"You are a guide to {topic}. Be brief.")]
    for i in range(turns):
        messages.append(ChatMessage("user", f"Tell me fact number {i + 1} about {topic}."))
        messages.append(
            ChatMessage("assistant", f"Fact {i + 1}: {topic} has a long and varied history.")
        )
    return tuple(messages)


# Bounds a hang, never speed.
LIVENESS_S = 60.0
# Which of two things happened first, in the order the event loop saw them.
_ticks = itertools.count()


class Timed:
    """Consumes a stream, noting in what order its first text and its end arrived."""

    def __init__(self) -> None:
        self.events: list[LlmEvent] = []
        self.first_text: int | None = None
        self.ended: int | None = None
        self.started = asyncio.Event()

    async def run(self, stream: AsyncIterator[LlmEvent]) -> list[LlmEvent]:
        async for event in stream:
            if isinstance(event, TextDelta) and self.first_text is None:
                self.first_text = next(_ticks)
                self.started.set()
            self.events.append(event)
        self.ended = next(_ticks)
        return self.events


class DecodeGate:
    """Holds the scheduler thread at ``llama_decode`` while closed, and counts the jobs that
    reach a scheduler: a test then knows what is still running when its next request
    arrives, however fast the machine generates. Open until ``close``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._cond = threading.Condition()
        self._permits: int | None = None  # None: open
        self.entered = 0
        self.submitted = 0
        decode = llama_cpp.llama_decode
        submit = BatchScheduler.submit

        def gated(ctx: Any, batch: Any) -> int:
            with self._cond:
                self.entered += 1
                self._cond.notify_all()
                if not self._cond.wait_for(
                    lambda: self._permits is None or self._permits > 0, LIVENESS_S
                ):
                    raise AssertionError("the decode gate was never opened")
                if self._permits is not None:
                    self._permits -= 1
            return int(decode(ctx, batch))

        def counted(scheduler: BatchScheduler, job: Any) -> None:
            submit(scheduler, job)
            with self._cond:
                self.submitted += 1
                self._cond.notify_all()

        monkeypatch.setattr(llama_cpp, "llama_decode", gated)
        monkeypatch.setattr(BatchScheduler, "submit", counted)

    def close(self) -> None:
        """Hold every decode from now on."""
        with self._cond:
            self._permits = 0

    def open(self) -> None:
        """Let every decode through."""
        with self._cond:
            self._permits = None
            self._cond.notify_all()

    def notify(self) -> None:
        """Have :meth:`until` look at its condition again (from any thread)."""
        with self._cond:
            self._cond.notify_all()

    def let_one_through(self) -> int:
        """Let the held decode run; returns the number the next decode will have."""
        with self._cond:
            assert self._permits is not None, "the gate is open"
            self._permits += 1
            self._cond.notify_all()
            return self.entered + 1

    async def until(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()`` (looked at on each decode and :meth:`notify`)."""

        def wait() -> bool:
            with self._cond:
                return self._cond.wait_for(ready, LIVENESS_S)

        assert await asyncio.to_thread(wait), "the scheduler never got there"

    async def held(self, decodes: int = 1) -> None:
        """Wait until the scheduler has reached its ``decodes``-th decode since the gate was
        made (and, closed, is held there)."""
        await self.until(lambda: self.entered >= decodes)

    async def arrived(self, jobs: int) -> None:
        """Wait until ``jobs`` jobs have reached a scheduler since the gate was made."""
        await self.until(lambda: self.submitted >= jobs)

    async def step(self) -> None:
        """Let the held decode run, and wait until the scheduler is held at the next one."""
        await self.held(self.let_one_through())


async def test_concurrent_generations_match_their_solo_runs(exact: LlamaCppLlm) -> None:
    alone = await solo([greedy(q) for q in QUESTIONS], **EXACT)
    assert alone[0] == "The capital of France is Paris."
    together = await asyncio.gather(*(collect(exact.generate(greedy(q))) for q in QUESTIONS))
    assert [text_of(events) for events in together] == alone
    for events in together:
        assert finished(events).reason in ("stop", "length")


async def test_concurrent_openings_match_their_solo_runs(llm: LlamaCppLlm) -> None:
    alone = await solo([greedy(q, 10) for q in QUESTIONS])
    assert alone[0] == "The capital of France is Paris."
    together = await asyncio.gather(*(collect(llm.generate(greedy(q, 10))) for q in QUESTIONS))
    assert [text_of(events) for events in together] == alone


async def test_generations_arriving_at_different_times_match_their_solo_runs(
    exact: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    systems = [f"You are assistant number {i}. Answer in one short sentence." for i in range(3)]
    alone = await solo([greedy(STORY, 30, s) for s in systems], **EXACT)
    gate = DecodeGate(monkeypatch)
    gate.close()
    streams = [Timed() for _ in systems]
    tasks = []
    for i, system in enumerate(systems):
        tasks.append(asyncio.create_task(streams[i].run(exact.generate(greedy(STORY, 30, system)))))
        await gate.arrived(i + 1)
        if i == 0:
            await gate.held()
        # Each arrives once the one before has spoken, and before it can finish: the
        # scheduler is held until the next one is queued.
        while not streams[i].started.is_set():
            await gate.step()
    gate.open()
    replies = [text_of(events) for events in await asyncio.gather(*tasks)]
    assert replies == alone
    for earlier, later in itertools.pairwise(streams):
        assert earlier.ended is not None and later.first_text is not None
        assert later.first_text < earlier.ended


async def test_a_tool_call_beside_text_keeps_its_grammar(exact: LlamaCppLlm) -> None:
    call = order_call()
    texts = [greedy(q) for q in QUESTIONS[:2]]
    alone = await solo(texts, **EXACT)
    results = await asyncio.gather(
        collect(exact.generate(call)), *(collect(exact.generate(r)) for r in texts)
    )
    name, arguments = single_call(results[0])
    assert name == "place_order"
    check(arguments, ORDER)
    assert [text_of(events) for events in results[1:]] == alone


async def test_cancelling_one_generation_leaves_the_others_alone(
    exact: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = await solo([greedy(q) for q in QUESTIONS[:2]], **EXACT)
    gate = DecodeGate(monkeypatch)
    gate.close()
    doomed = Timed()
    task = asyncio.create_task(doomed.run(exact.generate(greedy(STORY, 200))))
    others = asyncio.gather(*(collect(exact.generate(greedy(q))) for q in QUESTIONS[:2]))
    await gate.arrived(3)
    await gate.held()
    while not doomed.started.is_set():
        await gate.step()
    # Cancelled while the scheduler is held mid-story: it cannot have finished.
    task.cancel()
    gate.open()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [text_of(events) for events in await others] == alone
    assert doomed.events and all(isinstance(e, TextDelta) for e in doomed.events), (
        "a cancelled generation must not finish"
    )


async def test_a_cancelled_generation_frees_its_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two sequences: the third request can only start once a running one has left.
    engine = LlamaCppLlm(sequences=2)
    try:
        await engine.warmup()
        gate = DecodeGate(monkeypatch)
        gate.close()
        cancelled, running, third = Timed(), Timed(), Timed()
        doomed = asyncio.create_task(cancelled.run(engine.generate(greedy(STORY, 300))))
        busy = asyncio.create_task(
            running.run(engine.generate(greedy(STORY, 300, "You tell stories.")))
        )
        # A decode at a time until both stories have begun: the second then has nearly all
        # of its 300 tokens still to tell, however fast the scheduler's thread ran.
        await gate.arrived(2)
        await gate.held()
        while not (cancelled.started.is_set() and running.started.is_set()):
            await gate.step()
        doomed.cancel()
        asked = asyncio.create_task(third.run(engine.generate(greedy(QUESTIONS[0]))))
        await gate.arrived(3)
        gate.open()
        events = await asked
        assert text_of(events) == "The capital of France is Paris."
        # The third reply was done while the other 300-token story was still being told.
        assert not busy.done()
        assert third.ended is not None
        await busy
        assert running.ended is not None and third.ended < running.ended
        assert finished(running.events).completion_tokens == 300
    finally:
        await engine.aclose()


async def test_a_second_turn_reports_its_cached_tokens(llm: LlamaCppLlm) -> None:
    first_turn = greedy(QUESTIONS[0])
    first = finished(await collect(llm.generate(first_turn)))
    # Other conversations use the model in between.
    await asyncio.gather(*(collect(llm.generate(greedy(q, 10, "Be brief."))) for q in QUESTIONS))
    second_turn = GenerationRequest(
        messages=(
            *first_turn.messages,
            ChatMessage("assistant", "The capital of France is Paris."),
            ChatMessage("user", "And of Italy?"),
        ),
        temperature=0.0,
    )
    second = finished(await collect(llm.generate(second_turn)))
    assert second.cached_tokens >= first.prompt_tokens + first.completion_tokens
    # Only the new user turn and the assistant's opening were left to read.
    assert second.prompt_tokens - second.cached_tokens < 20


@pytest.mark.parametrize("ram_bytes", [64 << 20, 0])
async def test_idle_conversations_wait_in_ram(ram_bytes: int) -> None:
    # No idle conversation may stay in the KV cache: the first one goes to RAM, if any.
    engine = LlamaCppLlm(resident_idle_cells=0, ram_bytes=ram_bytes)
    history = long_history("Rome", 3)
    try:
        first = finished(await collect(engine.generate(GenerationRequest(messages=history))))
        other = GenerationRequest(messages=long_history("Oslo", 3), max_tokens=5)
        await collect(engine.generate(other))
        follow_up = GenerationRequest(
            messages=(*history, ChatMessage("user", "And one more?")), max_tokens=5
        )
        done = finished(await collect(engine.generate(follow_up)))
    finally:
        await engine.aclose()
    assert first.prompt_tokens > 100
    if ram_bytes:
        # Back from RAM: all of the conversation up to the new user turn.
        assert done.cached_tokens >= first.prompt_tokens - 4
    else:
        # Forgotten: only the system prompt's opening is shared with the other conversation.
        assert done.cached_tokens < 20


async def test_sessions_share_the_cache_of_a_common_beginning(llm: LlamaCppLlm) -> None:
    system = " ".join(["You are a voice assistant for a large hotel."] * 12)
    early = Timed()
    story = asyncio.create_task(early.run(llm.generate(greedy(STORY, 80, system))))
    await asyncio.wait_for(early.started.wait(), 30)
    # The story's sequence is busy: the question shares its instructions' cells instead.
    done = finished(await collect(llm.generate(greedy(QUESTIONS[0], 20, system))))
    assert done.cached_tokens > 100
    assert done.prompt_tokens - done.cached_tokens < 20
    await story


async def test_a_turn_overtakes_a_speculative_reply(
    llm: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    speculation = GenerationRequest(
        messages=long_history("Rome", 8),
        temperature=0.0,
        max_tokens=20,
        urgency=Urgency(speculative=True),
    )
    turn = GenerationRequest(messages=long_history("Paris", 12), temperature=0.0, max_tokens=20)
    speculative, urgent = Timed(), Timed()
    gate = DecodeGate(monkeypatch)
    gate.close()
    first = asyncio.create_task(speculative.run(llm.generate(speculation)))
    # The turn arrives while the speculation's prompt is being read (its first step held).
    await gate.held()
    second = asyncio.create_task(urgent.run(llm.generate(turn)))
    await gate.arrived(2)
    gate.open()
    await asyncio.gather(first, second)
    # The turn came later with a longer prompt, yet spoke first: its prompt was read first.
    assert finished(urgent.events).prompt_tokens > finished(speculative.events).prompt_tokens
    assert urgent.first_text is not None and speculative.first_text is not None
    assert urgent.first_text < speculative.first_text


async def test_a_turn_overtakes_a_running_prefill(
    llm: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = long_history("Rome", 12)
    gate = DecodeGate(monkeypatch)
    gate.close()
    prefill = asyncio.create_task(llm.prefill(GenerationRequest(messages=history)))
    # The turn arrives while the prefill's first chunk is being read (held there).
    await gate.held()
    turn = Timed()
    answer = asyncio.create_task(turn.run(llm.generate(greedy(QUESTIONS[0]))))
    await gate.arrived(2)
    gate.open()
    await answer
    assert text_of(turn.events) == "The capital of France is Paris."
    assert not prefill.done()
    await prefill
    # The prefill was not dropped: the conversation's next turn finds its prompt read.
    follow_up = GenerationRequest(
        messages=(*history, ChatMessage("user", "And one more?")), max_tokens=2
    )
    done = finished(await collect(llm.generate(follow_up)))
    assert done.prompt_tokens - done.cached_tokens <= 12


async def test_a_full_cache_makes_generations_wait_not_fail(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for one of these conversations at a time, not two.
    engine = LlamaCppLlm(n_ctx=512, kv_cells=512, sequences=4, **EXACT)
    # Each a long story, so that neither can finish (and leave its cells idle, to be evicted
    # without the cache ever being full of running work) while the other's prompt is read.
    requests = [
        GenerationRequest(
            messages=(*long_history(city, 10), ChatMessage("user", f"{STORY} Set it in {city}.")),
            temperature=0.0,
            max_tokens=100,
        )
        for city in ("Rome", "Paris", "Oslo")
    ]
    try:
        # Both reach the scheduler before it decodes anything: on a busy machine the second
        # came once the first had finished, whose idle cells were then simply evicted.
        gate = DecodeGate(monkeypatch)
        gate.close()
        with caplog.at_level(logging.INFO, logger="hark.engines.llm.continuous_batching"):
            both = [asyncio.create_task(collect(engine.generate(r))) for r in requests[:2]]
            await gate.arrived(2)
            gate.open()
            results = await asyncio.gather(*both)
        assert "the KV cache is full" in caplog.text
        assert all(finished(events).prompt_tokens > 300 for events in results)
        # Both told their whole story: none failed. (Their words are not compared with their
        # solo runs': a story put back to wait reads its words again in other batches, and a
        # fresh-clone run saw greedy decoding part from the solo run within a few words.)
        assert all(finished(events).completion_tokens == 100 for events in results)
        assert all(text_of(events).strip() for events in results)
        # An idle conversation fills the cache now: a new one evicts it and is served.
        third = await collect(engine.generate(requests[2]))
        assert finished(third).completion_tokens == 100 and text_of(third).strip()
    finally:
        await engine.aclose()


async def test_a_lone_prompt_is_read_on_every_core_only_while_nothing_else_computes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = LlamaCppLlm(n_threads=1, wide_threads=2)
    await engine.warmup()
    set_threads: list[int] = []
    original = llama_cpp.llama_set_n_threads

    def spy(ctx: Any, n_threads: int, n_threads_batch: int) -> None:
        set_threads.append(n_threads_batch)
        original(ctx, n_threads, n_threads_batch)

    monkeypatch.setattr(llama_cpp, "llama_set_n_threads", spy)
    question = GenerationRequest(
        messages=(ChatMessage(role="user", content="What is the capital of Spain?"),),
        max_tokens=2,
    )
    try:
        await collect(engine.generate(question))
        # The prompt was read on both threads, the tokens after it on one.
        assert set_threads == [2, 1]
        set_threads.clear()
        other = GenerationRequest(
            messages=(ChatMessage(role="user", content="What is the capital of Italy?"),),
            max_tokens=2,
        )
        with computing():
            # Another model computes (Whisper, Piper, the end-of-turn model): stay narrow.
            done = finished(await collect(engine.generate(other)))
        assert done.prompt_tokens - done.cached_tokens > 1
        assert set_threads == []
    finally:
        await engine.aclose()


class Holds:
    """Notes each time the scheduler holds a step off: what its jobs had generated, and how
    many urgent calls still ran when it went on."""

    def __init__(self, engine: LlamaCppLlm, gate: DecodeGate, monkeypatch: pytest.MonkeyPatch):
        self.generated: list[list[int]] = []
        self.urgent_after: list[int] = []
        hold_off = activity.hold_off

        def noted(limit_s: float, stop: Callable[[], bool]) -> None:
            batcher = engine._batcher
            assert batcher is not None
            self.generated.append([task.generated for task in batcher._running])
            gate.notify()
            hold_off(limit_s, stop)
            self.urgent_after.append(activity.urgent_now())

        monkeypatch.setattr(activity, "hold_off", noted)

    async def until_held(self, gate: DecodeGate, holds: int) -> None:
        """Let decodes through one at a time until the scheduler holds a step off for the
        ``holds``-th time."""
        while len(self.generated) < holds:
            target = gate.let_one_through()

            def moved(target: int = target) -> bool:
                return gate.entered >= target or len(self.generated) >= holds

            await gate.until(moved)


async def test_a_reply_being_voiced_holds_off_while_an_urgent_call_runs(
    llm: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    batcher = llm._batcher
    assert batcher is not None
    # Counted from the urgent call's start, the bound would pass while the gate steps.
    batcher.hold_s = 3600.0
    gate = DecodeGate(monkeypatch)
    holds = Holds(llm, gate, monkeypatch)
    gate.close()
    task = asyncio.create_task(collect(llm.generate(greedy(STORY, 60))))
    with activity.urgent():
        await gate.held()
        # The prompt and the first words are decoded whatever runs: someone waits for them.
        await holds.until_held(gate, 1)
        assert holds.generated == [[OPENING_TOKENS]]
        decodes = gate.entered
    # The urgent call ended: the held step runs.
    await gate.held(decodes + 1)
    assert holds.urgent_after == [0]
    # A call that runs past the bound holds nothing longer.
    batcher.hold_s = 0.01
    with activity.urgent():
        await holds.until_held(gate, 2)
        await gate.held(decodes + 2)
        assert holds.urgent_after == [0, 1]
    gate.open()
    assert text_of(await task).strip()


async def test_a_forced_call_is_announced_once_its_prompt_is_read(
    llm: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of a forced call comes while its prompt is being read: its first event is the
    first token's, so the first token's time limit (not the shorter one between tokens)
    covers the prompt."""
    request = ask(
        "What's the weather like in Paris?",
        tools=(WEATHER,),
        tool_choice=ToolChoice("function", "get_weather"),
        temperature=0.0,
    )
    gate = DecodeGate(monkeypatch)
    gate.close()
    stream = llm.generate(request)

    async def first_event() -> LlmEvent:
        return await anext(stream)

    first = asyncio.create_task(first_event())
    # Held at the prompt's first decode: the call must not have been announced (what the
    # scheduler thread posted before the decode has reached the loop by the time the gate
    # says it is held; a few passes of the loop let the stream's reader see it).
    await gate.held()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not first.done()
    gate.open()
    events = [await first, *[event async for event in stream]]
    name, arguments = single_call(events)
    assert name == "get_weather" and arguments["city"] == "Paris"

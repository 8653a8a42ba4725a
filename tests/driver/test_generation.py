"""The response pipeline: LLM → clauses → TTS, overlapped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt
import pytest

from hark.driver.generation import run_generation
from hark.engines.fake import FakeTts
from hark.engines.llm import (
    Finished,
    GenerationRequest,
    LlmEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from hark.session.actions import Generate


class ScriptedLlm:
    """Streams a script; waits for ``gate`` (if given) before the last piece."""

    def __init__(self, script: list[LlmEvent], gate: asyncio.Event | None = None) -> None:
        self.script = script
        self.gate = gate

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        for i, event in enumerate(self.script):
            if self.gate is not None and i == len(self.script) - 2:
                await asyncio.wait_for(self.gate.wait(), 10)
            yield event

    async def prefill(self, request: GenerationRequest) -> None:
        return None

    async def warmup(self) -> None:
        return None


class Sink:
    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []
        self.first_audio = asyncio.Event()

    def text(self, delta: str) -> None:
        self.log.append(("text", delta))

    def clause(self, text: str) -> None:
        self.log.append(("clause", text))

    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None:
        self.log.append(("audio", (len(pcm), transcript)))
        if len(pcm):
            self.first_audio.set()

    def tool_started(self, call_id: str, name: str) -> None:
        self.log.append(("tool_started", name))

    def tool_delta(self, call_id: str, delta: str) -> None:
        self.log.append(("tool_delta", delta))

    def tool_finished(self, call_id: str, arguments: str) -> None:
        self.log.append(("tool_finished", arguments))

    def finished(self, finished: Finished) -> None:
        self.log.append(("finished", finished.reason))

    def failed(
        self, message: str, code: str = "engine_error", error_type: str = "server_error"
    ) -> None:
        # run_generation raises its failures to its caller, which tells the sink.
        raise AssertionError(f"run_generation told the sink of a failure: {message}")


def action(audio: bool = True) -> Generate:
    return Generate(
        response_id="resp_1",
        request=GenerationRequest(messages=()),
        audio=audio,
        voice="alloy",
        speed=1.0,
        output_rate=24000,
    )


async def test_first_audio_leaves_before_the_llm_finishes() -> None:
    sink = Sink()
    llm = ScriptedLlm(
        [
            TextDelta("Sure,"),
            TextDelta(" the capital is Paris."),
            TextDelta(" Anything else?"),
            Finished("stop"),
        ],
        gate=sink.first_audio,
    )
    await asyncio.wait_for(run_generation(action(), llm, FakeTts(24000), sink), 20)
    transcript = "".join(t for kind, v in sink.log if kind == "audio" for t in [v[1]])  # type: ignore[index]
    assert transcript == "Sure, the capital is Paris. Anything else?"
    assert sink.log[-1] == ("finished", "stop")
    assert sum(v[0] for kind, v in sink.log if kind == "audio") > 24000  # type: ignore[index]


async def test_text_only_passes_deltas_through() -> None:
    sink = Sink()
    llm = ScriptedLlm([TextDelta("Hello"), TextDelta(" there."), Finished("length")])
    await run_generation(action(audio=False), llm, FakeTts(24000), sink)
    assert sink.log == [("text", "Hello"), ("text", " there."), ("finished", "length")]


async def test_speech_before_a_tool_call_is_spoken_first() -> None:
    sink = Sink()
    llm = ScriptedLlm(
        [
            TextDelta("Let me check"),
            ToolCallStarted("call_1", "lookup"),
            ToolCallFinished("call_1", "{}"),
            Finished("tool_calls"),
        ]
    )
    await run_generation(action(), llm, FakeTts(24000), sink)
    kinds = [kind for kind, _ in sink.log]
    assert kinds.index("tool_started") > max(i for i, k in enumerate(kinds) if k == "audio")
    assert sink.log[:2] == [("text", "Let me check"), ("clause", "Let me check")]
    first_audio = next(value for kind, value in sink.log if kind == "audio")
    assert first_audio[1] == "Let me check"  # type: ignore[index]


async def test_tts_failure_propagates() -> None:
    class BrokenTts(FakeTts):
        async def synthesize(
            self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
        ):
            raise RuntimeError("voice model missing")
            yield np.zeros(0, np.int16)

    sink = Sink()
    llm = ScriptedLlm([TextDelta("Hello there."), Finished("stop")])
    try:
        await run_generation(action(), llm, BrokenTts(24000), sink)
    except RuntimeError as exc:
        assert "voice model missing" in str(exc)
    else:
        raise AssertionError("the TTS failure was swallowed")
    assert ("finished", "stop") not in sink.log


async def test_tts_is_told_how_much_audio_the_listener_has_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pipeline reads the listener's clock from the loop. Here that clock moves only when
    # the voice says so: each clause takes `render_s` to render, however fast the machine is.
    loop = asyncio.get_running_loop()
    clock = [loop.time()]
    monkeypatch.setattr(loop, "time", lambda: clock[0])
    render_s = 0.1

    class RecordingTts(FakeTts):
        def __init__(self) -> None:
            super().__init__(24000)
            self.slack: list[tuple[str, float]] = []

        async def synthesize(
            self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
        ) -> AsyncIterator[npt.NDArray[np.int16]]:
            self.slack.append((text, slack_s))
            async for chunk in super().synthesize(text, voice=voice, speed=speed):
                yield chunk
            clock[0] += render_s

    tts = RecordingTts()
    script: list[LlmEvent] = [
        TextDelta("Sure, "),
        TextDelta("the capital of France is Paris. "),
        TextDelta("It is on the Seine."),
        Finished("stop"),
    ]
    await run_generation(action(), ScriptedLlm(script), tts, Sink())
    assert [text for text, _ in tts.slack] == [
        "Sure,",
        "the capital of France is Paris.",
        "It is on the Seine.",
    ]
    # The first words are awaited in silence; each later clause has the audio before it
    # (the fake voice: 0.4 s a word) less what has played since the first audio, one render
    # per clause before it.
    (_, first), (_, second), (_, third) = tts.slack
    assert first == 0.0
    assert second == pytest.approx(0.4 - render_s)
    assert third == pytest.approx(0.4 + 6 * 0.4 - 2 * render_s)


class GatedTts(FakeTts):
    """Speaks nothing until ``gate`` opens; then fails if ``broken``."""

    def __init__(self, gate: asyncio.Event, broken: bool = False) -> None:
        super().__init__(24000)
        self.gate = gate
        self.broken = broken
        self.spoken: list[str] = []

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        await self.gate.wait()
        if self.broken:
            raise RuntimeError("voice model crashed")
        self.spoken.append(text)
        async for chunk in super().synthesize(text, voice=voice, speed=speed):
            yield chunk


class CountingLlm(ScriptedLlm):
    """Counts the events the pipeline has taken from it."""

    def __init__(self, script: list[LlmEvent]) -> None:
        super().__init__(script)
        self.taken = 0

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        for event in self.script:
            self.taken += 1
            yield event


def sentences(n: int) -> list[LlmEvent]:
    return [*(TextDelta(f"Sentence number {i}. ") for i in range(n)), Finished("stop")]


async def test_clauses_waiting_for_speech_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hark.driver.generation.MAX_CLAUSES_WAITING", 4)
    gate = asyncio.Event()
    tts = GatedTts(gate)
    llm = CountingLlm(sentences(20))
    run = asyncio.create_task(run_generation(action(), llm, tts, Sink()))
    for _ in range(50):
        await asyncio.sleep(0)
    # The speaker holds one clause and four wait; the LLM's stream waits behind them.
    assert llm.taken < 10
    gate.set()
    await asyncio.wait_for(run, 20)
    assert tts.spoken == [f"Sentence number {i}." for i in range(20)]


async def test_a_speaker_that_fails_while_the_queue_is_full_fails_the_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hark.driver.generation.MAX_CLAUSES_WAITING", 2)
    gate = asyncio.Event()
    run = asyncio.create_task(
        run_generation(action(), CountingLlm(sentences(10)), GatedTts(gate, broken=True), Sink())
    )
    for _ in range(50):
        await asyncio.sleep(0)
    gate.set()
    with pytest.raises(RuntimeError, match="voice model crashed"):
        await asyncio.wait_for(run, 20)

"""Engines that fail, as a session sees them (issue 16, point 12): a failing VAD is one
``error`` event, not silence, and the session goes on; a stalled engine fails only the
response (or transcription) waiting for it, naming the stage, and the next one succeeds.

Real session runners on the fake engines, with the real Silero VAD wrapped to fail on command
and engines that stall on command. The stage limits are set small; the tests wait for events,
never for a time.
"""

from __future__ import annotations

import asyncio
import json
import threading
from base64 import b64encode
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pydantic
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.asr import AudioToTranscribe, RecognitionRequest, TimedTranscript
from hark.engines.fake import FakeAsr, FakeLlm, FakeTts
from hark.engines.llm import GenerationRequest, LlmEvent, TextDelta
from hark.engines.registry import Engines, build_engines
from hark.engines.stage_timeouts import StageTimeouts
from hark.engines.vad.batcher import BatchedSileroVad
from hark.observability.metrics import Metrics

from .test_engine_failures import LIVENESS_S, FlakyVadModel

SDK_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
# Small, so that a stalled stage fails at once; the engines that do not stall answer in
# microseconds.
SHORT = StageTimeouts(llm_first_token=0.3, llm_token_gap=0.3, tts_clause=0.3, asr_request=0.3)


class Events:
    """A runner's server events, read as they come."""

    def __init__(self, runner: SessionRunner) -> None:
        self.all: list[dict[str, Any]] = []
        self._stream = runner.outgoing()

    async def until(self, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Read events up to the first for which ``done`` is true; return it."""
        async with asyncio.timeout(LIVENESS_S):
            async for text in self._stream:
                event = json.loads(text)
                self.all.append(event)
                if done(event):
                    return event
        raise AssertionError(f"the session ended; events: {[e['type'] for e in self.all]}")

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.all if event["type"] == kind]


def is_type(kind: str) -> Callable[[dict[str, Any]], bool]:
    return lambda event: bool(event["type"] == kind)


def send(runner: SessionRunner, event: dict[str, Any]) -> None:
    runner.receive_text(json.dumps(event))


def text_turn(runner: SessionRunner, text: str = "Hi") -> None:
    send(
        runner,
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            },
        },
    )
    send(runner, {"type": "response.create"})


def append(runner: SessionRunner, seconds: float, level: int = 0) -> None:
    """``seconds`` of 24 kHz audio at a constant ``level``."""
    audio = b64encode(np.full(int(24000 * seconds), level, "<i2").tobytes()).decode()
    send(runner, {"type": "input_audio_buffer.append", "audio": audio})


async def started(engines: Engines) -> tuple[SessionRunner, Events]:
    runner = SessionRunner(engines, model="m")
    await runner.start()
    events = Events(runner)
    await events.until(is_type("session.created"))
    return runner, events


def fake_engines(**parts: Any) -> Engines:
    engines = build_engines(Settings(engines="fake"))
    engines.timeouts = SHORT
    for name, engine in parts.items():
        setattr(engines, name, engine)
    return engines


async def test_a_failing_vad_is_one_error_event_and_the_session_goes_on() -> None:
    model = FlakyVadModel()
    vad = BatchedSileroVad(model=model)
    runner, events = await started(fake_engines(vad=vad))
    try:
        await vad.warmup()
        before = model.rows
        model.failing.set()
        # 31 chunks, each a failed batch of its own or with others.
        append(runner, 1.0)
        error = await events.until(is_type("error"))
        assert error["error"]["type"] == "server_error"
        assert error["error"]["code"] == "vad_failed"
        assert "RuntimeError: the model is broken" in error["error"]["message"]
        assert await asyncio.to_thread(model.wait_rows, before + 31)

        # The next input hands every miss to the session first; none is a second error.
        text_turn(runner)
        done = await events.until(is_type("response.done"))
        assert done["response"]["status"] == "completed"
        assert len(events.of_type("error")) == 1
        assert not events.of_type("input_audio_buffer.speech_stopped")

        # Working again, then failing again: the client is told again. The VAD's answers reach
        # the session in order, so it hears the good ones before the next failure.
        model.failing.clear()
        append(runner, 0.1)
        assert await asyncio.to_thread(model.wait_rows, before + 34)
        model.failing.set()
        append(runner, 0.1)
        await events.until(is_type("error"))
        assert len(events.of_type("error")) == 2
    finally:
        await runner.close()
        await vad.aclose()


class StallingLlm(FakeLlm):
    """The fake LLM, that stalls its next reply on command: before its first token, or after
    it (``stall``: ``"first"`` or ``"gap"``; it holds for one reply)."""

    def __init__(self) -> None:
        super().__init__()
        self.stall: str | None = None
        self.cancelled = 0

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        stall, self.stall = self.stall, None
        if stall == "gap":
            yield TextDelta("The")
        if stall is not None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        async for event in super().generate(request):
            yield event


async def test_a_stalled_llm_fails_that_response_naming_the_stage_and_the_next_succeeds() -> None:
    llm = StallingLlm()
    runner, events = await started(fake_engines(llm=llm))
    send(runner, {"type": "session.update", "session": {"output_modalities": ["text"]}})
    try:
        for stall, stage in (("first", "LLM first token"), ("gap", "LLM next token")):
            llm.stall = stall
            text_turn(runner)
            failed = await events.until(is_type("response.done"))
            assert failed["response"]["status"] == "failed"
            error = failed["response"]["status_details"]["error"]
            assert error["type"] == "server_error"
            assert error["message"].startswith(f"{stage} timed out")

            text_turn(runner)
            done = await events.until(is_type("response.done"))
            assert done["response"]["status"] == "completed"
        # The stalled generations were stopped, not left waiting.
        assert llm.cancelled == 2
    finally:
        await runner.close()


class StallingTts(FakeTts):
    """The fake TTS, whose next clause stalls on command."""

    def __init__(self) -> None:
        super().__init__()
        self.stall = False

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        if self.stall:
            self.stall = False
            await asyncio.Event().wait()
        async for chunk in super().synthesize(text, voice=voice, speed=speed, slack_s=slack_s):
            yield chunk


async def test_a_stalled_tts_fails_that_response_naming_the_stage_and_the_next_succeeds() -> None:
    tts = StallingTts()
    runner, events = await started(fake_engines(tts=tts))
    try:
        tts.stall = True
        text_turn(runner)
        failed = await events.until(is_type("response.done"))
        assert failed["response"]["status"] == "failed"
        message = failed["response"]["status_details"]["error"]["message"]
        assert message.startswith("TTS clause timed out")

        text_turn(runner)
        done = await events.until(is_type("response.done"))
        assert done["response"]["status"] == "completed"
        assert events.of_type("response.output_audio.delta")
    finally:
        await runner.close()


class StallingAsr(FakeAsr):
    """The fake ASR, that stalls every request while ``stall`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.stall = False

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        if self.stall:
            await asyncio.Event().wait()
        async for delta in super().transcribe(request):
            yield delta

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        if self.stall:
            await asyncio.Event().wait()
        return await super().recognise(request)


async def test_a_stalled_asr_fails_that_transcription_naming_the_stage_and_the_next_succeeds() -> (
    None
):
    asr = StallingAsr()
    runner, events = await started(fake_engines(asr=asr))
    send(
        runner,
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}
                }
            },
        },
    )
    try:
        asr.stall = True
        append(runner, 1.0, level=3000)
        send(runner, {"type": "input_audio_buffer.commit"})
        failed = await events.until(is_type("conversation.item.input_audio_transcription.failed"))
        assert failed["error"]["message"].startswith("ASR request timed out")
        # No null fields: the JS agents SDK's schema takes each as an optional string and
        # drops the event for a null (issue 28, point 8); the official SDK reads it.
        assert failed["error"] == {
            "type": "server_error",
            "code": "transcription_failed",
            "message": failed["error"]["message"],
        }
        SDK_EVENT.validate_python(failed)

        asr.stall = False
        append(runner, 1.0, level=3000)
        send(runner, {"type": "input_audio_buffer.commit"})
        completed = await events.until(
            is_type("conversation.item.input_audio_transcription.completed")
        )
        assert completed["transcript"] == "What is the capital of France?"
    finally:
        await runner.close()


async def test_chunks_the_vad_falls_too_far_behind_on_are_dropped_and_counted() -> None:
    model = FlakyVadModel()
    vad = BatchedSileroVad(model=model, max_queued=4)
    await vad.warmup()
    metrics = Metrics()
    runner = SessionRunner(fake_engines(vad=vad), model="m", metrics=metrics)
    await runner.start()
    events = Events(runner)
    try:
        await events.until(is_type("session.created"))
        before = model.rows
        model.gate = threading.Event()
        model.entered.clear()
        # One chunk (32 ms) that the model is stuck on; then 30 more, of which the stream
        # holds the newest 4 and drops the 26 older.
        append(runner, 0.032)
        assert await asyncio.to_thread(model.entered.wait, LIVENESS_S)
        append(runner, 30 * 0.032)
        model.gate.set()
        assert await asyncio.to_thread(model.wait_rows, before + 5)

        dropped = None
        for _ in range(100):
            # Each input hands the session the VAD's answers that are ready first.
            send(runner, {"type": "session.update", "session": {}})
            await events.until(is_type("session.updated"))
            dropped = metrics.registry.get_sample_value("hark_vad_chunks_dropped_total")
            if dropped == 26:
                break
        assert dropped == 26
        # A dropped chunk is load shed, not an engine failure: no error event.
        assert not events.of_type("error")
    finally:
        await runner.close()
        await vad.aclose()

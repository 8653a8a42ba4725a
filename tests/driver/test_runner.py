"""The async driver: engine work, cancellation and the end of a session."""

from __future__ import annotations

import asyncio
import json
import threading
from base64 import b64encode
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.asr import AudioToTranscribe, RecognitionRequest, TimedTranscript, Urgency
from hark.engines.asr.scheduler import AsrScheduler
from hark.engines.fake import FakeAsr
from hark.engines.registry import build_engines
from hark.engines.vad import Outcomes
from hark.session.actions import ScoreTurn
from hark.session.results import Result, TurnScoreFailed


async def test_expired_session_sends_the_error_then_ends() -> None:
    now = [1000.0]
    runner = SessionRunner(build_engines(Settings(engines="fake")), model="m", clock=lambda: now[0])
    await runner.start()
    now[0] += 3600
    runner.receive_text(json.dumps({"type": "session.update", "session": {}}))
    received = []

    async def drain() -> None:
        async for text in runner.outgoing():
            received.append(json.loads(text))

    await asyncio.wait_for(drain(), 10)
    assert [e["type"] for e in received] == ["session.created", "error"]
    assert received[1]["error"]["code"] == "session_expired"
    await runner.close()


async def test_text_turn_through_the_engines() -> None:
    runner = SessionRunner(build_engines(Settings(engines="fake")), model="m")
    await runner.start()
    for event in (
        {"type": "session.update", "session": {"output_modalities": ["text"]}},
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            },
        },
        {"type": "response.create"},
    ):
        runner.receive_text(json.dumps(event))
    texts = []

    async def until_done() -> None:
        async for text in runner.outgoing():
            event = json.loads(text)
            if event["type"] == "response.output_text.delta":
                texts.append(event["delta"])
            if event["type"] == "response.done":
                assert event["response"]["status"] == "completed"
                return

    await asyncio.wait_for(until_done(), 10)
    assert "".join(texts) == "The capital of France is Paris."
    await runner.close()


async def test_a_failed_turn_score_is_reported_to_the_core() -> None:
    engines = build_engines(Settings(engines="fake"))

    class BrokenVerdict:
        async def probability(self, transcript: str, *, context: str | None = None) -> float:
            raise RuntimeError("model gone")

        async def warmup(self) -> None:
            return None

    engines.turn = BrokenVerdict()
    runner = SessionRunner(engines, model="m")
    handed: list[Result] = []

    def handle(result: Result, *, now: float) -> None:
        handed.append(result)

    runner.session.handle = handle  # type: ignore[method-assign]
    await runner.start()
    await runner._work._score_turn(ScoreTurn("item_1#1", "What is", None), runner._call)
    assert handed == [TurnScoreFailed("item_1#1")]
    await runner.close()


class HeldVad:
    """A VAD whose answers (every chunk is speech) are ready at once but handed out only
    when a stream's ``deliver_ready`` is called: a loop too busy to run the engine's own
    wake-up."""

    chunk_ms = 32

    def __init__(self) -> None:
        self.ready: list[tuple[Callable[[Outcomes], None], Outcomes]] = []

    def open_stream(self, on_outcomes: Callable[[Outcomes], None]) -> HeldVad.Stream:
        return HeldVad.Stream(self, on_outcomes)

    async def warmup(self) -> None:
        return None

    class Stream:
        def __init__(self, vad: HeldVad, on_outcomes: Callable[[Outcomes], None]) -> None:
            self.vad, self.on_outcomes = vad, on_outcomes

        def push(self, chunk: npt.NDArray[np.int16] | npt.NDArray[np.float32], epoch: int) -> None:
            answers: Outcomes = [(1.0, epoch)] * (len(chunk) if chunk.ndim == 2 else 1)
            self.vad.ready.append((self.on_outcomes, answers))

        def deliver_ready(self) -> None:
            ready, self.vad.ready = self.vad.ready, []
            for on_outcomes, answers in ready:
                on_outcomes(answers)

        def close(self) -> None:
            pass


def take_queued(runner: SessionRunner) -> list[str]:
    """The types of the events waiting in the runner's outgoing queue, which is emptied."""
    queued = [runner._backlog._out.get_nowait() for _ in range(runner._backlog._out.qsize())]
    assert None not in queued, "the runner was told to stop"
    return [json.loads(text)["type"] for text in queued if text is not None]


def append(ms: int) -> str:
    audio = np.full(24 * ms, 3000, np.int16).tobytes()
    return json.dumps({"type": "input_audio_buffer.append", "audio": b64encode(audio).decode()})


async def test_ready_vad_results_go_before_the_next_input() -> None:
    engines = build_engines(Settings(engines="fake"))
    vad = engines.vad = HeldVad()
    speaker = SessionRunner(engines, model="m")
    other = SessionRunner(engines, model="m")
    for runner in (speaker, other):
        await runner.start()
    speaker.receive_text(append(200))
    # 200 ms of speech answered, but nothing handed out: no speech_started yet.
    assert sum(len(answers) for _, answers in vad.ready) == 6
    queued = take_queued(speaker)
    assert queued == ["session.created"]
    # Any session's next input hands out what is ready first, to whichever session it is.
    other.receive_text(append(20))
    assert not vad.ready
    queued = take_queued(speaker)
    assert queued == ["input_audio_buffer.speech_started"]
    for runner in (speaker, other):
        await runner.close()


async def test_events_go_to_the_sender_and_queue_behind_what_it_refused() -> None:
    runner = SessionRunner(build_engines(Settings(engines="fake")), model="m")
    await runner.start()
    sent: list[str] = []
    open_ = [True]

    def send(text: str) -> bool:
        if open_[0]:
            sent.append(json.loads(text)["type"])
        return open_[0]

    runner.send_with(send)
    update = json.dumps({"type": "session.update", "session": {}})
    # session.created was queued before the sender came: what follows waits behind it.
    runner.receive_text(update)
    assert sent == []
    queued = take_queued(runner)
    assert queued == ["session.created", "session.updated"]
    runner.receive_text(update)
    assert sent == ["session.updated"] and runner._backlog._out.empty()
    # Refused: that event and every later one queue, in order, until the queue is empty.
    open_[0] = False
    runner.receive_text(update)
    open_[0] = True
    runner.receive_text(json.dumps({"type": "input_audio_buffer.clear"}))
    assert sent == ["session.updated"]
    queued = take_queued(runner)
    assert queued == ["session.updated", "input_audio_buffer.cleared"]
    runner.receive_text(update)
    assert sent == ["session.updated", "session.updated"]
    await runner.close()


class RecordingPlayer:
    """An ``AudioPlayer`` that records what it is asked to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.finished = asyncio.Event()

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        self.calls.append(("play", response_id))

    def finish(self, response_id: str) -> None:
        self.calls.append(("finish", response_id))
        self.finished.set()

    def clear(self, response_id: str) -> None:
        self.calls.append(("clear", response_id))

    def hold(self, response_id: str) -> None:
        self.calls.append(("hold", response_id))

    def resume(self, response_id: str) -> None:
        self.calls.append(("resume", response_id))


async def test_the_player_is_told_when_a_response_has_no_more_audio() -> None:
    player = RecordingPlayer()
    runner = SessionRunner(build_engines(Settings(engines="fake")), model="m", player=player)
    await runner.start()
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    runner.receive_text(json.dumps({"type": "conversation.item.create", "item": item}))
    runner.receive_text(
        json.dumps({"type": "response.create", "response": {"conversation": "none"}})
    )
    await asyncio.wait_for(player.finished.wait(), 10)
    kinds = [kind for kind, _ in player.calls]
    assert kinds[-1] == "finish" and kinds.count("finish") == 1
    assert "play" in kinds and len({rid for _, rid in player.calls}) == 1
    await runner.close()


class HeldAsr(FakeAsr):
    """Recognition steps that wait until released, noting the ones cancelled."""

    def __init__(self) -> None:
        super().__init__("one two three")
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = 0

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await super().recognise(request)


def _manual_turn(runner: SessionRunner, seconds: float) -> None:
    runner.receive_text(
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "audio": {
                        "input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}
                    }
                },
            }
        )
    )
    chunk = b64encode(np.full(int(24000 * seconds), 3000, "<i2").tobytes()).decode()
    runner.receive_text(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))


async def test_a_cancelled_recognition_step_stops_in_the_engine() -> None:
    engines = build_engines(Settings(engines="fake"))
    asr = engines.asr = HeldAsr()
    runner = SessionRunner(engines, model="m")
    await runner.start()
    _manual_turn(runner, 1.0)
    await asyncio.wait_for(asr.started.wait(), 5)
    runner.receive_text(json.dumps({"type": "input_audio_buffer.clear"}))
    await asyncio.wait_for(runner.recognition_idle(), 5)
    assert asr.cancelled == 1
    await runner.close()


class HeldTranscription(FakeAsr):
    """Whole-item transcriptions that wait forever, noting the ones cancelled."""

    def __init__(self) -> None:
        super().__init__("one two three")
        self.started = asyncio.Event()
        self.cancelled = 0

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        yield ""


async def test_a_cancelled_responses_inline_audio_stops_being_transcribed() -> None:
    engines = build_engines(Settings(engines="fake"))
    asr = engines.asr = HeldTranscription()
    runner = SessionRunner(engines, model="m")
    await runner.start()
    chunk = b64encode(np.full(24000, 3000, "<i2").tobytes()).decode()
    item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": chunk}]}
    runner.receive_text(json.dumps({"type": "response.create", "response": {"input": [item]}}))
    await asyncio.wait_for(asr.started.wait(), 5)
    runner.receive_text(json.dumps({"type": "response.cancel"}))
    await asyncio.wait_for(runner.recognition_idle(), 5)
    assert asr.cancelled == 1
    await runner.close()


async def test_recognition_steps_run_in_the_engine_and_their_words_come_back() -> None:
    engines = build_engines(Settings(engines="fake"))
    asr = engines.asr = HeldAsr()
    asr.release.set()
    runner = SessionRunner(engines, model="m")
    await runner.start()
    _manual_turn(runner, 1.0)
    await asyncio.wait_for(runner.recognition_idle(), 5)
    runner.receive_text(json.dumps({"type": "input_audio_buffer.commit"}))
    events: list[dict[str, Any]] = []

    async def until_completed() -> None:
        async for text in runner.outgoing():
            events.append(json.loads(text))
            if events[-1]["type"].endswith("input_audio_transcription.completed"):
                return

    await asyncio.wait_for(until_completed(), 10)
    assert events[-1]["transcript"] == "one two three"
    assert asr.cancelled == 0
    await runner.close()


class ScheduledAsr(FakeAsr):
    """Recognition through a real ``AsrScheduler`` whose model waits at ``gate``, noting the
    requests the model was handed."""

    def __init__(self) -> None:
        super().__init__("one two three")
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.decoded: list[RecognitionRequest] = []
        self.asked = asyncio.Event()
        self.scheduler: AsrScheduler[RecognitionRequest, None] = AsrScheduler(self._batch)

    def _batch(self, requests: list[RecognitionRequest]) -> list[None]:
        self.entered.set()
        self.gate.wait()
        self.decoded.extend(requests)
        return [None] * len(requests)

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        # Set before queueing, which ``run`` does before it first yields.
        self.asked.set()
        await self.scheduler.run(request, request.urgency)
        return await super().recognise(request)


async def test_a_cleared_turn_frees_its_place_in_the_asr_scheduler() -> None:
    engines = build_engines(Settings(engines="fake"))
    asr = engines.asr = ScheduledAsr()
    runner = SessionRunner(engines, model="m")
    await runner.start()
    # Another session's answer holds the model, so this session's step waits its turn.
    other = RecognitionRequest(audio=np.zeros(16000, np.float32), urgency=Urgency.ANSWER)
    holding = asyncio.create_task(asr.scheduler.run(other, Urgency.ANSWER))
    await asyncio.wait_for(asyncio.to_thread(asr.entered.wait), 5)
    _manual_turn(runner, 1.0)
    await asyncio.wait_for(asr.asked.wait(), 5)
    assert asr.scheduler.waiting == 1

    runner.receive_text(json.dumps({"type": "input_audio_buffer.clear"}))
    await asyncio.wait_for(runner.recognition_idle(), 5)
    assert asr.scheduler.waiting == 0
    asr.gate.set()
    await asyncio.wait_for(holding, 5)
    assert asr.decoded == [other]

    # The scheduler is free for the next turn, whose words come back.
    _manual_turn(runner, 1.0)
    runner.receive_text(json.dumps({"type": "input_audio_buffer.commit"}))
    events: list[dict[str, Any]] = []

    async def until_completed() -> None:
        async for text in runner.outgoing():
            events.append(json.loads(text))
            if events[-1]["type"].endswith("input_audio_transcription.completed"):
                return

    await asyncio.wait_for(until_completed(), 10)
    assert events[-1]["transcript"] == "one two three"
    assert len(asr.decoded) > 1
    await runner.close()
    asr.scheduler.close()

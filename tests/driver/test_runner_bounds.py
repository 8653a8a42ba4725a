"""What the runner keeps per session stays bounded when an engine stops answering."""

from __future__ import annotations

import asyncio
import json
from base64 import b64encode
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.config import Settings
from hark.driver import engine_work
from hark.driver.runner import MAX_VAD_WAITING_RUNS, SessionRunner
from hark.engines.asr import RecognitionRequest, TimedTranscript
from hark.engines.fake import FakeAsr
from hark.engines.registry import build_engines
from hark.engines.vad import Outcomes
from hark.observability.session_metrics import SessionMetrics


class SilentVad:
    """A VAD that takes every chunk and answers none until the test answers them."""

    chunk_ms = 32

    def __init__(self) -> None:
        self.pushed: list[int] = []
        self.on_outcomes: Callable[[Outcomes], None] | None = None

    def open_stream(self, on_outcomes: Callable[[Outcomes], None]) -> SilentVad:
        self.on_outcomes = on_outcomes
        return self

    async def warmup(self) -> None:
        return None

    def push(self, chunk: npt.NDArray[np.int16] | npt.NDArray[np.float32], epoch: int) -> None:
        self.pushed += [epoch] * (len(chunk) if chunk.ndim == 2 else 1)

    def deliver_ready(self) -> None:
        return None

    def close(self) -> None:
        return None


async def test_a_vad_that_stops_answering_leaves_a_bounded_record_of_the_chunks_waiting() -> None:
    engines = build_engines(Settings(engines="fake"))
    vad = SilentVad()
    engines.vad = vad
    clock = [100.0]
    runner = SessionRunner(engines, model="m", monotonic=lambda: clock[0])
    arrivals: list[float] = []

    class ArrivalsRecorded(SessionMetrics):
        """Records the arrival each VAD answer is reported with."""

        def vad_chunk(self, arrived: float, now: float | None = None) -> None:
            arrivals.append(arrived)

    runner.metrics = ArrivalsRecorded(None, "none")
    await runner.start()
    # Two chunks an append, each append a second later than the last: one run each.
    audio = b64encode(np.full(2 * 768, 3000, "<i2").tobytes()).decode()
    appends = 3 * MAX_VAD_WAITING_RUNS
    for _ in range(appends):
        clock[0] += 1.0
        runner.receive_text(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    assert len(vad.pushed) == 2 * appends
    assert len(runner._vad_waiting) == MAX_VAD_WAITING_RUNS
    # The VAD answers at last: every answer takes its own chunk's place, in order, the ones
    # past the bound with the newest run's arrival, and none is left over or missing.
    assert vad.on_outcomes is not None
    for epoch in vad.pushed:
        vad.on_outcomes([(0.0, epoch)])
    assert len(runner._vad_waiting) == 0
    expected = [100.0 + i // 2 + 1 for i in range(2 * MAX_VAD_WAITING_RUNS)]
    assert arrivals[: len(expected)] == expected
    assert arrivals[len(expected) :] == [expected[-1]] * (len(arrivals) - len(expected))
    assert len(arrivals) == 2 * appends
    await runner.close()
    await engines.aclose()


class HeldAsr(FakeAsr):
    """Recognises only once the test lets it, counting the requests it took."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.taken = 0

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        self.taken += 1
        await self.release.wait()
        return await super().recognise(request)


async def test_audio_waiting_for_transcription_is_bounded_per_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_work, "MAX_TRANSCRIBING_S", 3.0)
    engines = build_engines(Settings(engines="fake"))
    asr = HeldAsr()
    engines.asr = asr
    runner = SessionRunner(engines, model="m")
    runner.send_with(None)
    await runner.start()
    input_config = {"turn_detection": None, "transcription": {"model": "whisper-1"}}
    runner.receive_text(
        json.dumps({"type": "session.update", "session": {"audio": {"input": input_config}}})
    )
    audio = b64encode(np.full(int(24000 * 1.2), 3000, "<i2").tobytes()).decode()

    def commit() -> None:
        runner.receive_text(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        runner.receive_text(json.dumps({"type": "input_audio_buffer.commit"}))

    events: list[dict[str, Any]] = []

    async def until(event_type: str) -> dict[str, Any]:
        async for text in runner.outgoing():
            event = json.loads(text)
            events.append(event)
            if event["type"] == event_type:
                return event
        raise AssertionError(f"no {event_type}")

    # 1.2 s and 2.4 s wait for the ASR; 3.6 s would pass the bound.
    for _ in range(3):
        commit()
    failed = await asyncio.wait_for(until("conversation.item.input_audio_transcription.failed"), 10)
    committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    assert failed["item_id"] == committed[2]
    assert "waits for transcription" in failed["error"]["message"]
    assert asr.taken == 2
    # An item the client creates with audio is heard whole, within the same bound.
    part = {"type": "input_audio", "audio": audio}
    item = {"type": "message", "role": "user", "content": [part]}
    runner.receive_text(json.dumps({"type": "conversation.item.create", "item": item}))
    created = await asyncio.wait_for(until("conversation.item.added"), 10)
    failed = await asyncio.wait_for(until("conversation.item.input_audio_transcription.failed"), 10)
    assert failed["item_id"] == created["item"]["id"]
    assert asr.taken == 2
    # Once the ASR answers, the room is back.
    asr.release.set()
    for _ in range(2):
        await asyncio.wait_for(until("conversation.item.input_audio_transcription.completed"), 10)
    assert asr.taken == 2
    commit()
    done = await asyncio.wait_for(
        until("conversation.item.input_audio_transcription.completed"), 10
    )
    assert done["item_id"] not in committed
    assert asr.taken == 3
    await runner.close()
    await engines.aclose()

"""A closed session is freed by reference counting, its conversation audio at once.

hark tunes the cycle collector to run rarely (a full collection pauses every session on the
loop), so a session whose parts refer to each other in a cycle would hold its conversation
audio, megabytes per turn, until the next full collection. With the collector off, closing a
runner must free its core, conversation and audio all the same.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from base64 import b64encode
from typing import Any

import numpy as np
import pytest

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.asr import RecognitionRequest, TimedTranscript
from hark.engines.fake import FakeAsr
from hark.engines.registry import build_engines


def _send(runner: SessionRunner, event: dict[str, object]) -> None:
    runner.receive_text(json.dumps(event))


async def _spoken_turn(runner: SessionRunner) -> None:
    """A manual turn of one second of audio answered in audio, to its ``response.done``."""
    _send(
        runner,
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}},
    )
    pcm = (np.sin(np.arange(24_000) / 5) * 8000).astype("<i2")
    _send(runner, {"type": "input_audio_buffer.append", "audio": b64encode(pcm.tobytes()).decode()})
    _send(runner, {"type": "input_audio_buffer.commit"})
    _send(runner, {"type": "response.create"})
    async for text in runner.outgoing():
        event = json.loads(text)
        if event["type"] == "response.done":
            assert event["response"]["status"] == "completed"
            return


@pytest.mark.usefixtures("no_cycle_collector")
async def test_closing_a_runner_frees_its_session_and_audio_without_the_cycle_collector() -> None:
    engines = build_engines(Settings(engines="fake"))
    try:
        runner = SessionRunner(engines, model="m")
        await runner.start()
        await asyncio.wait_for(_spoken_turn(runner), 30)
        audio = [
            part.audio
            for entry in runner.session.conversation.entries()
            for part in entry.parts
            if part.audio is not None
        ]
        # The user's audio and the reply's.
        assert len(audio) == 2
        alive: list[weakref.ref[Any]] = [
            weakref.ref(runner.session),
            weakref.ref(runner.session.conversation),
        ]
        alive += [weakref.ref(pcm) for pcm in audio]
        del audio
        await runner.close()
        del runner
        # Let the cancelled and finished tasks' callbacks run.
        for _ in range(3):
            await asyncio.sleep(0)
        assert [ref() is None for ref in alive] == [True] * len(alive)
    finally:
        await engines.aclose()


class HeldAsr(FakeAsr):
    """Recognition that never answers: the session closes while it waits."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        self.waiting.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")


@pytest.mark.usefixtures("no_cycle_collector")
async def test_a_runner_closed_amid_engine_work_is_freed_without_the_cycle_collector() -> None:
    engines = build_engines(Settings(engines="fake"))
    asr = engines.asr = HeldAsr()
    try:
        runner = SessionRunner(engines, model="m")
        await runner.start()
        transcription = {"model": "whisper-1"}
        input_config = {"turn_detection": None, "transcription": transcription}
        _send(runner, {"type": "session.update", "session": {"audio": {"input": input_config}}})
        pcm = np.full(24_000, 3000, "<i2")
        _send(
            runner,
            {"type": "input_audio_buffer.append", "audio": b64encode(pcm.tobytes()).decode()},
        )
        _send(runner, {"type": "input_audio_buffer.commit"})
        # A response waits for the words, and the recognition for the ASR, when it closes.
        _send(runner, {"type": "response.create"})
        await asyncio.wait_for(asr.waiting.wait(), 10)
        alive: list[weakref.ref[Any]] = [weakref.ref(runner), weakref.ref(runner.session)]
        await runner.close()
        del runner
        for _ in range(3):
            await asyncio.sleep(0)
        assert [ref() is None for ref in alive] == [True, True]
    finally:
        await engines.aclose()

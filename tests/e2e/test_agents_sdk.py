"""End to end: the `openai-agents` SDK's realtime runner holds a spoken conversation with
`hark serve`, without one `error` event.

The runner connects with ``?model=`` and then updates the session with its own defaults
(model ``gpt-realtime-2.1`` among them); every raw server event it hands over is recorded
and checked. Two spoken turns run on the embedded models (Silero, Whisper, SmolLM2, Piper);
the tool turn runs on the fake engines, whose LLM calls the tool it is made to call, as the
small model cannot be made to choose one reliably.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from agents import function_tool
from agents.realtime import (
    RealtimeAgent,
    RealtimeInputAudioTranscriptionConfig,
    RealtimeRunConfig,
    RealtimeRunner,
    RealtimeSession,
    RealtimeSessionModelSettings,
)
from agents.realtime.model_inputs import RealtimeModelSendRawMessage

from .conftest import API_KEY, Server, fake_hark, speech, words

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

RATE = 24000
CHUNK = RATE // 50


@pytest.fixture(scope="module")
def fake_server() -> Iterator[Server]:
    """`hark serve --engines fake`: a real server and VAD, scripted ASR, LLM and TTS."""
    with fake_hark("e2e-agents-fake-server.log") as server:
        yield server


class Recorder:
    """Reads a session's events in the background: every one, and the raw server events apart;
    ``wait_for`` returns once a server event of a type has come (after a mark)."""

    def __init__(self, session: RealtimeSession) -> None:
        self.events: list[Any] = []
        self.raw: list[dict[str, Any]] = []
        self._arrived = asyncio.Condition()
        self._task = asyncio.create_task(self._read(session))

    async def _read(self, session: RealtimeSession) -> None:
        async for event in session:
            async with self._arrived:
                self.events.append(event)
                if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                    self.raw.append(event.data.data)
                self._arrived.notify_all()

    def mark(self) -> int:
        """Where the server events received so far end."""
        return len(self.raw)

    async def wait_for(
        self, kind: str, after: int, limit_s: float = 180, item_id: str | None = None
    ) -> dict[str, Any]:
        """The first server event of type ``kind`` after ``after`` (of item ``item_id``, when
        given); an ``error`` event before it fails the test at once."""
        async with asyncio.timeout(limit_s), self._arrived:
            while True:
                found = [
                    e
                    for e in self.raw[after:]
                    if e.get("type") == "error"
                    or (e.get("type") == kind and item_id in (None, e.get("item_id")))
                ]
                if found:
                    assert found[0]["type"] == kind, found[0]
                    return found[0]
                if self._task.done():
                    raise AssertionError(f"the session ended before {kind}")
                await self._arrived.wait()

    def of_type(self, kind: str, after: int = 0) -> list[dict[str, Any]]:
        """The server events of type ``kind`` after ``after``."""
        return [e for e in self.raw[after:] if e.get("type") == kind]

    def errors(self) -> list[Any]:
        """Every error the SDK reported: server ``error`` events, events it could not read,
        and its own error and exception events."""
        found: list[Any] = [e for e in self.raw if e.get("type") == "error"]
        found += [e for e in self.events if e.type == "error"]
        found += [
            e.data
            for e in self.events
            if e.type == "raw_model_event" and e.data.type in ("error", "exception")
        ]
        return found

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class Microphone:
    """Streams silence in real time through the session, as a live microphone would, and
    speech on demand."""

    def __init__(self, session: RealtimeSession) -> None:
        self._session = session
        self._queue: asyncio.Queue[npt.NDArray[np.int16]] = asyncio.Queue(maxsize=4)
        self._task = asyncio.create_task(self._run())

    def say(self, pcm: npt.NDArray[np.int16]) -> None:
        self._queue.put_nowait(pcm)

    async def _run(self) -> None:
        start = time.monotonic()
        sent = 0
        silence = np.zeros(CHUNK, np.int16)
        while True:
            pcm = self._queue.get_nowait() if not self._queue.empty() else silence
            for i in range(0, len(pcm), CHUNK):
                await self._session.send_audio(pcm[i : i + CHUNK].astype("<i2").tobytes())
                sent += 1
                delay = start + sent * 0.02 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@contextlib.asynccontextmanager
async def conversation(
    server: Server, agent: RealtimeAgent, settings: RealtimeSessionModelSettings
) -> AsyncIterator[tuple[RealtimeSession, Recorder, Microphone]]:
    """The runner's session against ``server``, with its events recorded and a microphone."""
    runner = RealtimeRunner(starting_agent=agent, config=RealtimeRunConfig(model_settings=settings))
    session = await runner.run(
        model_config={"url": f"{server.ws}/realtime?model=gpt-realtime", "api_key": API_KEY}
    )
    async with session:
        recorder = Recorder(session)
        microphone = Microphone(session)
        try:
            yield session, recorder, microphone
        finally:
            await microphone.close()
            await recorder.close()


async def spoken_turn(
    recorder: Recorder, microphone: Microphone, question: str
) -> tuple[str, dict[str, Any]]:
    """Say ``question``; returns what the server heard and the turn's ``response.done``."""
    mark = recorder.mark()
    microphone.say(await speech(question))
    committed = await recorder.wait_for("input_audio_buffer.committed", mark)
    done = await recorder.wait_for("response.done", mark)
    # Transcription runs beside the response, as OpenAI's does: its event may come after.
    completed = "conversation.item.input_audio_transcription.completed"
    heard = await recorder.wait_for(completed, mark, item_id=committed["item_id"])
    return heard["transcript"], done


TRANSCRIPTION = RealtimeInputAudioTranscriptionConfig(model="gpt-4o-mini-transcribe")


async def test_the_runner_holds_a_spoken_conversation(server: Server) -> None:
    agent = RealtimeAgent(name="Assistant", instructions="Answer in one short sentence.")
    async with conversation(
        server, agent, RealtimeSessionModelSettings(input_audio_transcription=TRANSCRIPTION)
    ) as (_, recorder, microphone):
        # The SDK's own session.update: its default model name is taken and echoed.
        updated = await recorder.wait_for("session.updated", 0)
        assert updated["session"]["model"] == "gpt-realtime-2.1"
        for question, expected in (
            ("What is the capital of France?", {"capital", "france"}),
            ("How many days are in a week?", {"days", "week"}),
        ):
            mark, seen = recorder.mark(), len(recorder.events)
            heard, done = await spoken_turn(recorder, microphone, question)
            assert expected <= set(words(heard))
            assert done["response"]["status"] == "completed"
            (transcript,) = recorder.of_type("response.output_audio_transcript.done", mark)
            assert transcript["transcript"].strip()
            # The SDK played the reply's audio: it handed it over as audio events.
            audio = [e for e in recorder.events[seen:] if e.type == "audio"]
            assert audio and sum(len(e.audio.data) for e in audio) > RATE // 2
        # The SDK's history holds both turns: two user items and two assistant replies.
        history = [e for e in recorder.events if e.type == "history_updated"][-1].history
        roles = [item.role for item in history if item.type == "message"]
        assert roles.count("user") == 2 and roles.count("assistant") >= 2
    assert recorder.errors() == []


async def test_the_runner_calls_an_agent_tool(fake_server: Server) -> None:
    calls: list[str] = []
    holder: dict[str, RealtimeSession] = {}

    @function_tool
    async def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        # One call is enough: from here on the model may answer as it likes.
        await holder["session"].model.send_event(
            RealtimeModelSendRawMessage(
                message={
                    "type": "session.update",
                    "other_data": {"session": {"type": "realtime", "tool_choice": "auto"}},
                }
            )
        )
        return f"It is sunny in {city}."

    agent = RealtimeAgent(name="Assistant", instructions="Use the tools.", tools=[get_weather])
    settings = RealtimeSessionModelSettings(
        input_audio_transcription=TRANSCRIPTION, tool_choice="required"
    )
    async with conversation(fake_server, agent, settings) as (session, recorder, microphone):
        holder["session"] = session
        await recorder.wait_for("session.updated", 0)
        mark = recorder.mark()
        microphone.say(await speech("What is the capital of France?"))
        call = await recorder.wait_for("response.function_call_arguments.done", mark)
        assert call["name"] == "get_weather"
        # The SDK ran the tool and sent its output; the answer is the response after it.
        first = await recorder.wait_for("response.done", mark)
        answer = await recorder.wait_for("response.done", recorder.raw.index(first) + 1)
        assert answer["response"]["status"] == "completed"
        assert [o["type"] for o in answer["response"]["output"]] == ["message"]
        outputs = [
            e
            for e in recorder.of_type("conversation.item.added", mark)
            if e["item"]["type"] == "function_call_output"
        ]
        assert [o["item"]["call_id"] for o in outputs] == [call["call_id"]]
        assert "sunny" in outputs[0]["item"]["output"]
        assert [e.type for e in recorder.events].count("tool_end") == 1
    assert len(calls) == 1
    assert recorder.errors() == []

"""Backchannels over a real WebRTC call with the embedded models: Silero hears the listener,
Whisper tiny.en says what they said, Piper speaks the reply (the fake LLM's long one, so that
its length is known). A spoken "uh-huh" or "yeah" over the reply leaves it completed and
untruncated; a spoken "wait, stop" cuts it. With backchannels off, the "uh-huh" cuts the reply
too (which shows that the first test can fail)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from hark.bench.echo import EchoCallClient, Room, Trial, reply_trial
from hark.bench.spoken_questions import RATE as SPEECH_RATE
from hark.config import Settings
from hark.engines.fake import FakeLlm
from tests.conftest import engines_sharing_turn
from tests.speech import spoken
from tests.transports.conftest import API_KEY, LONG_REPLY, StartRtcServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]


def session(backchannels: bool) -> dict[str, Any]:
    return {
        "type": "realtime",
        "include": ["hark.backchannels"],
        "audio": {
            "input": {
                "turn_detection": {
                    "type": "semantic_vad",
                    "create_response": False,
                    "hark_backchannels": backchannels,
                }
            }
        },
    }


@pytest.fixture
async def call(http: aiohttp.ClientSession, start_rtc_server: StartRtcServer) -> AsyncIterator[Any]:
    """A factory of calls to a server on the embedded VAD, ASR and TTS (no echo)."""
    made: list[RecordingCall] = []
    settings = Settings(engines="fake", asr="whisper", tts="piper")
    engines = dataclasses.replace(engines_sharing_turn(settings), llm=FakeLlm(LONG_REPLY))
    # Loaded before the server starts: its readiness wait is shorter than loading Whisper
    # and Piper takes on a busy machine.
    await engines.asr.warmup()
    await engines.tts.warmup()
    server = await start_rtc_server(engines, asr="whisper", tts="piper", echo_cancellation="off")

    async def make(backchannels: bool = True) -> RecordingCall:
        client = RecordingCall()
        made.append(client)
        await client.connect(http, server.url, api_key=API_KEY, session=session(backchannels))
        await client.next_event("session.created")
        await asyncio.wait_for(client.opened.wait(), 30)
        return client

    yield make
    await asyncio.gather(*(c.close() for c in made), return_exceptions=True)


class RecordingCall(EchoCallClient):
    """A call that keeps the type of every event it received."""

    def __init__(self) -> None:
        super().__init__(Room(50, -120.0))
        self.seen: list[str] = []

    def _on_message(self, message: str | bytes) -> None:
        super()._on_message(message)
        self.seen.append(json.loads(message)["type"])


async def said_over_a_reply(client: RecordingCall, text: str) -> tuple[Trial, list[str]]:
    """``text`` said half a second into a reply; the trial and the events it brought."""
    client.seen.clear()
    trial = await reply_trial(client, spoken(text, SPEECH_RATE), client.room)
    return trial, list(client.seen)


@pytest.mark.parametrize("text", ["Uh-huh.", "Yeah."])
async def test_a_backchannel_leaves_the_reply_completed_and_untruncated(
    call: Any, text: str
) -> None:
    client = await call()
    trial, types = await said_over_a_reply(client, text)
    assert "hark.backchannel" in types
    assert "input_audio_buffer.speech_started" not in types
    assert trial.status == "completed"
    assert not trial.cut
    assert "conversation.item.truncated" not in types
    assert types.count("output_audio_buffer.stopped") == 1


async def test_wait_stop_cuts_the_reply(call: Any) -> None:
    client = await call()
    trial, types = await said_over_a_reply(client, "Wait, stop please.")
    assert trial.detected_ms is not None
    assert trial.cut
    assert "conversation.item.truncated" in types
    assert "hark.backchannel" not in types


async def test_with_backchannels_off_an_uh_huh_cuts_the_reply(call: Any) -> None:
    client = await call(backchannels=False)
    trial, types = await said_over_a_reply(client, "Uh-huh.")
    assert trial.cut
    assert "input_audio_buffer.speech_started" in types

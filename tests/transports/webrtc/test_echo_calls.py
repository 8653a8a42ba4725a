"""Echo over a real WebRTC call: the caller's microphone hears the reply again through a room
(``hark.bench.echo.Room``: 150 ms later, 6 dB quieter, a decaying tail), Piper's voice
speaking the replies and Silero listening. With echo cancellation the reply plays out whole
while a real "wait, stop" over its echo still cuts it; without, the echo cuts the reply (which
shows that the first test can fail)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from hark.bench.echo import BARGE_IN, SESSION, EchoCallClient, Room, reply_trial
from hark.bench.spoken_questions import RATE as SPEECH_RATE
from tests.speech import spoken
from tests.transports.conftest import API_KEY, StartRtcServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

DELAY_MS = 150
GAIN_DB = -6.0


@pytest.fixture
async def echo_clients() -> AsyncIterator[list[EchoCallClient]]:
    """The calls a test made, hung up at its end."""
    made: list[EchoCallClient] = []
    yield made
    await asyncio.gather(*(c.close() for c in made), return_exceptions=True)


async def echo_call(
    http: aiohttp.ClientSession,
    start: StartRtcServer,
    made: list[EchoCallClient],
    *,
    echo_cancellation: bool,
) -> EchoCallClient:
    server = await start(tts="piper", echo_cancellation="on" if echo_cancellation else "off")
    client = EchoCallClient(Room(DELAY_MS, GAIN_DB))
    made.append(client)
    await client.connect(http, server.url, api_key=API_KEY, session=SESSION)
    await client.next_event("session.created")
    return client


async def first_reply(client: EchoCallClient) -> None:
    """A call's first reply, whatever happens to it: AEC3 finds the echo's delay and path
    during the first second or so of echo it hears, and a loud echo may get through then
    (docs/echo.md, Limits)."""
    await reply_trial(client, None, client.room)


async def test_an_echoed_reply_does_not_cut_itself(
    http: aiohttp.ClientSession,
    start_rtc_server: StartRtcServer,
    echo_clients: list[EchoCallClient],
) -> None:
    client = await echo_call(http, start_rtc_server, echo_clients, echo_cancellation=True)
    await first_reply(client)
    for _ in range(2):
        trial = await reply_trial(client, None, client.room)
        assert trial.status == "completed"
        assert not trial.cut
        assert not trial.self_interrupted


async def test_a_real_barge_in_over_the_echo_still_cuts_the_reply(
    http: aiohttp.ClientSession,
    start_rtc_server: StartRtcServer,
    echo_clients: list[EchoCallClient],
) -> None:
    client = await echo_call(http, start_rtc_server, echo_clients, echo_cancellation=True)
    await first_reply(client)
    trial = await reply_trial(client, spoken(BARGE_IN, SPEECH_RATE), client.room)
    assert not trial.self_interrupted
    assert trial.detected_ms is not None
    # The fake LLM is done at once: the reply's playout is what the barge-in cuts.
    assert trial.cut


async def test_without_echo_cancellation_the_echo_cuts_the_reply(
    http: aiohttp.ClientSession,
    start_rtc_server: StartRtcServer,
    echo_clients: list[EchoCallClient],
) -> None:
    client = await echo_call(http, start_rtc_server, echo_clients, echo_cancellation=False)
    trial = await reply_trial(client, None, client.room)
    assert trial.self_interrupted
    assert trial.cut

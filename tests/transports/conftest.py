"""A server with WebRTC on an ephemeral UDP port, aiortc clients that call it, and a listener
that records playout progress."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from hark.bench.webrtc import AUDIBLE_RMS, CallClient, ReceivedFrame
from hark.config import Settings
from hark.engines.fake import FakeLlm
from hark.engines.registry import Engines
from hark.server.app import CALLS
from hark.transports.webrtc.calls import Calls
from hark.transports.webrtc.playout import FRAME_SAMPLES
from tests.conftest import engines_sharing_turn
from tests.server.conftest import RunningServer, serving, wait_ready

API_KEY = "sk-test-webrtc-owner-0123456789"
OTHER_KEY = "sk-test-webrtc-stranger-987654"
# FakeLlm's reply five times over: 12 s of FakeTts speech (0.4 s a word), so that a cut made
# once 600 ms of it has been heard lands inside it however long a busy machine takes.
LONG_REPLY = " ".join(["The capital of France is Paris."] * 5)
# A second of the track: after a reply cut short, a second of silence shows that it did not
# go on, and a reply is told from the next by a gap at least this long.
REPLY_GAP_FRAMES = 50


class Listener:
    """Records playout progress."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str] | tuple[str, str, int]] = []

    def playout_started(self, response_id: str) -> None:
        self.log.append(("started", response_id))

    def playout_stopped(self, response_id: str) -> None:
        self.log.append(("stopped", response_id))

    def playout_cleared(self, response_id: str, played_ms: int) -> None:
        self.log.append(("cleared", response_id, played_ms))


class RtcServer(RunningServer):
    """A started app with WebRTC, and where to reach it."""

    @property
    def calls(self) -> Calls:
        """The server's call registry."""
        return self.app[CALLS]


StartRtcServer = Callable[..., Awaitable[RtcServer]]


@contextlib.asynccontextmanager
async def serving_rtc() -> AsyncIterator[StartRtcServer]:
    """What ``start_rtc_server`` yields: ``serving``'s servers, with WebRTC and warm engines."""
    async with serving() as serve:

        async def start(built: Engines | None = None, **settings: Any) -> RtcServer:
            options: dict[str, Any] = {
                "engines": "fake",
                "rtc_port": 0,
                "api_keys": (API_KEY, OTHER_KEY),
            }
            options.update(settings)
            config = Settings(**options)
            started = await serve(config, built or engines_sharing_turn(config))
            server = RtcServer(app=started.app, url=started.url)
            async with aiohttp.ClientSession() as http:
                await wait_ready(http, server)
            return server

        yield start


@pytest.fixture
async def start_rtc_server() -> AsyncIterator[StartRtcServer]:
    """A factory: ``create_app`` on 127.0.0.1 (HTTP and UDP on free ports), engines warm."""
    async with serving_rtc() as start:
        yield start


@pytest.fixture
async def rtc_server(start_rtc_server: StartRtcServer) -> RtcServer:
    """A server on the fake engines (real VAD) with two API keys."""
    return await start_rtc_server()


@pytest.fixture
async def long_reply_server(start_rtc_server: StartRtcServer) -> RtcServer:
    """``rtc_server``, with a fake LLM that says ``LONG_REPLY``."""
    engines = engines_sharing_turn(Settings(engines="fake"))
    return await start_rtc_server(dataclasses.replace(engines, llm=FakeLlm(LONG_REPLY)))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., CallClient]]:
    """A factory of call clients, all closed at the end."""
    made: list[CallClient] = []

    def make(**kwargs: Any) -> CallClient:
        client = CallClient(**kwargs)
        made.append(client)
        return client

    yield make
    await asyncio.gather(*(c.close() for c in made), return_exceptions=True)


def bearer(key: str) -> dict[str, str]:
    """An Authorization header."""
    return {"Authorization": f"Bearer {key}"}


async def until(predicate: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Wait until ``predicate()`` holds (polling), or fail."""
    async with asyncio.timeout(limit_s):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.02)


async def collect(client: CallClient, last: str, limit_s: float = 30) -> list[dict[str, Any]]:
    """A call's events up to and including the next one of type ``last``."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(limit_s):
        while not events or events[-1]["type"] != last:
            events.append(await client.events.get())
    return events


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The events of one type."""
    return [e for e in events if e["type"] == kind]


def first_reply(frames: list[ReceivedFrame]) -> list[ReceivedFrame]:
    """The audible frames of the first reply on the track: in timestamp order, up to the first
    second of the track's clock without any.

    What a reply cut short sent is how many frames it filled, not the span of their
    timestamps: a stall of the server's loop skips frames, and their timestamps with them (a
    frame's timestamp is its time on the track's clock), so a busy machine made the span of
    a 3520 ms reply read 3740 ms. And the reply is told from the next one by the track's
    clock, not by when the next one's ``output_audio_buffer.started`` came over the data
    channel: a busy client reads its media and its data channel each at its own pace.
    """
    heard = sorted((f for f in frames if f.rms > AUDIBLE_RMS), key=lambda f: f.pts)
    reply = heard[:1]
    for frame in heard[1:]:
        if frame.pts - reply[-1].pts > REPLY_GAP_FRAMES * FRAME_SAMPLES:
            break
        reply.append(frame)
    return reply


def track_past(frames: list[ReceivedFrame], reply: list[ReceivedFrame]) -> bool:
    """The client has the track up to a second past the end of ``reply``."""
    return bool(reply) and frames[-1].pts > reply[-1].pts + REPLY_GAP_FRAMES * FRAME_SAMPLES

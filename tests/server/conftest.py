"""Start the real app on an ephemeral loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hark.config import Settings
from hark.engines.fake import FakeAsr, FakeLlm, FakeTts
from hark.engines.llm import Finished, GenerationRequest, LlmEvent
from hark.engines.registry import Engines
from hark.engines.vad.batcher import BatchedSileroVad
from hark.server.app import create_app, make_runner
from tests.conftest import engines_sharing_turn, shared_end_of_turn

# test_append_limit.py still imports bearer from here; new tests import it from tests.helpers.
from tests.helpers.net import bearer as bearer

API_KEY = "sk-test-correct-horse-battery-staple"
OTHER_KEY = "sk-test-second-key-0123456789"


@dataclass
class RunningServer:
    """A started app and where to reach it."""

    app: web.Application
    url: str

    @property
    def ws_url(self) -> str:
        """The Realtime WebSocket endpoint."""
        return self.url.replace("http://", "ws://") + "/v1/realtime"


StartServer = Callable[..., Awaitable[RunningServer]]


class GatedVad(BatchedSileroVad):
    """The real VAD, whose warm-up waits for ``gate`` (then raises ``error`` if given)."""

    def __init__(self, gate: asyncio.Event, error: Exception | None = None) -> None:
        super().__init__()
        self.gate = gate
        self.error = error

    async def warmup(self) -> None:
        """Wait until the test opens the gate."""
        await self.gate.wait()
        if self.error is not None:
            raise self.error


def gated_engines(gate: asyncio.Event, error: Exception | None = None) -> Engines:
    """Fake engines that are ready only once ``gate`` is set."""
    return Engines(
        vad=GatedVad(gate, error),
        asr=FakeAsr(),
        llm=FakeLlm(),
        tts=FakeTts(),
        turn=shared_end_of_turn(),
    )


@pytest.fixture
async def fake_engines() -> AsyncIterator[Engines]:
    """``--engines fake``: the real Silero VAD with fake ASR, LLM and TTS; closed afterwards."""
    engines = engines_sharing_turn(Settings(engines="fake"))
    yield engines
    await engines.aclose()


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[StartServer]:
    """What ``start_server`` yields: on leaving, every app is stopped and its engines closed."""
    runners: list[web.AppRunner] = []
    engine_sets: list[Engines] = []

    async def start(settings: Settings, engines: Engines, **options: Any) -> RunningServer:
        if settings.rtc_port == Settings().rtc_port:
            # A free UDP port: test runs side by side must not fight over the default.
            settings = dataclasses.replace(settings, rtc_port=0)
        if settings.sip_port == Settings().sip_port:
            settings = dataclasses.replace(settings, sip_port=0)
        engine_sets.append(engines)
        app = create_app(settings, engines, **options)
        runner = make_runner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return RunningServer(app=app, url=f"http://{host}:{port}")

    try:
        yield start
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        # The engines hold threads (the VAD batcher, the end-of-turn worker).
        for engines in engine_sets:
            await engines.aclose()


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """A factory starting ``create_app(settings, engines, **options)`` on 127.0.0.1, port 0."""
    async with serving() as start:
        yield start


async def wait_ready(http: aiohttp.ClientSession, server: RunningServer) -> None:
    """Poll /readyz until the engines are warm."""
    for _ in range(600):
        async with http.get(server.url + "/readyz") as response:
            if response.status == 200:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("the server never became ready")


class HangingLlm:
    """An LLM that starts a reply and never finishes it, recording its cancellation."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        """Wait until cancelled."""
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        yield Finished(reason="stop")  # unreachable; makes this an async generator

    async def prefill(self, request: GenerationRequest) -> None:
        """Nothing to read ahead."""

    async def warmup(self) -> None:
        """Nothing to load."""

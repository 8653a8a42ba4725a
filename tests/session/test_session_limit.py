"""The runner's session limit: set per runner, and kept when the wall clock is stepped back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.registry import Engines, build_engines
from hark.protocol import server_events as se
from hark.protocol.limits import SESSION_LIMIT_S
from hark.session.actions import Close
from hark.session.core import Session


@pytest.fixture
async def engines() -> AsyncIterator[Engines]:
    built = build_engines(Settings(engines="fake"))
    yield built
    await built.aclose()


async def all_events(runner: SessionRunner) -> list[dict[str, Any]]:
    """Every event of the session, once it has ended by itself."""
    async with asyncio.timeout(30):
        return [json.loads(text) async for text in runner.outgoing()]


async def test_the_limit_holds_when_the_wall_clock_is_stepped_back(engines: Engines) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    step = [0.0]

    def wall_clock() -> float:
        return 1000.0 + loop.time() - started + step[0]

    runner = SessionRunner(engines, model="m", clock=wall_clock, max_duration_s=1.0)
    assert runner.session.expires_at == 1001
    await runner.start()
    # Let the expiry timer read the clock and go to sleep for about a second ...
    await asyncio.sleep(0)
    # ... then step the wall clock back (NTP): the timer wakes before the limit by the clock
    # the limit is measured on, and must sleep again rather than give up.
    step[0] = -0.3
    events = await all_events(runner)
    assert [e["type"] for e in events] == ["session.created", "error"]
    assert events[1]["error"]["code"] == "session_expired"
    assert events[1]["error"]["message"] == "Your session hit the maximum duration of 1 second."
    assert wall_clock() >= 1001
    await runner.close()


def test_the_default_limit_is_openais_sixty_minutes() -> None:
    session = Session(model="m", created_at=1000.0, vad_chunk_ms=32, asr_rate=16000)
    assert session.expires_at == 1000 + SESSION_LIMIT_S == 1000 + 60 * 60
    session.handle_timer(1000 + 60 * 60 - 1)
    assert session.drain() == []
    session.handle_timer(1000 + 60 * 60)
    error, close = session.drain()
    assert isinstance(error, se.Error) and isinstance(close, Close)
    assert error.error.code == "session_expired"
    assert error.error.message == "Your session hit the maximum duration of 60 minutes."
    assert close.reason == "session_expired"

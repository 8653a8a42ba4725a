"""The session's outgoing backlog: bounded in events and bytes, and a peer that does not read
ends its session (the driver's side of design principle 9)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hark.config import Settings
from hark.driver.backlog import BACKLOG_EXCEEDED, MAX_BACKLOG_BYTES, MAX_BACKLOG_EVENTS
from hark.driver.runner import SessionRunner
from hark.engines.registry import Engines, build_engines

pytestmark = pytest.mark.realtime


@pytest.fixture
async def engines() -> Any:
    built = build_engines(Settings(engines="fake"))
    yield built
    await built.aclose()


async def stalled_runner(
    engines: Engines, events: int, size: int
) -> tuple[SessionRunner, list[str], asyncio.Event]:
    """A runner whose transport never takes an event (a peer that stopped reading)."""
    runner = SessionRunner(engines, model="m", max_backlog_events=events, max_backlog_bytes=size)
    reasons: list[str] = []
    stalled = asyncio.Event()

    def on_stalled(reason: str) -> None:
        reasons.append(reason)
        stalled.set()

    runner.send_with(lambda text: False, on_stalled)
    await runner.start()
    return runner, reasons, stalled


async def drain(runner: SessionRunner) -> list[dict[str, Any]]:
    return [json.loads(text) async for text in runner.outgoing()]


@pytest.mark.parametrize(
    ("events", "size", "named"),
    [
        (MAX_BACKLOG_EVENTS, 64 * 1024, "65536 bytes"),
        (20, MAX_BACKLOG_BYTES, "20 events"),
    ],
)
async def test_a_backlog_past_its_bound_ends_the_session_with_one_error(
    engines: Engines, events: int, size: int, named: str
) -> None:
    runner, reasons, stalled = await stalled_runner(engines, events, size)
    # Each reply is seconds of audio deltas of 6 KiB: the backlog passes either bound.
    for _ in range(20):
        runner.receive_text(json.dumps({"type": "response.create"}))
        await asyncio.sleep(0.01)
        if stalled.is_set():
            break
    await asyncio.wait_for(stalled.wait(), 30)
    sent = await asyncio.wait_for(drain(runner), 30)
    # What waited is dropped: the error comes alone, and then the stream ends.
    assert [event["type"] for event in sent] == ["error"]
    error = sent[0]["error"]
    assert error["code"] == BACKLOG_EXCEEDED
    assert "not reading" in error["message"] and named in error["message"]
    assert len(reasons) == 1 and "not reading" in reasons[0]
    assert runner.generations_running == 0
    # The session is over: input is ignored and nothing more is queued.
    runner.receive_text(json.dumps({"type": "response.create"}))
    assert runner.generations_running == 0
    await runner.close()


async def test_a_peer_that_reads_is_never_cut_off(engines: Engines) -> None:
    """The bound counts only what waits: a reader that keeps up takes every event."""
    runner = SessionRunner(engines, model="m", max_backlog_events=20)
    reasons: list[str] = []
    runner.send_with(None, reasons.append)
    await runner.start()
    received: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def read() -> None:
        async for text in runner.outgoing():
            event = json.loads(text)
            received.append(event)
            if event["type"] == "response.done":
                done.set()

    reader = asyncio.create_task(read())
    for _ in range(3):
        done.clear()
        runner.receive_text(json.dumps({"type": "response.create"}))
        await asyncio.wait_for(done.wait(), 30)
    await runner.close()
    await asyncio.wait_for(reader, 30)
    types = [event["type"] for event in received]
    assert types.count("response.done") == 3
    assert types.count("response.output_audio.delta") > 20
    assert "error" not in types and reasons == []

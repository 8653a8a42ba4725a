"""A client flooding a real ``hark serve`` is read at its share of the event loop, while
another session holds its text turns; nothing the flooder sent is lost or reordered."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.servers import hark_serve

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

HEADERS = {"Authorization": "Bearer any"}
THROTTLED = re.compile(r'^hark_input_throttled_seconds_total\{transport="websocket"\} (\S+)$', re.M)
# The flood goes on until the server says it kept the flooder waiting this long in all (far
# more than the pauses of a pass past its quantum: the budget ran dry, and reads were held),
# and no further than this. How much the server throttles depends on how fast this client
# sends next to how fast the server handles it, so the test asks only that it throttled.
THROTTLED_SECONDS = 1.0
MAX_FLOOD_FRAMES = 400_000
# Frames the flooder sends ahead of their answers: well under the server's backlog bound.
MAX_UNANSWERED = 4000
TURNS = 5


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """``hark serve --engines fake`` in its own process: its URL."""
    with hark_serve(["--engines", "fake", "--log-level", "warning"], tmp_path / "hark.log") as port:
        yield f"http://127.0.0.1:{port}"


async def throttled_seconds(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as response:
        found = THROTTLED.search(await response.text())
    return float(found.group(1)) if found else 0.0


def flood_frame(index: int) -> str | bytes:
    """The flood's frame ``index``: events the server refuses, each naming its event_id in
    the error that answers it, and now and then a binary frame (answered without one). Text
    behind a binary frame waits in aiohttp's queue for the session's reader task; binary
    frames are rare, so that most of the flood goes straight from the frame parser, and the
    rest of a read waits with the input budget while its session is paused."""
    if index % 4999 == 4998:
        return b"\x00binary"
    if index % 2:
        return json.dumps({"type": "no.such.event", "event_id": f"f{index}"})
    return json.dumps(
        {"type": "conversation.item.retrieve", "item_id": "nothing", "event_id": f"f{index}"}
    )


async def flood(
    http: aiohttp.ClientSession,
    url: str,
    answered: list[str | None],
    started: asyncio.Event,
    turns_over: asyncio.Event,
) -> int:
    """Send unpaced (``started`` once under way) until the server has throttled the flooder
    and ``turns_over`` is set; read every answer (the event id each error names, None for a
    binary frame's) until the last frame's; the frames sent."""
    async with http.ws_connect(url + "/v1/realtime", headers=HEADERS, max_msg_size=0) as ws:
        assert (await ws.receive_json(timeout=30))["type"] == "session.created"
        sent = 0
        done = asyncio.Event()

        caught_up = asyncio.Event()

        async def read() -> None:
            async for message in ws:
                event = json.loads(message.data)
                assert event["type"] == "error", event
                answered.append(event["error"].get("event_id"))
                if sent - len(answered) <= MAX_UNANSWERED // 2:
                    caught_up.set()
                if len(answered) == sent and done.is_set():
                    return

        reader = asyncio.create_task(read())
        while sent < MAX_FLOOD_FRAMES:
            for _ in range(2000):
                # A flooder that reads its answers: one that did not would be closed by the
                # server's bound on unread events, which is another test's subject.
                while sent - len(answered) > MAX_UNANSWERED:
                    caught_up.clear()
                    await asyncio.wait_for(caught_up.wait(), 120)
                frame = flood_frame(sent)
                if isinstance(frame, bytes):
                    await ws.send_bytes(frame)
                else:
                    await ws.send_str(frame)
                sent += 1
            started.set()
            if turns_over.is_set() and await throttled_seconds(http, url) >= THROTTLED_SECONDS:
                break
        done.set()
        # A reader that already has every answer returns at once; otherwise at the last.
        if len(answered) == sent:
            reader.cancel()
        await asyncio.wait_for(asyncio.gather(reader, return_exceptions=True), 120)
        return sent


async def text_turns(ws: aiohttp.ClientWebSocketResponse, turns: int) -> list[dict[str, Any]]:
    """``turns`` text turns one after the other: each turn's response.done."""
    done: list[dict[str, Any]] = []
    for turn in range(turns):
        await ws.send_json(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"turn {turn}"}],
                },
            }
        )
        await ws.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        while True:
            event = await ws.receive_json(timeout=120)
            assert event["type"] != "error", event
            if event["type"] == "response.done":
                done.append(event)
                break
    return done


async def test_a_flooding_client_is_throttled_and_loses_nothing_while_others_are_served(
    server: str,
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(server + "/v1/realtime", headers=HEADERS) as normal,
    ):
        assert (await normal.receive_json(timeout=30))["type"] == "session.created"
        answered: list[str | None] = []
        started = asyncio.Event()
        turns_over = asyncio.Event()
        flooding = asyncio.create_task(flood(http, server, answered, started, turns_over))
        await started.wait()
        # The flood goes on until these turns are over and the server has throttled it.
        turns = await text_turns(normal, TURNS)
        turns_over.set()
        sent = await flooding
        assert [t["response"]["status"] for t in turns] == ["completed"] * TURNS
        assert await throttled_seconds(http, server) > 0
        # Every flood frame answered, in the order sent: none lost or reordered while held.
        expected = [None if isinstance(flood_frame(i), bytes) else f"f{i}" for i in range(sent)]
        assert answered == expected

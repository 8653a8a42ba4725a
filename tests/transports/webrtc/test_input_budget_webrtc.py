"""A WebRTC caller flooding its data channel is read at its session's share of the event loop
(its SCTP association waits while the input budget is dry), and loses nothing: every event
is answered, in the order sent."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from hark.server.app import METRICS
from tests.transports.conftest import API_KEY, RtcServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

THROTTLED = re.compile(r'^hark_input_throttled_seconds_total\{transport="webrtc"\} (\S+)$', re.M)
BATCH = 4000
MAX_BATCHES = 30


def throttled_seconds(server: RtcServer) -> float:
    found = THROTTLED.search(server.app[METRICS].exposition().decode())
    return float(found.group(1)) if found else 0.0


async def test_a_data_channel_flood_is_throttled_and_answered_in_order(
    http: aiohttp.ClientSession,
    rtc_server: RtcServer,
    clients: Callable[..., CallClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = clients()
    await client.connect(http, rtc_server.url, api_key=API_KEY)
    await client.next_event("session.created")
    call = rtc_server.calls.get(client.call_id or "")
    assert call is not None
    gate = call._gate
    assert gate is not None
    # Whether the budget held the call each time its session was handed an event: SCTP must
    # hand over nothing while it does.
    held_at_receive: list[bool] = []
    receive_text = call.runner.receive_text

    def receive(text: str) -> None:
        held_at_receive.append(gate.holding)
        receive_text(text)

    monkeypatch.setattr(call.runner, "receive_text", receive)
    answered: list[str] = []
    sent = 0
    for _ in range(MAX_BATCHES):
        for _ in range(BATCH):
            client.send({"type": "no.such.event", "event_id": f"f{sent}"})
            sent += 1
        async with asyncio.timeout(120):
            while len(answered) < sent:
                event = await client.events.get()
                assert event["type"] == "error", event
                answered.append(event["error"]["event_id"])
        if throttled_seconds(rtc_server) > 0:
            break
    assert throttled_seconds(rtc_server) > 0
    assert len(held_at_receive) >= sent and not any(held_at_receive)
    assert answered == [f"f{i}" for i in range(sent)]
    # The session goes on: a text turn after the flood is answered.
    client.send(
        {
            "type": "response.create",
            "response": {"conversation": "none", "output_modalities": ["text"]},
        }
    )
    done = await client.next_event("response.done")
    assert done["response"]["status"] == "completed"

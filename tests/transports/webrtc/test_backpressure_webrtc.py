"""A WebRTC caller whose data channel stops taking events: once the channel holds more than
its bound unsent, the call ends (its session counted as ended for its backlog) instead of
buffering for the rest of the call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest
from aiortc.rtcsctptransport import Chunk, DataChunk

import hark.transports.webrtc.call as webrtc_call
from hark.bench.webrtc import CallClient
from hark.driver.backlog import BACKLOG_EXCEEDED
from hark.server.app import METRICS
from tests.transports.conftest import API_KEY, RtcServer, until
from tests.transports.test_backpressure_audio import count

pytestmark = pytest.mark.realtime


def stop_reading(client: CallClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's SCTP drops the data the server sends, unacknowledged, as a peer that
    stopped reading leaves it unacknowledged: the server's window closes."""
    sctp = client.pc.sctp
    assert sctp is not None
    receive = sctp._receive_chunk

    async def deaf(chunk: Chunk) -> None:
        if not isinstance(chunk, DataChunk):
            await receive(chunk)

    monkeypatch.setattr(sctp, "_receive_chunk", deaf)


async def test_a_caller_whose_data_channel_backs_up_is_hung_up(
    http: aiohttp.ClientSession,
    rtc_server: RtcServer,
    clients: Callable[..., CallClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bound, shrunk so that text replies pass it within a few dozen.
    monkeypatch.setattr(webrtc_call, "MAX_CHANNEL_BACKLOG_BYTES", 32 * 1024)
    client = clients()
    await client.connect(http, rtc_server.url, api_key=API_KEY)
    await client.next_event("session.created")
    call_id = client.call_id or ""
    stop_reading(client, monkeypatch)
    ask = {"type": "response.create", "response": {"output_modalities": ["text"]}}
    for _ in range(400):
        if rtc_server.calls.get(call_id) is None:
            break
        client.send(ask)
        await asyncio.sleep(0.02)
    await until(lambda: rtc_server.calls.get(call_id) is None)
    exposition = rtc_server.app[METRICS].exposition()
    ended = [
        line
        for line in exposition.decode().splitlines()
        if line.startswith("hark_sessions_ended_total") and BACKLOG_EXCEEDED in line
    ]
    assert ended and ended[0].endswith(" 1.0"), ended
    assert count(exposition, "hark_sessions_ended", "webrtc") >= 1

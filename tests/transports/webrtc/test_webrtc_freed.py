"""Ended WebRTC calls are freed by reference counting, their sessions and audio with them.

A call refers to its session and the peer connection; anything that ties the call into a cycle
keeps all of it, conversation audio included, until the cycle collector runs, which hark's GC
tuning makes rare. With the collector off, calls that ended must be gone all the same.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from hark.driver.runner import SessionRunner
from hark.session.core import Session
from hark.transports.webrtc.call import Call
from tests.transports.conftest import API_KEY, RtcServer, collect, until


def alive() -> tuple[int, int, int]:
    """Calls, session runners and session cores that still exist, reachable or not."""
    kinds = [type(obj) for obj in gc.get_objects()]
    return kinds.count(Call), kinds.count(SessionRunner), kinds.count(Session)


@pytest.mark.usefixtures("no_cycle_collector")
async def test_ended_calls_are_freed_without_the_cycle_collector(
    http: aiohttp.ClientSession, rtc_server: RtcServer, clients: Callable[..., CallClient]
) -> None:
    before = alive()
    for _ in range(2):
        client = clients()
        await client.connect(http, rtc_server.url, api_key=API_KEY)
        await client.next_event("session.created")
        client.send({"type": "response.create"})
        events = await collect(client, "output_audio_buffer.stopped")
        assert [e for e in events if e["type"] == "response.done"]
        await client.close()
        await until(lambda: len(rtc_server.calls) == 0)
    del client
    # The server's last references go as its handlers' tasks finish.
    await until(lambda: alive() == before)

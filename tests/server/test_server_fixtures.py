"""The test servers give back every thread they start.

Each server's engines start threads (the VAD batcher, the end-of-turn worker); a fixture
that forgot to close them would leave a pair behind per test, hundreds in a run.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import aiohttp

from hark.config import Settings
from hark.engines.registry import build_engines
from tests.conftest import shared_end_of_turn
from tests.server.conftest import serving, wait_ready
from tests.transports.conftest import serving_rtc


def thread_names() -> Counter[str]:
    """The names of the threads alive now, counted."""
    return Counter(thread.name for thread in threading.enumerate())


def left_behind(before: Counter[str]) -> Counter[str]:
    """The threads alive now that were not before. (Not equality with ``before``: a thread of
    an earlier test in the same process, still ending when this one began, may end during
    it, as a Piper engine's did in a fresh-clone run beside a CPU hog.)"""
    return thread_names() - before


def assert_engine_threads_started(before: Counter[str]) -> None:
    """The server's engines have threads of their own: a leak would be seen."""
    started = thread_names() - before
    assert started["hark-vad-batcher"] == 1, started


async def serve_websocket_server(before: Counter[str]) -> None:
    async with serving() as start:
        # Its own end-of-turn model (not the run's shared one), so that closing it is checked.
        server = await start(Settings(engines="fake"), build_engines(Settings(engines="fake")))
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, server)
        assert_engine_threads_started(before)
        assert (thread_names() - before)["hark-turn_0"] == 1


async def serve_rtc_server(before: Counter[str]) -> None:
    async with serving_rtc() as start:
        await start()
        assert_engine_threads_started(before)


def test_a_stopped_server_leaves_no_thread_behind() -> None:
    before = thread_names()
    # asyncio.run joins its loop's default executor before returning, so every thread that
    # is still alive afterwards is one that nothing will stop.
    asyncio.run(serve_websocket_server(before))
    assert not left_behind(before)


def test_a_stopped_webrtc_server_leaves_no_thread_behind() -> None:
    # The shared end-of-turn model is meant to outlive every server: start its thread first.
    asyncio.run(shared_end_of_turn().warmup())
    before = thread_names()
    asyncio.run(serve_rtc_server(before))
    assert not left_behind(before)

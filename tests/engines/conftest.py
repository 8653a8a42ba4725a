"""Spoken fixtures for the engine tests (real speech that Piper said once, at 16 kHz), and a
scripted HTTP peer for the tests of the engines that call a server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import numpy.typing as npt
import pytest
from aiohttp import web

from tests.speech import spoken_float

QUESTION = "What is the capital of France?"

Say = Callable[[str], npt.NDArray[np.float32]]


@pytest.fixture(scope="session")
def say() -> Say:
    """Speaks a text (one of ``tests.speech.SENTENCES``); mono float32 at 16 kHz.

    The samples come from committed WAV files, so they are the same in every run and no
    test needs Piper to make its input.
    """
    return spoken_float


@pytest.fixture(scope="session")
def question(say: Say) -> npt.NDArray[np.float32]:
    """The question ``QUESTION``, spoken (about 1.7 s)."""
    return say(QUESTION)


@contextlib.asynccontextmanager
async def scripted_peer(
    path: str, handle: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> AsyncIterator[str]:
    """A loopback HTTP server on a free port that answers POST ``/v1{path}`` with ``handle``;
    yields its base URL (``http://127.0.0.1:PORT/v1``)."""
    app = web.Application()
    app.router.add_post(f"/v1{path}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()

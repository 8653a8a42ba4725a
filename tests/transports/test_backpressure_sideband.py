"""A call's sideband socket that stops reading is closed with the reason once its backlog
passes the bound; the call's other sockets get every event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.registry import build_engines
from hark.transports.sideband import MAX_SIDEBAND_BACKLOG, Sidebands
from hark.transports.websocket import websocket_response
from tests.transports.conftest import until
from tests.transports.test_backpressure import NonReader

pytestmark = pytest.mark.realtime


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, Sidebands]]:
    """A server whose ``/side`` attaches sockets to one call's sidebands."""
    engines = build_engines(Settings(engines="fake"))
    runner = SessionRunner(engines, model="m", transport="webrtc")
    sidebands = Sidebands("rtc_test")

    async def side(request: web.Request) -> web.WebSocketResponse:
        ws = websocket_response(offered_realtime=False)
        await ws.prepare(request)
        await sidebands.serve(ws, runner)
        return ws

    app = web.Application()
    app.router.add_get("/v1/realtime", side)
    app_runner = web.AppRunner(app)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", 0)
    await site.start()
    host, port = app_runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}", sidebands
    finally:
        sidebands.end()
        await app_runner.cleanup()
        await runner.close()
        await engines.aclose()


async def test_a_sideband_that_stops_reading_is_closed_and_the_others_keep_up(
    served: tuple[str, Sidebands],
) -> None:
    url, sidebands = served
    stalled = await NonReader.connect(url)
    async with aiohttp.ClientSession() as http, http.ws_connect(url + "/v1/realtime") as reader:
        await until(lambda: len(sidebands) == 2)
        received: list[int] = []

        async def read() -> None:
            async for msg in reader:
                received.append(json.loads(msg.data)["n"])

        reading = asyncio.create_task(read())
        filler = "x" * 1000
        # More than the bound holds: the stalled socket's kernel buffers take a few hundred.
        total = 2 * MAX_SIDEBAND_BACKLOG
        for n in range(total):
            sidebands.publish(json.dumps({"type": "hark.test", "n": n, "filler": filler}))
            if n % 100 == 0:
                await asyncio.sleep(0)
        await until(lambda: len(sidebands) == 1)
        events, code, reason = await asyncio.wait_for(stalled.read_to_close(), 30)
        stalled.close()
        assert code == 1008 and "not reading" in reason
        assert len(events) < total
        await until(lambda: len(received) == total, 60)
        assert received == list(range(total))
        reading.cancel()

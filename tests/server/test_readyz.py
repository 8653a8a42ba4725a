"""``/readyz`` while an engine fails for everyone (issue 16, point 12): 503 ``degraded``, naming
the engine with a code and its error's type (never the message: ``/readyz`` is public), until
the engine works again; the session that met the failure got an ``error`` event and goes on.

A real server on the fake engines, whose real Silero VAD runs through a wrapper that fails on
command (``FlakyVadModel``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
from typing import Any

import aiohttp
import numpy as np
import pytest

from hark.config import Settings
from hark.engines.vad.batcher import BatchedSileroVad
from tests.conftest import engines_sharing_turn
from tests.engines.test_engine_failures import LIVENESS_S, FlakyVadModel
from tests.helpers.net import bearer

from .conftest import API_KEY, RunningServer, StartServer, wait_ready

KEYED = Settings(api_keys=(API_KEY,))
# What an engine's error might carry from an external backend.
SECRET = "sk-hark-test-0123456789"
LEAKY = f"POST http://ops:{SECRET}@10.0.0.7/v1?key={SECRET} failed: Authorization: Bearer {SECRET}"


async def readyz(http: aiohttp.ClientSession, server: RunningServer) -> tuple[int, Any]:
    async with http.get(server.url + "/readyz") as response:
        return response.status, await response.json()


async def next_event(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), LIVENESS_S)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    event: dict[str, Any] = json.loads(msg.data)
    return event


async def serving_with(
    model: FlakyVadModel, start_server: StartServer, http: aiohttp.ClientSession
) -> RunningServer:
    """A ready server on the fake engines whose VAD runs ``model``."""
    engines = dataclasses.replace(
        engines_sharing_turn(Settings(engines="fake")), vad=BatchedSileroVad(model=model)
    )
    server = await start_server(KEYED, engines)
    await wait_ready(http, server)
    return server


def silence(seconds: float) -> str:
    audio = base64.b64encode(np.zeros(int(24000 * seconds), "<i2").tobytes()).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


async def test_readyz_is_degraded_while_the_vad_fails_and_ready_once_it_works_again(
    start_server: StartServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hark.engines.health")
    model = FlakyVadModel()
    model.message = LEAKY
    server = await serving_with(model, start_server, http)
    assert await readyz(http, server) == (200, {"status": "ready"})

    async with http.ws_connect(server.ws_url, headers=bearer(API_KEY)) as ws:
        assert (await next_event(ws))["type"] == "session.created"
        model.failing.set()
        await ws.send_str(silence(0.2))
        error = await next_event(ws)
        assert error["type"] == "error"
        assert error["error"]["code"] == "vad_failed"

        async with http.get(server.url + "/readyz") as response:
            status, text = response.status, await response.text()
        assert status == 503
        assert json.loads(text) == {
            "status": "degraded",
            "engines": {"vad": {"code": "engine_failed", "error": "RuntimeError"}},
        }
        assert SECRET not in text
        # The operator finds the message in the log, once however many batches failed.
        degraded = [r for r in caplog.records if "engine is degraded" in r.getMessage()]
        assert len(degraded) == 1
        assert "vad engine is degraded (engine_failed): RuntimeError: POST" in caplog.text
        # The process still answers: only readiness for new sessions is withdrawn.
        async with http.get(server.url + "/healthz") as response:
            assert response.status == 200

        # The next batch that succeeds makes the VAD, and the server, ready again.
        model.failing.clear()
        await ws.send_str(silence(0.2))
        await wait_ready(http, server)
        assert await readyz(http, server) == (200, {"status": "ready"})

        # The session went on: it still answers.
        await ws.send_str(json.dumps({"type": "session.update", "session": {}}))
        assert (await next_event(ws))["type"] == "session.updated"


async def test_a_degraded_worker_without_sessions_tries_its_vad_again_when_asked(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    model = FlakyVadModel()
    server = await serving_with(model, start_server, http)
    async with http.ws_connect(server.ws_url, headers=bearer(API_KEY)) as ws:
        assert (await next_event(ws))["type"] == "session.created"
        model.failing.set()
        await ws.send_str(silence(0.2))
        assert (await next_event(ws))["error"]["code"] == "vad_failed"
    # No session is left to send audio (a degraded worker gets no new ones), and the VAD
    # still fails: asking /readyz tries it, and it stays degraded.
    rows = model.rows
    status, body = await readyz(http, server)
    assert (status, body["status"]) == (503, "degraded")
    assert await asyncio.to_thread(model.wait_rows, rows + 1)
    assert (await readyz(http, server))[0] == 503

    # Once the model works, the next probe finds it so.
    model.failing.clear()
    await wait_ready(http, server)
    assert await readyz(http, server) == (200, {"status": "ready"})


async def test_a_dead_vad_thread_is_counted_in_metrics_and_ready_once_its_successor_serves(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    model = FlakyVadModel()
    server = await serving_with(model, start_server, http)
    async with http.ws_connect(server.ws_url, headers=bearer(API_KEY)) as ws:
        assert (await next_event(ws))["type"] == "session.created"
        model.kill_next.set()
        await ws.send_str(silence(0.032))
        assert (await next_event(ws))["error"]["code"] == "vad_failed"
        assert await readyz(http, server) == (
            503,
            {
                "status": "degraded",
                "engines": {"vad": {"code": "engine_thread_died", "error": "ThreadKiller"}},
            },
        )
        # The server's own metrics counted the restart.
        async with http.get(server.url + "/metrics", headers=bearer(API_KEY)) as response:
            exposition = await response.text()
        assert 'hark_engine_thread_restarts_total{engine="vad"} 1.0' in exposition

        # The thread that took the dead one's place serves the next chunk.
        await ws.send_str(silence(0.2))
        await wait_ready(http, server)
        assert await readyz(http, server) == (200, {"status": "ready"})

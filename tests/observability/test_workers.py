"""`hark serve --workers 2`: two processes on one port, and /metrics on either shows both."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import aiohttp
import pytest

from tests.helpers.net import free_port

pytestmark = pytest.mark.slow


async def worker_pids(http: aiohttp.ClientSession, url: str) -> set[str]:
    try:
        async with http.get(url + "/metrics") as response:
            text = await response.text()
    except aiohttp.ClientError:
        return set()
    return set(re.findall(r'hark_process_resident_memory_bytes\{pid="(\d+)"\}', text))


async def test_two_workers_share_the_port_and_the_metrics() -> None:
    port = free_port()
    command = ["serve", "--engines", "fake", "--workers", "2", "--port", str(port)]
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hark.cli",
        *command,
        "--rtc-port",
        "0",
        "--log-level",
        "warning",
        env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            pids: set[str] = set()
            for _ in range(600):
                pids = await worker_pids(http, url)
                if len(pids) == 2:
                    break
                await asyncio.sleep(0.2)
            assert len(pids) == 2
            assert str(server.pid) not in pids
            # Every scrape, whichever worker answers it, shows both.
            for _ in range(6):
                assert await worker_pids(http, url) == pids
            for _ in range(600):
                async with http.get(url + "/readyz") as response:
                    if response.status == 200:
                        break
                await asyncio.sleep(0.1)
            headers = {"Authorization": "Bearer any"}
            async with http.ws_connect(url + "/v1/realtime", headers=headers) as ws:
                created = await ws.receive_json(timeout=30)
                assert created["type"] == "session.created"
    finally:
        server.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(server.wait(), 60)
    assert status == 0

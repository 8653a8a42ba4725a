"""Many calls come and go; the server's sockets, threads and memory stay where they were."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from tests.transports.conftest import API_KEY, bearer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

CALLS = 100
WARMUP_CALLS = 10
# Pools made lazily and kept for good (the loop's default executor: up to min(32, cores + 4)
# threads) may still grow after the warm-up calls on a machine with many cores; a thread
# leaked per call would add CALLS threads, three times this bound.
THREAD_SLACK = min(32, (os.cpu_count() or 1) + 4)
# Between what 100 healthy calls leave behind (allocator arenas, fragmentation: 4.3 MiB on the
# 2-core development VM, threads and all) and what 100 leaked calls would hold (a call holds
# about 0.33 MiB: 20 calls held open, same VM, so 33 MiB). Speed does not move either figure:
# RSS is read only once teardown has brought fds and threads back.
RSS_SLACK_BYTES = 20 * 1024 * 1024
# Calls held open at once to show that a call costs no thread of its own: more than the
# slack, so that a thread per call could not hide in it.
HELD_CALLS = THREAD_SLACK + 8
# Bounds a hang, never speed: teardown on a slow machine may take a while.
LIVENESS_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def threads(pid: int) -> int:
    return status(pid, "Threads")


def rss_bytes(pid: int) -> int:
    return status(pid, "VmRSS") * 1024


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """`hark serve --engines fake` in its own process: its /proc is the server's alone."""
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "HARK_API_KEYS": API_KEY}
    command = [sys.executable, "-m", "hark.cli", "serve", "--engines", "fake"]
    command += ["--port", str(port), "--rtc-port", "0", "--log-level", "warning"]
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(log.read_text()[-3000:])


async def one_call(http: aiohttp.ClientSession, url: str, n: int) -> None:
    """Set up a call, use it a little, and end it one of three ways."""
    client = CallClient()
    try:
        await client.connect(http, url, api_key=API_KEY)
        await client.next_event("session.created")
        if n % 4 == 0:
            client.send({"type": "response.create"})
            async with asyncio.timeout(10):
                await client.first_audio.wait()
        if n % 3 == 0:
            hangup = f"{url}/v1/realtime/calls/{client.call_id}/hangup"
            async with http.post(hangup, headers=bearer(API_KEY)) as response:
                assert response.status == 200
    finally:
        # n % 3 == 0: after the server hung up; otherwise the client closes (DTLS close).
        await client.close()


async def threads_while_held(http: aiohttp.ClientSession, url: str, pid: int) -> int:
    """The server's threads while ``HELD_CALLS`` calls are up, each hearing its audio."""
    clients = [CallClient() for _ in range(HELD_CALLS)]
    try:
        for client in clients:
            await client.connect(http, url, api_key=API_KEY)
            await client.next_event("session.created")
        async with asyncio.timeout(LIVENESS_S):
            for client in clients:
                await client.receiving.wait()
        return threads(pid)
    finally:
        await asyncio.gather(*(client.close() for client in clients))


async def settled(pid: int, fds: int, thread_count: int) -> tuple[int, int]:
    """Wait for the calls' teardown to bring fds and threads within bounds (or for the
    liveness limit); returns the final (fds, threads)."""
    deadline = time.monotonic() + LIVENESS_S
    while True:
        now = (open_fds(pid), threads(pid))
        if (now[0] <= fds and now[1] <= thread_count) or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.2)


async def test_a_hundred_calls_leave_nothing_behind(server: tuple[str, int]) -> None:
    url, pid = server
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(LIVENESS_S):
            while True:
                try:
                    async with http.get(url + "/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        # The first calls fill lazily made pools (thread pools, codec state) for good.
        for n in range(WARMUP_CALLS):
            await one_call(http, url, n)
        await asyncio.sleep(1)
        fds, thread_count, rss = open_fds(pid), threads(pid), rss_bytes(pid)
        held_threads = await threads_while_held(http, url, pid)
        for n in range(CALLS):
            await one_call(http, url, n)
        after_fds, after_threads = await settled(pid, fds, thread_count + THREAD_SLACK)
        after_rss = rss_bytes(pid)
    assert held_threads <= thread_count + THREAD_SLACK, (
        f"threads: {thread_count} before, {held_threads} with {HELD_CALLS} calls up"
    )
    assert after_fds <= fds, f"file descriptors: {fds} before, {after_fds} after"
    assert after_threads <= thread_count + THREAD_SLACK, (
        f"threads: {thread_count} before, {after_threads} after"
    )
    assert after_rss - rss <= RSS_SLACK_BYTES, f"RSS grew by {(after_rss - rss) / 2**20:.1f} MiB"

"""What receiving the appends alone costs a server, with no session behind them.

Starts a server that reads and drops what N clients send (each a 20 ms
``input_audio_buffer.append`` every 20 ms, as ``hark bench load`` sends them) and prints the
server's CPU time per session-second, and how much of it the kernel spent. Two servers:

- ``aiohttp``: an aiohttp WebSocket handler on uvloop that iterates over its messages, the
  stack ``hark serve`` receives appends with;
- ``socket``: a uvloop socket whose protocol drops the bytes, what the network alone costs.

    python scripts/websocket_floor.py --server aiohttp --sessions 150

The server is pinned to core 0 and the clients to core 1 (``taskset`` on Linux).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import time

import numpy as np

PORT = 8998
CHUNK_S = 0.02
RATE = 24000


async def _serve_aiohttp() -> None:
    from aiohttp import web

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=32 << 20, compress=False)
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", PORT).start()
    await asyncio.Event().wait()


class _Drop(asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        pass


async def _serve_socket() -> None:
    server = await asyncio.get_running_loop().create_server(_Drop, "127.0.0.1", PORT)
    async with server:
        await server.serve_forever()


async def _clients(kind: str, sessions: int, seconds: float) -> None:
    import aiohttp

    pcm = (np.random.default_rng(0).standard_normal(int(RATE * CHUNK_S)) * 1000).astype("<i2")
    text = json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm.tobytes()).decode()}
    )
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        if kind == "aiohttp":
            sockets = [await http.ws_connect(f"http://127.0.0.1:{PORT}/") for _ in range(sessions)]

            async def send(index: int) -> None:
                await sockets[index].send_str(text)

        else:
            # The same bytes a client's WebSocket frames carry, without the framing.
            writers = []
            for _ in range(sessions):
                _, writer = await asyncio.open_connection("127.0.0.1", PORT)
                writers.append(writer)
            payload = text.encode()

            async def send(index: int) -> None:
                writers[index].write(payload)

        start = time.monotonic()
        tick = 0
        while time.monotonic() - start < seconds:
            tick += 1
            for index in range(sessions):
                await send(index)
            await asyncio.sleep(max(0.0, start + tick * CHUNK_S - time.monotonic()))


def _cpu_ticks(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # utime, stime


def _measure(kind: str, sessions: int, seconds: float) -> None:
    me = [sys.executable, __file__, "--server", kind, "--sessions", str(sessions)]
    server = subprocess.Popen(["taskset", "-c", "0", *me, "--role", "server"])
    try:
        time.sleep(2)
        clients = subprocess.Popen(
            ["taskset", "-c", "1", *me, "--role", "clients", "--seconds", str(seconds + 8)]
        )
        time.sleep(6)
        user0, system0 = _cpu_ticks(server.pid)
        time.sleep(seconds)
        user1, system1 = _cpu_ticks(server.pid)
        clients.wait()
    finally:
        server.terminate()
        server.wait()
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    total = (user1 - user0 + system1 - system0) * tick_ms
    kernel = (system1 - system0) * tick_ms
    print(
        f"{kind} server, {sessions} sessions of 20 ms appends: "
        f"{total / seconds / sessions:.2f} ms of CPU per session-second "
        f"({kernel / max(total, 1e-9):.0%} in the kernel)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("aiohttp", "socket"), default="aiohttp")
    parser.add_argument("--sessions", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--role", choices=("measure", "server", "clients"), default="measure")
    options = parser.parse_args()
    import uvloop

    if options.role == "server":
        serve = _serve_aiohttp if options.server == "aiohttp" else _serve_socket
        uvloop.run(serve())
    elif options.role == "clients":
        uvloop.run(_clients(options.server, options.sessions, options.seconds))
    else:
        _measure(options.server, options.sessions, options.seconds)


if __name__ == "__main__":
    main()

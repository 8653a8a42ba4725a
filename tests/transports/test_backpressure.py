"""A WebSocket client that stops reading, against a real server process.

The client is a raw socket with a small receive buffer that sends ``response.create`` again
and again (the fake engines answer each with seconds of audio) and reads nothing: the server
must close it with the reason once its backlog passes the bound, keep its own memory flat
across such clients, and serve another session meanwhile as if nothing happened.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hark.driver.backlog import BACKLOG_EXCEEDED, MAX_BACKLOG_BYTES
from tests.servers import HarkProcess

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

HEADERS = {"Authorization": "Bearer any"}
# Label order differs between the single-process and the multiprocess exposition.
ENDED = re.compile(r"^hark_sessions_ended_total\{(.*)\} (\S+)$", re.MULTILINE)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    """``hark serve --engines fake`` in its own process: its URL and pid."""
    process = HarkProcess(
        ["--engines", "fake", "--log-level", "warning"],
        tmp_path / "server.log",
        without=("PROMETHEUS_MULTIPROC_DIR",),
    )
    await asyncio.to_thread(process.start, 60)
    try:
        assert process.proc is not None
        yield process.url, process.proc.pid
    finally:
        await asyncio.to_thread(process.stop)


def masked_text(text: str) -> bytes:
    """A client's text frame (RFC 6455: masked)."""
    payload = text.encode()
    mask = os.urandom(4)
    length = len(payload)
    header = struct.pack("!BB", 0x81, 0x80 | length) if length < 126 else b""
    if not header:
        header = struct.pack("!BBH", 0x81, 0x80 | 126, length)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class NonReader:
    """A raw WebSocket client that reads only its handshake, until told to read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sent = 0

    @classmethod
    async def connect(cls, url: str) -> NonReader:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket()
        # Set before connecting, so the window the server sees is small from the start.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /v1/realtime HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Authorization: Bearer any\r\n\r\n"
        )
        await loop.sock_sendall(sock, request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            # One byte at a time: nothing of the first frames may be taken with the head.
            byte = await loop.sock_recv(sock, 1)
            assert byte, "closed during the handshake"
            head += byte
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(sock)

    async def send(self, event: dict[str, Any]) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, masked_text(json.dumps(event)))
        self.sent += 1

    async def read_to_close(self) -> tuple[list[dict[str, Any]], int | None, str]:
        """Read every frame until the close frame or the end: the text events, and the close
        code and reason (None when the connection ended without one)."""
        loop = asyncio.get_running_loop()
        data = bytearray()
        events: list[dict[str, Any]] = []
        while True:
            while True:
                frame = parse_frame(data)
                if frame is None:
                    break
                opcode, payload = frame
                if opcode == 0x1:
                    events.append(json.loads(payload))
                elif opcode == 0x8:
                    code = struct.unpack("!H", payload[:2])[0]
                    return events, code, payload[2:].decode()
            try:
                chunk = await loop.sock_recv(self.sock, 1 << 16)
            except ConnectionError:
                chunk = b""
            if not chunk:
                return events, None, ""
            data += chunk

    def close(self) -> None:
        self.sock.close()


def parse_frame(data: bytearray) -> tuple[int, bytes] | None:
    """Take one whole unmasked server frame off the front of ``data``."""
    if len(data) < 2:
        return None
    opcode, length = data[0] & 0x0F, data[1] & 0x7F
    offset = 2
    if length == 126:
        if len(data) < 4:
            return None
        length, offset = struct.unpack("!H", data[2:4])[0], 4
    elif length == 127:
        if len(data) < 10:
            return None
        length, offset = struct.unpack("!Q", data[2:10])[0], 10
    if len(data) < offset + length:
        return None
    payload = bytes(data[offset : offset + length])
    del data[: offset + length]
    return opcode, payload


async def ended_for_backlog(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    labels = {'reason="client_not_reading"', 'transport="websocket"'}
    return sum(
        int(float(count)) for names, count in ENDED.findall(text) if labels <= set(names.split(","))
    )


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def text_turn(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """One reply on a session that reads: every event up to its ``response.done``."""
    await ws.send_json({"type": "response.create"})
    events = []
    while True:
        event = await ws.receive_json(timeout=60)
        events.append(event)
        if event["type"] == "response.done":
            return events


async def stall(http: aiohttp.ClientSession, url: str, ended_before: int) -> NonReader:
    """A non-reader asking for replies until the server ends its session for the backlog."""
    client = await NonReader.connect(url)
    # Each reply is 2.4 s of audio, 150 KiB of base64: the bound is passed after about a
    # hundred. Out of band, so that the memory measured is the backlog's, not the audio a
    # conversation keeps until the garbage collector frees a closed session's.
    for _ in range(20 * MAX_BACKLOG_BYTES // (150 * 1024)):
        await client.send({"type": "response.create", "response": {"conversation": "none"}})
        await asyncio.sleep(0.005)
        if client.sent % 20 == 0 and await ended_for_backlog(http, url) > ended_before:
            return client
    raise AssertionError(f"the server kept a client that read nothing for {client.sent} replies")


async def test_a_client_that_stops_reading_is_closed_with_the_reason(
    server: tuple[str, int],
) -> None:
    url, pid = server
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url + "/v1/realtime", headers=HEADERS) as normal,
    ):
        assert (await normal.receive_json(timeout=30))["type"] == "session.created"
        first = await stall(http, url, 0)
        # The client reads at last: the events it had been sent, the session's error
        # naming the bound, and a policy-violation close with the reason.
        events, code, reason = await asyncio.wait_for(first.read_to_close(), 60)
        first.close()
        assert events[0]["type"] == "session.created"
        assert events[-1]["type"] == "error"
        assert events[-1]["error"]["code"] == BACKLOG_EXCEEDED
        assert code == 1008
        assert "not reading" in reason and "backlog over" in reason
        # What was dropped was dropped: far less reached the client than the bound.
        audio = sum(len(e.get("delta", "")) for e in events if e["type"].endswith("audio.delta"))
        assert audio < MAX_BACKLOG_BYTES
        # The other session went on as if nothing happened.
        reply = await text_turn(normal)
        assert not [e for e in reply if e["type"] == "error"]
        assert reply[-1]["response"]["status"] == "completed"

        settled = resident_bytes(pid)
        for ended in range(1, 5):
            client = await stall(http, url, ended)
            client.close()
        # Four more backlogs to the bound cost the server less than one: each is freed.
        assert resident_bytes(pid) - settled < MAX_BACKLOG_BYTES
        assert await ended_for_backlog(http, url) == 5
        reply = await text_turn(normal)
        assert reply[-1]["response"]["status"] == "completed"

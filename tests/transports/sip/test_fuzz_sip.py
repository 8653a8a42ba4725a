"""Thousands of malformed and mutated SIP messages at a running ``hark serve``, over UDP and
TCP: the worker never crashes or wedges (OPTIONS is answered between every burst, and a
normal call works afterwards), never answers with a server error, and answers a malformed
request whose Via it can read with 400.

The mutations are seeded: a failure names its seed and burst, and replays the same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.transports.sip.conftest import SipServer, run_sipp

SEED = 15
UDP_MESSAGES = 3000
TCP_MESSAGES = 1000
BURST = 50
# Bounds a hang, never speed.
LIVENESS_S = 10.0

_SDP = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\n"
)


def request(
    method: str,
    port: int,
    *,
    branch: str,
    call_id: str,
    cseq: str | None = None,
    body: str = "",
    extra: tuple[str, ...] = (),
    transport: str = "UDP",
) -> str:
    """A well-formed request from a peer at 127.0.0.1:``port``."""
    lines = [
        f"{method} sip:hark@127.0.0.1 SIP/2.0",
        f"Via: SIP/2.0/{transport} 127.0.0.1:{port};branch=z9hG4bK{branch};rport",
        "Max-Forwards: 70",
        f"From: <sip:fuzz@127.0.0.1>;tag=f{branch}",
        "To: <sip:hark@127.0.0.1>",
        f"Call-ID: {call_id}",
        f"CSeq: {cseq or f'1 {method}'}",
        f"Contact: <sip:fuzz@127.0.0.1:{port}>",
        *extra,
    ]
    if body:
        lines.append("Content-Type: application/sdp")
    lines.append(f"Content-Length: {len(body.encode())}")
    return "\r\n".join(lines) + "\r\n\r\n" + body


def seeds(port: int, transport: str = "UDP") -> list[bytes]:
    """The real messages the mutator starts from."""
    texts = [
        request("INVITE", port, branch="inv", call_id="c-inv", body=_SDP, transport=transport),
        request("OPTIONS", port, branch="opt", call_id="c-opt", transport=transport),
        request("BYE", port, branch="bye", call_id="c-bye", cseq="2 BYE", transport=transport),
        request("CANCEL", port, branch="inv", call_id="c-inv", transport=transport),
        request("ACK", port, branch="ack", call_id="c-ack", transport=transport),
        request(
            "INFO",
            port,
            branch="info",
            call_id="c-info",
            extra=("Content-Type: application/dtmf-relay",),
            transport=transport,
        ),
        request("REGISTER", port, branch="reg", call_id="c-reg", transport=transport),
        # Compact forms and folding.
        "INVITE sip:hark@127.0.0.1 SIP/2.0\r\n"
        f"v: SIP/2.0/{transport} 127.0.0.1:{port};branch=z9hG4bKcompact\r\n"
        "f: <sip:fuzz@127.0.0.1>;tag=1\r\nt: <sip:hark@127.0.0.1>\r\ni: c-compact\r\n"
        "CSeq: 1\r\n INVITE\r\nm: <sip:fuzz@127.0.0.1>\r\nc: application/sdp\r\n"
        f"l: {len(_SDP)}\r\n\r\n{_SDP}",
        "SIP/2.0 200 OK\r\n"
        f"Via: SIP/2.0/{transport} 127.0.0.1:{port};branch=z9hG4bKresp\r\n"
        "From: <sip:hark@127.0.0.1>;tag=a\r\nTo: <sip:fuzz@127.0.0.1>;tag=b\r\n"
        "Call-ID: c-resp\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n",
    ]
    return [text.encode() for text in texts]


_JUNK_HEADERS = (
    b"Content-Length: -1",
    b"Content-Length: 99999999999999999999",
    b"Content-Length: x",
    b"CSeq: 4294967296 INVITE",
    b"CSeq: INVITE",
    b"Via: SIP/2.0/UDP",
    b"Via: ;;;;",
    b"Max-Forwards: -5",
    b"To: <sip:",
    b'From: "unterminated <sip:x@y>',
    b"Call-ID:",
    b": no name",
    b"X" * 70000,
    b"Route: <sip:127.0.0.1;lr>" * 200,
    "X-Ünïcode: ☎".encode(),
    b"\xff\xfe\x00\x00",
)


def mutate(rng: random.Random, message: bytes) -> bytes:
    """One random mutation (sometimes several) of ``message``."""
    data = bytearray(message)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.randrange(10)
        if not data:
            data = bytearray(rng.randbytes(rng.randrange(1, 64)))
        position = rng.randrange(len(data) + 1)
        if kind == 0:  # flip bytes
            for _ in range(rng.randrange(1, 8)):
                index = rng.randrange(len(data))
                data[index] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate
            data = data[:position]
        elif kind == 2:  # insert random bytes
            data[position:position] = rng.randbytes(rng.randrange(1, 32))
        elif kind == 3:  # delete a header line
            lines = bytes(data).split(b"\r\n")
            if len(lines) > 2:
                del lines[rng.randrange(1, len(lines) - 1)]
            data = bytearray(b"\r\n".join(lines))
        elif kind == 4:  # duplicate a header line
            lines = bytes(data).split(b"\r\n")
            index = rng.randrange(len(lines))
            lines.insert(index, lines[index])
            data = bytearray(b"\r\n".join(lines))
        elif kind == 5:  # a junk header
            lines = bytes(data).split(b"\r\n")
            lines.insert(rng.randrange(1, max(2, len(lines))), rng.choice(_JUNK_HEADERS))
            data = bytearray(b"\r\n".join(lines))
        elif kind == 6:  # break the start line
            first, _, rest = bytes(data).partition(b"\r\n")
            words = first.split(b" ")
            rng.shuffle(words)
            choice = rng.choice([b" ".join(words), b"", first + b" extra", b"SIP/3.0 " + first])
            data = bytearray(choice + b"\r\n" + rest)
        elif kind == 7:  # line endings
            data = bytearray(bytes(data).replace(b"\r\n", rng.choice([b"\n", b"\r", b"\r\r\n"])))
        elif kind == 8:  # repeat a chunk
            end = min(len(data), position + rng.randrange(1, 200))
            data[position:position] = data[position:end] * rng.randrange(2, 50)
        else:  # pure noise
            data = bytearray(rng.randbytes(rng.randrange(0, 1500)))
    return bytes(data)


def corpus(rng: random.Random, port: int, count: int, transport: str) -> Iterator[bytes]:
    """``count`` mutated messages; every tenth left whole (so that dialogs get made)."""
    base = seeds(port, transport)
    for index in range(count):
        message = rng.choice(base)
        # A fresh branch and Call-ID per message keeps each a new transaction.
        message = message.replace(b"z9hG4bK", f"z9hG4bK{index}x".encode()).replace(
            b"Call-ID: c-", f"Call-ID: {index}-".encode()
        )
        yield message if index % 10 == 0 else mutate(rng, message)


def status_of(response: bytes) -> int | None:
    """The status code of a SIP response, or None when it is not one."""
    match = re.match(rb"SIP/2\.0 (\d{3}) ", response)
    return int(match.group(1)) if match else None


class UdpPeer:
    """A UDP socket on loopback talking to hark's SIP port."""

    def __init__(self, server_port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self.server = ("127.0.0.1", server_port)
        self.responses: list[bytes] = []

    def send(self, data: bytes) -> None:
        """Send one datagram (too big ones are what the kernel refuses, not the server)."""
        with contextlib.suppress(OSError):
            self.sock.sendto(data, self.server)

    async def ping(self, tag: str) -> None:
        """OPTIONS, and wait for its 200 (collecting what else arrives meanwhile)."""
        loop = asyncio.get_running_loop()
        self.send(
            request("OPTIONS", self.port, branch=f"ping{tag}", call_id=f"ping-{tag}").encode()
        )
        async with asyncio.timeout(LIVENESS_S):
            while True:
                data = await loop.sock_recv(self.sock, 70000)
                self.responses.append(data)
                if f"z9hG4bKping{tag};".encode() in data or f"z9hG4bKping{tag}\r".encode() in data:
                    assert status_of(data) == 200, data[:300]
                    return

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def assert_no_server_error(responses: list[bytes]) -> None:
    """No answer says the server failed (500) or is not a SIP response."""
    for response in responses:
        status = status_of(response)
        assert status is not None, response[:300]
        assert status != 500, response[:600]


async def test_mutated_datagrams_never_crash_or_wedge_the_worker(
    sip_server: SipServer, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    peer = UdpPeer(sip_server.sip_port)
    try:
        for burst_start in range(0, UDP_MESSAGES, BURST):
            batch = list(corpus(rng, peer.port, BURST, "UDP"))
            for message in batch:
                peer.send(message)
            try:
                await peer.ping(f"u{burst_start}")
            except TimeoutError:
                pytest.fail(f"seed {SEED}, burst at {burst_start}: OPTIONS went unanswered")
            assert sip_server.alive(), f"seed {SEED}, burst at {burst_start}"
        assert_no_server_error(peer.responses)
    finally:
        peer.close()
    await assert_still_serving(sip_server, tmp_path)


async def test_mutated_tcp_streams_never_crash_or_wedge_the_worker(
    sip_server: SipServer, tmp_path: Path
) -> None:
    rng = random.Random(SEED + 1)
    responses: list[bytes] = []
    for burst_start in range(0, TCP_MESSAGES, BURST):
        reader, writer = await asyncio.open_connection("127.0.0.1", sip_server.sip_port)
        port = writer.get_extra_info("sockname")[1]
        for message in corpus(rng, port, BURST, "TCP"):
            writer.write(message)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        # The server may close a stream it cannot frame; whatever it answered before counts.
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(0.5):
                while chunk := await reader.read(65536):
                    responses.append(chunk)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        assert await tcp_options_answered(sip_server.sip_port), (
            f"seed {SEED + 1}, burst at {burst_start}: OPTIONS over TCP went unanswered"
        )
        assert sip_server.alive(), f"seed {SEED + 1}, burst at {burst_start}"
    for response in split_stream(b"".join(responses)):
        assert status_of(response) != 500, response[:600]
    await assert_still_serving(sip_server, tmp_path)


async def test_half_sent_tcp_messages_do_not_hold_the_port(
    sip_server: SipServer, tmp_path: Path
) -> None:
    # Connections that send half a message and wait: the server must go on serving others.
    idle = []
    try:
        for index in range(50):
            _, writer = await asyncio.open_connection("127.0.0.1", sip_server.sip_port)
            writer.write(
                request("INVITE", 1, branch=f"half{index}", call_id=f"h{index}").encode()[:90]
            )
            await writer.drain()
            idle.append(writer)
        assert await tcp_options_answered(sip_server.sip_port)
    finally:
        for writer in idle:
            writer.close()
    await assert_still_serving(sip_server, tmp_path)


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("bad CSeq number", "CSeq: many OPTIONS"),
        ("bad Content-Length", "Content-Length: lots"),
        ("unclosed To", "To: <sip:hark@127.0.0.1"),
        ("empty Call-ID", "Call-ID:"),
    ],
)
async def test_a_malformed_request_with_a_readable_via_gets_400(
    sip_server: SipServer, name: str, header: str
) -> None:
    peer = UdpPeer(sip_server.sip_port)
    try:
        good = request("OPTIONS", peer.port, branch="bad400", call_id="bad-400")
        field = header.split(":", 1)[0]
        lines = [line for line in good.split("\r\n") if not line.startswith(f"{field}:")]
        lines.insert(1, header)
        peer.send("\r\n".join(lines).encode())
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(LIVENESS_S):
            answer = await loop.sock_recv(peer.sock, 70000)
        assert status_of(answer) == 400, f"{name}: {answer[:300]!r}"
        assert b"branch=z9hG4bKbad400" in answer
    finally:
        peer.close()


def split_stream(data: bytes) -> list[bytes]:
    """SIP messages back to back on a stream, framed by their Content-Length."""
    messages = []
    while data:
        head, separator, rest = data.partition(b"\r\n\r\n")
        if not separator:
            break
        match = re.search(rb"(?im)^(?:content-length|l)\s*:\s*(\d+)", head)
        length = int(match.group(1)) if match else 0
        messages.append(head + separator + rest[:length])
        data = rest[length:]
    return messages


async def tcp_options_answered(sip_port: int) -> bool:
    """A fresh TCP connection's OPTIONS gets its 200."""
    try:
        async with asyncio.timeout(LIVENESS_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", sip_port)
            port = writer.get_extra_info("sockname")[1]
            text = request("OPTIONS", port, branch="tcpping", call_id="tcp-ping", transport="TCP")
            writer.write(text.encode())
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            writer.close()
            return status_of(head) == 200
    except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
        return False


async def assert_still_serving(server: SipServer, tmp_path: Path) -> None:
    """A normal call and an OPTIONS ping still work, and nothing raised in the server."""
    run = await run_sipp("uac_rtp", server.sip_port, tmp_path / "after")
    assert run.ok, run.describe()
    options = await run_sipp("options", server.sip_port, tmp_path / "after")
    assert options.ok, options.describe()
    assert server.alive()
    assert "Traceback" not in server.log(), server.log()[-4000:]

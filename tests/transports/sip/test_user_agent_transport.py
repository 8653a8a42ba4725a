"""The user agent's transport on loopback: one port for UDP and TCP, its bounds on
connections, keep-alive pings, and streams that cannot be framed or never finish."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from hark.transports.sip import transport as transport_module
from hark.transports.sip.transport import Flow, SipTransport
from tests.transports.sip.captured import BARESIP_OPTIONS

# Long enough for a loaded CI machine; a test that hangs fails instead of stalling the run.
WAIT = 10.0


class Inbox:
    def __init__(self) -> None:
        self.messages: asyncio.Queue[tuple[bytes, Flow]] = asyncio.Queue(maxsize=100)

    def __call__(self, data: bytes, flow: Flow) -> None:
        self.messages.put_nowait((data, flow))

    async def get(self) -> tuple[bytes, Flow]:
        return await asyncio.wait_for(self.messages.get(), WAIT)


@pytest.fixture
async def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
async def sip_transport(inbox: Inbox) -> AsyncIterator[SipTransport]:
    t = SipTransport(inbox, host="127.0.0.1", port=0, max_connections=2)
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), WAIT) == b""


async def test_udp_and_tcp_share_the_port_and_answer_on_the_flow(
    sip_transport: SipTransport, inbox: Inbox
) -> None:
    loop = asyncio.get_running_loop()
    received: asyncio.Queue[bytes] = asyncio.Queue(maxsize=10)

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: object) -> None:
            received.put_nowait(data)

    udp, _ = await loop.create_datagram_endpoint(
        Client, local_addr=("127.0.0.1", 0), remote_addr=("127.0.0.1", sip_transport.port)
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", sip_transport.port)
    try:
        udp.sendto(BARESIP_OPTIONS)
        data, flow = await inbox.get()
        assert data == BARESIP_OPTIONS
        assert flow == Flow("udp", ("127.0.0.1", udp.get_extra_info("sockname")[1]))
        sip_transport.send(flow, b"udp reply")
        assert await asyncio.wait_for(received.get(), WAIT) == b"udp reply"
        # Two messages in one write, the second split: framed by Content-Length.
        writer.write(BARESIP_OPTIONS + BARESIP_OPTIONS[:30])
        writer.write(BARESIP_OPTIONS[30:])
        first, tcp_flow = await inbox.get()
        second, _ = await inbox.get()
        assert first == second == BARESIP_OPTIONS
        assert tcp_flow == Flow("tcp", ("127.0.0.1", writer.get_extra_info("sockname")[1]))
        sip_transport.send(tcp_flow, b"tcp reply")
        assert await asyncio.wait_for(reader.readexactly(9), WAIT) == b"tcp reply"
        # A keep-alive ping (RFC 5626) gets its pong.
        writer.write(b"\r\n\r\n")
        assert await asyncio.wait_for(reader.readexactly(2), WAIT) == b"\r\n"
    finally:
        udp.close()
        writer.close()


async def test_connections_beyond_the_bound_are_closed(sip_transport: SipTransport) -> None:
    kept = [await asyncio.open_connection("127.0.0.1", sip_transport.port) for _ in range(2)]
    reader, writer = await asyncio.open_connection("127.0.0.1", sip_transport.port)
    try:
        assert await _closed_by_server(reader)
        for _, kept_writer in kept:
            kept_writer.write(BARESIP_OPTIONS)
            await kept_writer.drain()
        assert not kept[0][0].at_eof()
    finally:
        writer.close()
        for _, kept_writer in kept:
            kept_writer.close()


async def test_a_stream_that_cannot_be_framed_is_closed(
    sip_transport: SipTransport, inbox: Inbox
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", sip_transport.port)
    try:
        writer.write(BARESIP_OPTIONS.replace(b"Content-Length: 0\r\n", b""))
        assert await _closed_by_server(reader)
        assert inbox.messages.empty()
    finally:
        writer.close()


async def test_a_connection_that_never_completes_a_message_is_closed(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 32 s shortened: what is tested is what happens when it runs out.
    monkeypatch.setattr(transport_module, "FIRST_MESSAGE_TIMEOUT", 0.2)
    t = SipTransport(inbox, host="127.0.0.1", port=0)
    await t.start()
    try:
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", t.port)
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", t.port)
        slow_writer.write(BARESIP_OPTIONS[:40])
        busy_writer.write(BARESIP_OPTIONS)
        await inbox.get()
        assert await _closed_by_server(slow_reader)
        # The connection that sent a message stays, silent as it may be from then on.
        busy_writer.write(BARESIP_OPTIONS)
        assert (await inbox.get())[0] == BARESIP_OPTIONS
        assert not busy_reader.at_eof()
        slow_writer.close()
        busy_writer.close()
    finally:
        await t.stop()


async def test_a_message_to_a_tcp_peer_without_connection_opens_one(
    sip_transport: SipTransport,
) -> None:
    accepted: asyncio.Queue[bytes] = asyncio.Queue(maxsize=10)

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.put_nowait(await reader.readexactly(len(BARESIP_OPTIONS)))
        writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        sip_transport.send(Flow("tcp", ("127.0.0.1", port)), BARESIP_OPTIONS)
        assert await asyncio.wait_for(accepted.get(), WAIT) == BARESIP_OPTIONS
    finally:
        server.close()
        await server.wait_closed()


async def test_one_address_cannot_take_every_connection(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport_module, "MAX_CONNECTIONS_PER_SOURCE", 2)
    t = SipTransport(inbox, host="127.0.0.1", port=0, max_connections=10)
    await t.start()
    writers = []
    try:
        for _ in range(2):
            _, writer = await asyncio.open_connection(
                "127.0.0.1", t.port, local_addr=("127.0.0.1", 0)
            )
            writers.append(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", t.port)
        writers.append(writer)
        assert await _closed_by_server(reader)
        # Another address still gets in, and is heard.
        _, other = await asyncio.open_connection("127.0.0.1", t.port, local_addr=("127.0.0.2", 0))
        writers.append(other)
        other.write(BARESIP_OPTIONS)
        _, flow = await inbox.get()
        assert flow.remote[0] == "127.0.0.2"
    finally:
        for writer in writers:
            writer.close()
        await t.stop()

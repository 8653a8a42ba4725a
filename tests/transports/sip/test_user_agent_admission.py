"""The user agent server with an ``InviteAdmission`` in front, against scripted phones on
loopback (strangers on other 127/8 addresses): who gets a call, who gets 401, 403 or 503
and no call; and where our in-dialog requests go when a caller names somewhere else."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

from hark.transports.sip.admission import InviteAdmission
from hark.transports.sip.message import Response, StreamFramer, parse_message
from hark.transports.sip.trunk import parse_trunks
from tests.transports.sip.test_admission import answer
from tests.transports.sip.test_user_agent import (
    ANSWER,
    RECEIVE_TIMEOUT,
    Dialog,
    Harness,
    Peer,
    _Datagrams,
)

URI = "sip:hark@127.0.0.1"


@contextlib.asynccontextmanager
async def gated(
    trunks: str, rate: float = 100.0, burst: float | None = None
) -> AsyncIterator[Harness]:
    harness = Harness()
    harness.uas.admission = InviteAdmission(parse_trunks(trunks), rate=rate, burst=burst)
    await harness.uas.start()
    try:
        yield harness
    finally:
        await harness.uas.stop()


async def udp_peer(host: str, server_port: int) -> Peer:
    """A UDP phone on ``host`` (any 127/8 address)."""
    loop = asyncio.get_running_loop()
    peer = Peer("udp", 0)
    udp, _ = await loop.create_datagram_endpoint(
        lambda: _Datagrams(peer.inbox), local_addr=(host, 0), remote_addr=("127.0.0.1", server_port)
    )
    peer._udp = udp
    peer.port = udp.get_extra_info("sockname")[1]
    return peer


def dialog_on(peer: Peer, host: str) -> Dialog:
    """A dialog whose Via and Contact name ``host`` (the peer's own address)."""
    dialog = Dialog(peer)
    original = dialog.request

    def request(method: str, **kwargs: object) -> bytes:
        return original(method, **kwargs).replace(  # type: ignore[arg-type]
            b"SIP/2.0/UDP 127.0.0.1:", f"SIP/2.0/UDP {host}:".encode()
        )

    dialog.request = request  # type: ignore[method-assign]
    return dialog


async def test_a_caller_from_an_unlisted_address_is_refused_before_it_rings() -> None:
    async with gated('[{"name": "pbx", "addresses": ["127.0.0.1/32"]}]') as harness:
        stranger = await udp_peer("127.0.0.2", harness.uas.port)
        try:
            stranger.send(dialog_on(stranger, "127.0.0.2").invite())
            # No 100 Trying, no ringing: the final answer straight away.
            await stranger.response(403, "INVITE")
            assert harness.calls.empty()
        finally:
            await stranger.close()
        listed = await Peer.open("udp", harness.uas.port)
        try:
            listed.send(Dialog(listed).invite())
            await listed.response(100)
            call = await harness.call()
            assert call.trunk is not None and call.trunk.name == "pbx"
            call.reject(486)
        finally:
            await listed.close()


async def test_a_caller_answers_the_digest_challenge_and_is_admitted() -> None:
    trunks = '[{"name": "office", "username": "alice", "password": "s3cret"}]'
    async with gated(trunks) as harness:
        phone = await Peer.open("udp", harness.uas.port)
        try:
            dialog = Dialog(phone)
            phone.send(dialog.invite())
            challenge = await phone.response(401, "INVITE")
            offered = challenge.get_all("WWW-Authenticate")
            assert len(offered) == 1
            assert harness.calls.empty()
            phone.send(dialog.request("ACK", to_tag=challenge.to_addr.tag))
            # A wrong password: refused, no call.
            dialog.cseq += 1
            wrong = answer(offered[0], username="alice", password="guess", uri=URI)
            phone.send(dialog.invite(headers=(("Authorization", wrong),)))
            await phone.response(403, "INVITE")
            assert harness.calls.empty()
            dialog.cseq += 1
            right = answer(offered[0], username="alice", password="s3cret", uri=URI, nc="2")
            phone.send(dialog.invite(headers=(("Authorization", right),)))
            await phone.response(100)
            call = await harness.call()
            assert call.trunk is not None and call.trunk.name == "office"
            call.answer(ANSWER)
            await phone.response(200, "INVITE")
        finally:
            await phone.close()


async def test_a_flood_of_invites_from_one_address_gets_503() -> None:
    async with gated("[]", rate=0.01, burst=1.0) as harness:
        phone = await Peer.open("udp", harness.uas.port)
        try:
            phone.send(Dialog(phone).invite())
            await phone.response(100)
            (await harness.call()).reject(486)
            await phone.response(486, "INVITE")
            for _ in range(3):
                phone.send(Dialog(phone).invite())
                busy = await phone.response(503, "INVITE")
                assert int(busy.get("Retry-After") or 0) >= 1
            assert harness.calls.empty()
        finally:
            await phone.close()


async def test_an_unlisted_address_learns_no_methods_or_capabilities() -> None:
    async with gated('[{"name": "pbx", "addresses": ["127.0.0.1/32"]}]') as harness:
        stranger = await udp_peer("127.0.0.2", harness.uas.port)
        try:
            stranger.send(dialog_on(stranger, "127.0.0.2").request("OPTIONS"))
            refused = await stranger.response(403, "OPTIONS")
            assert refused.get_all("Allow") == [] and refused.get("Accept") is None
            # A method hark does not take would be answered 405 with Allow.
            stranger.send(dialog_on(stranger, "127.0.0.2").request("REGISTER"))
            refused = await stranger.response(403, "REGISTER")
            assert refused.get_all("Allow") == []
        finally:
            await stranger.close()
        listed = await Peer.open("udp", harness.uas.port)
        try:
            listed.send(Dialog(listed).request("OPTIONS"))
            ok = await listed.response(200, "OPTIONS")
            assert "INVITE" in ok.get_all("Allow")
            listed.send(Dialog(listed).request("REGISTER"))
            not_allowed = await listed.response(405, "REGISTER")
            assert "INVITE" in not_allowed.get_all("Allow")
        finally:
            await listed.close()


async def test_options_are_challenged_as_invites_are() -> None:
    trunks = '[{"name": "office", "username": "alice", "password": "s3cret"}]'
    async with gated(trunks) as harness:
        phone = await Peer.open("udp", harness.uas.port)
        try:
            dialog = Dialog(phone)
            phone.send(dialog.request("OPTIONS"))
            challenge = await phone.response(401, "OPTIONS")
            assert challenge.get_all("Allow") == []
            (offered,) = challenge.get_all("WWW-Authenticate")
            dialog.cseq += 1
            right = answer(offered, username="alice", password="s3cret", uri=URI, method="OPTIONS")
            phone.send(dialog.request("OPTIONS", headers=(("Authorization", right),)))
            ok = await phone.response(200, "OPTIONS")
            assert "INVITE" in ok.get_all("Allow")
        finally:
            await phone.close()


async def test_options_and_invites_share_one_rate_per_source() -> None:
    async with gated("[]", rate=0.01, burst=1.0) as harness:
        phone = await Peer.open("udp", harness.uas.port)
        try:
            phone.send(Dialog(phone).request("OPTIONS"))
            await phone.response(200, "OPTIONS")
            phone.send(Dialog(phone).request("OPTIONS"))
            busy = await phone.response(503, "OPTIONS")
            assert int(busy.get("Retry-After") or 0) >= 1
            phone.send(Dialog(phone).invite())
            await phone.response(503, "INVITE")
            assert harness.calls.empty()
        finally:
            await phone.close()


class _Listener(asyncio.Protocol):
    """A TCP port that counts the connections it is offered."""

    connections = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _Listener.connections += 1
        transport.close()


async def test_our_bye_follows_the_invites_flow_not_the_contact_the_caller_names() -> None:
    loop = asyncio.get_running_loop()
    # A third party the caller would have us connect to, over TCP.
    third = await loop.create_server(_Listener, "127.0.0.2", 0)
    third_port = third.sockets[0].getsockname()[1]
    _Listener.connections = 0
    async with gated("[]") as harness:
        phone = await Peer.open("udp", harness.uas.port)
        try:
            dialog = Dialog(phone)
            original = dialog.request

            def request(method: str, **kwargs: object) -> bytes:
                data = original(method, **kwargs)  # type: ignore[arg-type]
                contact = f"<sip:alice@127.0.0.1:{phone.port}>".encode()
                aimed = f"<sip:victim@127.0.0.2:{third_port};transport=tcp>".encode()
                return data.replace(contact, aimed)

            dialog.request = request  # type: ignore[method-assign]
            phone.send(dialog.invite())
            await phone.response(100)
            call = await harness.call()
            call.answer(ANSWER)
            dialog.to_tag = (await phone.response(200, "INVITE")).to_addr.tag
            phone.send(dialog.ack())
            await asyncio.wait_for(call.acked.wait(), RECEIVE_TIMEOUT)
            call.hangup()
            # The BYE comes back to where the INVITE came from, over UDP; its Request-URI
            # is still the remote target (§12.2.1.1).
            bye = await phone.request("BYE")
            assert bye.uri == f"sip:victim@127.0.0.2:{third_port};transport=tcp"
            phone.reply(bye, 200)
        finally:
            await phone.close()
    third.close()
    await third.wait_closed()
    assert _Listener.connections == 0


async def test_an_idle_tcp_connection_nothing_uses_is_closed() -> None:
    harness = Harness()
    harness.uas._transport.idle_timeout = 0.2
    await harness.uas.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", harness.uas.port)
        framer = StreamFramer()
        options = (
            "OPTIONS sip:hark@127.0.0.1 SIP/2.0\r\n"
            f"Via: SIP/2.0/TCP 127.0.0.1:5060;branch=z9hG4bK{secrets.token_hex(4)}\r\n"
            "From: <sip:a@127.0.0.1>;tag=1\r\nTo: <sip:hark@127.0.0.1>\r\n"
            "Call-ID: idle\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
        )
        writer.write(options.encode())
        (message,) = framer.feed(await asyncio.wait_for(reader.read(65536), RECEIVE_TIMEOUT))
        response = parse_message(message)
        assert isinstance(response, Response) and response.status == 200
        # One message, then nothing: the connection does not hold its slot for ever.
        async with asyncio.timeout(RECEIVE_TIMEOUT):
            assert await reader.read(65536) == b""
        writer.close()
    finally:
        await harness.uas.stop()

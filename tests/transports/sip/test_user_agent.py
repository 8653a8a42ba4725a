"""The user agent server end to end over loopback UDP and TCP, against a small scripted peer:
calls set up and torn down from both sides, CANCEL, OPTIONS, re-INVITE, REFER with NOTIFY,
INFO, retransmissions, proxies (Record-Route) and NAT (rport), and the error answers."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import logging
import random
import secrets
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hark.transports.sip.message import (
    Request,
    Response,
    StreamFramer,
    build_response,
    parse_message,
    sipfrag_status,
)
from hark.transports.sip.transaction import RFC_TIMERS, Timers
from hark.transports.sip.transport import Flow
from hark.transports.sip.user_agent import IncomingCall, UserAgentServer
from tests.transports.sip.captured import ALL
from tests.transports.sip.test_message import _mutate

# Long enough for a loaded CI machine; a test that hangs fails instead of stalling the run.
RECEIVE_TIMEOUT = 10.0
OFFER = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\n"
)
ANSWER = OFFER.replace("40000", "41000")


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, inbox: asyncio.Queue[bytes]) -> None:
        self.inbox = inbox

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.inbox.put_nowait(data)


class Peer:
    """A scripted SIP phone on loopback: it sends raw requests and reads what comes back."""

    def __init__(self, protocol: str, port: int) -> None:
        self.protocol = protocol
        self.port = port
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1000)
        self._udp: asyncio.DatagramTransport | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, protocol: str, server_port: int, ssl_context: ssl.SSLContext | None = None
    ) -> Peer:
        loop = asyncio.get_running_loop()
        peer = cls(protocol, 0)
        if protocol == "udp":
            udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(peer.inbox),
                local_addr=("127.0.0.1", 0),
                remote_addr=("127.0.0.1", server_port),
            )
            peer._udp = udp
            peer.port = udp.get_extra_info("sockname")[1]
        else:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server_port, ssl=ssl_context
            )
            peer._writer = writer
            peer.port = writer.get_extra_info("sockname")[1]
            peer._reader_task = asyncio.create_task(peer._read(reader))
        return peer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        framer = StreamFramer()
        while chunk := await reader.read(65536):
            for message in framer.feed(chunk):
                self.inbox.put_nowait(message)

    def send(self, data: bytes) -> None:
        if self._udp is not None:
            self._udp.sendto(data)
        else:
            assert self._writer is not None
            self._writer.write(data)

    async def receive(self) -> Request | Response:
        return parse_message(await asyncio.wait_for(self.inbox.get(), RECEIVE_TIMEOUT))

    async def response(self, status: int, method: str | None = None) -> Response:
        message = await self.receive()
        assert isinstance(message, Response), message
        assert message.status == status, (message.status, message.reason)
        if method is not None:
            assert message.cseq.method == method
        return message

    async def request(self, method: str) -> Request:
        message = await self.receive()
        assert isinstance(message, Request), message
        assert message.method == method
        return message

    def reply(self, request: Request, status: int, to_tag: str | None = None) -> None:
        self.send(build_response(request, status, to_tag=to_tag).encode())

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()


@dataclass
class Dialog:
    """The peer's side of one call."""

    peer: Peer
    call_id: str = field(default_factory=lambda: secrets.token_hex(8))
    from_tag: str = field(default_factory=lambda: secrets.token_hex(4))
    to_tag: str | None = None
    cseq: int = 1
    invite_branch: str = ""
    contact_port: int | None = None
    via_port: int | None = None
    rport: bool = True

    def request(
        self,
        method: str,
        *,
        branch: str | None = None,
        cseq: int | None = None,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        to_tag: str | None = None,
    ) -> bytes:
        """A request of the peer in this call; in the dialog once the To tag is known."""
        transport = self.peer.protocol.upper()
        via_port = self.via_port or self.peer.port
        rport = ";rport" if self.rport else ""
        branch = branch or "z9hG4bK" + secrets.token_hex(8)
        tag = to_tag if to_tag is not None else self.to_tag
        contact_port = self.contact_port or self.peer.port
        suffix = "" if self.peer.protocol == "udp" else f";transport={self.peer.protocol}"
        lines = [
            f"{method} sip:hark@127.0.0.1 SIP/2.0",
            f"Via: SIP/2.0/{transport} 127.0.0.1:{via_port};branch={branch}{rport}",
            "Max-Forwards: 70",
            f"From: <sip:alice@127.0.0.1>;tag={self.from_tag}",
            "To: <sip:hark@127.0.0.1>" + (f";tag={tag}" if tag else ""),
            f"Call-ID: {self.call_id}",
            f"CSeq: {cseq if cseq is not None else self.cseq} {method}",
            f"Contact: <sip:alice@127.0.0.1:{contact_port}{suffix}>",
            *(f"{name}: {value}" for name, value in headers),
            f"Content-Length: {len(body)}",
            "",
            "",
        ]
        return "\r\n".join(lines).encode() + body

    def invite(self, *, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
        self.invite_branch = "z9hG4bK" + secrets.token_hex(8)
        return self.request(
            "INVITE",
            branch=self.invite_branch,
            body=OFFER.encode(),
            headers=(("Content-Type", "application/sdp"), *headers),
        )

    def ack(self) -> bytes:
        return self.request("ACK", cseq=self.cseq)

    def next(
        self, method: str, *, body: bytes = b"", headers: tuple[tuple[str, str], ...] = ()
    ) -> bytes:
        """The peer's next request: CSeq one up."""
        self.cseq += 1
        return self.request(method, body=body, headers=headers)


class Harness:
    """A started UserAgentServer whose calls land in a queue, each with a record of events."""

    def __init__(self, timers: Timers = RFC_TIMERS) -> None:
        self.calls: asyncio.Queue[IncomingCall] = asyncio.Queue(maxsize=100)
        self.ended: dict[str, list[str]] = {}
        self.infos: list[tuple[str, bytes]] = []
        self.offers: list[str] = []
        self.reoffer_answer: str | None = ANSWER
        self.uas = UserAgentServer(
            on_invite=self._on_invite, host="127.0.0.1", port=0, timers=timers
        )

    def _on_invite(self, call: IncomingCall) -> None:
        ended = self.ended.setdefault(call.sip_call_id, [])
        call.on_ended = ended.append
        call.on_info = lambda kind, body: self.infos.append((kind, body))
        call.on_reoffer = self._reoffer
        self.calls.put_nowait(call)

    def _reoffer(self, offer: str) -> str | None:
        self.offers.append(offer)
        return self.reoffer_answer

    async def call(self) -> IncomingCall:
        return await asyncio.wait_for(self.calls.get(), RECEIVE_TIMEOUT)


@contextlib.asynccontextmanager
async def running(timers: Timers = RFC_TIMERS) -> AsyncIterator[Harness]:
    h = Harness(timers)
    await h.uas.start()
    try:
        yield h
    finally:
        await h.uas.stop()


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async with running() as h:
        yield h


# T1 as a closed network may set it (RFC 3261 §17.1.1.1): 64·T1 is 1.28 s, not 32 s.
FAST_TIMERS = Timers(t1=0.02)


@pytest.fixture(params=["udp", "tcp"])
async def peer(request: pytest.FixtureRequest, harness: Harness) -> AsyncIterator[Peer]:
    p = await Peer.open(request.param, harness.uas.port)
    try:
        yield p
    finally:
        await p.close()


async def _established(harness: Harness, peer: Peer) -> tuple[Dialog, IncomingCall]:
    """A call rung, answered and acknowledged."""
    dialog = Dialog(peer)
    peer.send(dialog.invite())
    await peer.response(100)
    call = await harness.call()
    call.ringing()
    ringing = await peer.response(180)
    call.answer(ANSWER)
    ok = await peer.response(200, "INVITE")
    assert ok.to_addr.tag == ringing.to_addr.tag
    dialog.to_tag = ok.to_addr.tag
    peer.send(dialog.ack())
    await asyncio.wait_for(call.acked.wait(), RECEIVE_TIMEOUT)
    return dialog, call


async def test_a_call_answered_then_hung_up_by_the_phone(harness: Harness, peer: Peer) -> None:
    dialog = Dialog(peer)
    invite = dialog.invite(headers=(("X-Customer", "42"),))
    peer.send(invite)
    trying = await peer.response(100)
    assert trying.to_addr.tag is None
    call = await harness.call()
    assert call.state == "ringing"
    assert call.sip_call_id == dialog.call_id
    assert call.offer == OFFER
    assert call.remote == ("127.0.0.1", peer.port)
    assert ("X-Customer", "42") in call.headers
    assert call.headers == parse_message(invite).headers
    call.ringing()
    ringing = await peer.response(180)
    assert ringing.to_addr.tag
    call.answer(ANSWER)
    ok = await peer.response(200, "INVITE")
    assert ok.body.decode() == ANSWER and ok.content_type == "application/sdp"
    contact = ok.contact
    assert contact is not None
    assert contact.sip_uri().port == harness.uas.port
    assert call.state == "answered"
    dialog.to_tag = ok.to_addr.tag
    peer.send(dialog.ack())
    await asyncio.wait_for(call.acked.wait(), RECEIVE_TIMEOUT)
    peer.send(dialog.next("BYE"))
    await peer.response(200, "BYE")
    assert call.state == "ended"
    assert harness.ended[dialog.call_id] == ["bye"]
    # The dialog is gone: a second BYE (a new transaction) is not found.
    peer.send(dialog.next("BYE"))
    await peer.response(481, "BYE")


async def test_the_server_hangs_up_with_bye(harness: Harness, peer: Peer) -> None:
    dialog, call = await _established(harness, peer)
    call.hangup()
    bye = await peer.request("BYE")
    assert bye.uri == f"sip:alice@127.0.0.1:{peer.port}" + (
        "" if peer.protocol == "udp" else f";transport={peer.protocol}"
    )
    assert bye.from_addr.tag == dialog.to_tag and bye.to_addr.tag == dialog.from_tag
    assert bye.call_id == dialog.call_id
    assert bye.vias[0].transport == peer.protocol.upper()
    peer.reply(bye, 200)
    assert call.state == "ended"
    assert harness.ended[dialog.call_id] == []
    peer.send(dialog.next("INFO"))
    await peer.response(481, "INFO")


async def test_cancel_before_the_answer(harness: Harness, peer: Peer) -> None:
    dialog = Dialog(peer)
    peer.send(dialog.invite())
    await peer.response(100)
    call = await harness.call()
    call.ringing()
    await peer.response(180)
    cancel = dialog.request("CANCEL", branch=dialog.invite_branch)
    peer.send(cancel)
    await peer.response(200, "CANCEL")
    await peer.response(487, "INVITE")
    assert call.state == "ended"
    assert harness.ended[dialog.call_id] == ["cancelled"]
    # The 487's ACK shares the INVITE's branch and is taken by its transaction.
    peer.send(dialog.request("ACK", branch=dialog.invite_branch, to_tag="x"))
    with pytest.raises(RuntimeError):
        call.answer(ANSWER)
    unknown = Dialog(peer)
    peer.send(unknown.request("CANCEL"))
    await peer.response(481, "CANCEL")


async def test_a_rejected_call(harness: Harness, peer: Peer) -> None:
    dialog = Dialog(peer)
    peer.send(dialog.invite())
    await peer.response(100)
    call = await harness.call()
    call.reject(486)
    busy = await peer.response(486, "INVITE")
    assert busy.reason == "Busy Here" and busy.to_addr.tag
    assert call.state == "ended"
    peer.send(dialog.request("ACK", branch=dialog.invite_branch, to_tag=busy.to_addr.tag))
    dialog.to_tag = busy.to_addr.tag
    peer.send(dialog.next("BYE"))
    await peer.response(481, "BYE")
    second = Dialog(peer)
    peer.send(second.invite())
    await peer.response(100)
    (await harness.call()).hangup()
    await peer.response(480, "INVITE")


async def test_options_are_answered_in_and_out_of_dialogs(harness: Harness, peer: Peer) -> None:
    peer.send(Dialog(peer).request("OPTIONS"))
    ok = await peer.response(200, "OPTIONS")
    assert "INVITE" in ok.get_all("Allow") and "BYE" in ok.get_all("Allow")
    assert ok.get("Accept") == "application/sdp"
    dialog, _ = await _established(harness, peer)
    peer.send(dialog.next("OPTIONS"))
    await peer.response(200, "OPTIONS")


async def test_a_reinvite_is_answered_by_on_reoffer(harness: Harness, peer: Peer) -> None:
    dialog, call = await _established(harness, peer)
    hold = OFFER + "a=sendonly\r\n"
    peer.send(
        dialog.next("INVITE", body=hold.encode(), headers=(("Content-Type", "application/sdp"),))
    )
    ok = await peer.response(200, "INVITE")
    assert ok.body.decode() == ANSWER and ok.to_addr.tag == dialog.to_tag
    assert harness.offers == [hold]
    peer.send(dialog.ack())
    # A session refresh without an offer gets the SDP last sent, and no reoffer.
    peer.send(dialog.next("INVITE"))
    refresh = await peer.response(200, "INVITE")
    assert refresh.body.decode() == ANSWER and harness.offers == [hold]
    peer.send(dialog.ack())
    harness.reoffer_answer = None
    peer.send(dialog.next("INVITE", body=OFFER.encode()))
    await peer.response(488, "INVITE")
    assert call.state == "answered"
    # A request older than the last one is out of order (§12.2.2).
    peer.send(dialog.request("INFO", cseq=1))
    await peer.response(500, "INFO")


async def test_refer_waits_for_the_final_notify(harness: Harness, peer: Peer) -> None:
    dialog, call = await _established(harness, peer)
    transfer = asyncio.create_task(call.refer("sip:bob@example.com"))
    refer = await peer.request("REFER")
    assert refer.get("Refer-To") == "<sip:bob@example.com>"
    assert refer.get("Referred-By") == f"<{refer.from_addr.uri}>"
    assert refer.to_addr.tag == dialog.from_tag
    peer.reply(refer, 202)
    for fragment, state in (
        (b"SIP/2.0 100 Trying\r\n", "active;expires=60"),
        (b"SIP/2.0 200 OK\r\n", "terminated;reason=noresource"),
    ):
        peer.send(
            dialog.next(
                "NOTIFY",
                body=fragment,
                headers=(
                    ("Event", f"refer;id={refer.cseq.number}"),
                    ("Subscription-State", state),
                    ("Content-Type", "message/sipfrag;version=2.0"),
                ),
            )
        )
        await peer.response(200, "NOTIFY")
        assert sipfrag_status(fragment) is not None
    assert await asyncio.wait_for(transfer, RECEIVE_TIMEOUT) == 200
    # A REFER refused outright gives its own status.
    refused = asyncio.create_task(call.refer("tel:+15550100"))
    peer.reply(await peer.request("REFER"), 403)
    assert await asyncio.wait_for(refused, RECEIVE_TIMEOUT) == 403


async def test_info_reaches_on_info(harness: Harness, peer: Peer) -> None:
    dialog, _ = await _established(harness, peer)
    body = b"Signal=5\r\nDuration=160\r\n"
    peer.send(dialog.next("INFO", body=body, headers=(("Content-Type", "application/dtmf-relay"),)))
    await peer.response(200, "INFO")
    assert harness.infos == [("application/dtmf-relay", body)]


async def test_retransmissions_over_udp(harness: Harness) -> None:
    peer = await Peer.open("udp", harness.uas.port)
    try:
        dialog = Dialog(peer)
        invite = dialog.invite()
        peer.send(invite)
        await peer.response(100)
        call = await harness.call()
        peer.send(invite)
        # The retransmitted INVITE gets the last response again, and no second call.
        await peer.response(100)
        call.answer(ANSWER)
        first = await peer.response(200, "INVITE")
        # No ACK yet: the 2xx comes again (timer G from T1) with the same bytes.
        again = await peer.response(200, "INVITE")
        assert again.encode() == first.encode()
        assert harness.calls.empty()
        dialog.to_tag = first.to_addr.tag
        peer.send(dialog.ack())
        await asyncio.wait_for(call.acked.wait(), RECEIVE_TIMEOUT)
        while not peer.inbox.empty():
            await peer.response(200, "INVITE")
        bye = dialog.next("BYE")
        peer.send(bye)
        peer.send(bye)
        assert (await peer.response(200, "BYE")).encode() == (
            await peer.response(200, "BYE")
        ).encode()
        assert harness.ended[dialog.call_id] == ["bye"]
    finally:
        await peer.close()


async def test_no_ack_hangs_up() -> None:
    async with running(FAST_TIMERS) as harness:
        await _no_ack_hangs_up(harness)


async def _no_ack_hangs_up(harness: Harness) -> None:
    peer = await Peer.open("udp", harness.uas.port)
    try:
        dialog = Dialog(peer)
        peer.send(dialog.invite())
        await peer.response(100)
        call = await harness.call()
        call.answer(ANSWER)
        while isinstance(message := await peer.receive(), Response):
            assert message.status == 200
        assert isinstance(message, Request) and message.method == "BYE"
        assert harness.ended[dialog.call_id] == ["no ACK"]
        assert call.state == "ended"
        assert not call.acked.is_set()
    finally:
        await peer.close()


async def test_requests_for_unknown_dialogs_get_481(harness: Harness, peer: Peer) -> None:
    stranger = Dialog(peer, to_tag="nosuchtag")
    for method in ("BYE", "INFO", "NOTIFY", "INVITE"):
        peer.send(stranger.next(method))
        await peer.response(481, method)
    peer.send(Dialog(peer).request("NOTIFY"))
    await peer.response(481, "NOTIFY")


async def test_methods_and_extensions_not_supported(harness: Harness, peer: Peer) -> None:
    dialog = Dialog(peer)
    peer.send(dialog.next("FROBNICATE"))
    assert (await peer.response(501)).get("Allow")
    peer.send(dialog.next("SUBSCRIBE"))
    assert "INVITE" in (await peer.response(405)).get_all("Allow")
    peer.send(dialog.next("REFER"))
    await peer.response(405, "REFER")
    peer.send(Dialog(peer).invite(headers=(("Require", "100rel"),)))
    unsupported = await peer.response(420, "INVITE")
    assert unsupported.get("Unsupported") == "100rel"
    assert harness.calls.empty()


async def test_malformed_requests(harness: Harness, peer: Peer) -> None:
    dialog = Dialog(peer)
    bad_cseq = dialog.request("OPTIONS").replace(b"CSeq: 1 OPTIONS", b"CSeq: one OPTIONS")
    peer.send(bad_cseq)
    refused = await peer.response(400)
    assert refused.reason.startswith("Bad Request")
    broken_header = dialog.request("OPTIONS").replace(b"Max-Forwards: 70", b"Max Forwards 70")
    peer.send(broken_header)
    await peer.response(400, "OPTIONS")
    unclosed_to = dialog.request("OPTIONS").replace(
        b"To: <sip:hark@127.0.0.1>", b"To: <sip:hark@127.0.0.1"
    )
    peer.send(unclosed_to)
    await peer.response(400, "OPTIONS")
    no_contact = Dialog(peer).invite().replace(b"Contact:", b"X-Not-Contact:")
    peer.send(no_contact)
    await peer.response(400, "INVITE")
    if peer.protocol == "udp":
        # Garbage that cannot be answered is dropped; the server goes on answering.
        peer.send(b"\x00\xff garbage \r\n\r\n")
        peer.send(b"INVITE sip:x SIP/2.0\r\nVia: nonsense\r\n\r\n")
    peer.send(dialog.next("OPTIONS"))
    await peer.response(200, "OPTIONS")
    assert harness.calls.empty()


async def test_a_request_through_a_proxy_and_a_nat(harness: Harness) -> None:
    proxy = await Peer.open("udp", harness.uas.port)
    try:
        # The phone's Contact and Via name an address that cannot be reached (behind the
        # proxy); responses follow Via's received/rport, the BYE follows Record-Route.
        dialog = Dialog(proxy, contact_port=9, via_port=5999)
        record_route = f"<sip:127.0.0.1:{proxy.port};lr>"
        proxy.send(dialog.invite(headers=(("Record-Route", record_route),)))
        trying = await proxy.response(100)
        assert trying.vias[0].params["rport"] == str(proxy.port)
        assert trying.vias[0].params["received"] == "127.0.0.1"
        call = await harness.call()
        call.answer(ANSWER)
        ok = await proxy.response(200, "INVITE")
        assert ok.get_all("Record-Route") == [record_route]
        dialog.to_tag = ok.to_addr.tag
        proxy.send(dialog.ack())
        await asyncio.wait_for(call.acked.wait(), RECEIVE_TIMEOUT)
        call.hangup()
        bye = await proxy.request("BYE")
        assert bye.uri == "sip:alice@127.0.0.1:9"
        assert bye.get_all("Route") == [record_route]
        proxy.reply(bye, 200)
    finally:
        await proxy.close()


async def test_a_natted_phone_without_proxy_gets_its_bye_where_it_is(harness: Harness) -> None:
    phone = await Peer.open("udp", harness.uas.port)
    try:
        dialog = Dialog(phone, contact_port=9, via_port=5999)
        phone.send(dialog.invite())
        await phone.response(100)
        call = await harness.call()
        call.answer(ANSWER)
        dialog.to_tag = (await phone.response(200, "INVITE")).to_addr.tag
        phone.send(dialog.ack())
        await asyncio.wait_for(call.acked.wait(), RECEIVE_TIMEOUT)
        call.hangup()
        bye = await phone.request("BYE")
        assert bye.uri == "sip:alice@127.0.0.1:9"
    finally:
        await phone.close()


async def test_a_merged_request_is_a_loop(harness: Harness) -> None:
    peer = await Peer.open("udp", harness.uas.port)
    try:
        dialog = Dialog(peer)
        peer.send(dialog.invite())
        await peer.response(100)
        peer.send(dialog.invite())
        await peer.response(482, "INVITE")
        (await harness.call()).reject()
        await peer.response(603, "INVITE")
    finally:
        await peer.close()


async def test_nothing_a_callback_raises_stops_the_server(harness: Harness) -> None:
    def explode(call: IncomingCall) -> None:
        raise RuntimeError("a bug in the owner")

    harness.uas._on_invite = explode
    peer = await Peer.open("udp", harness.uas.port)
    try:
        peer.send(Dialog(peer).invite())
        await peer.response(100)
        await peer.response(500, "INVITE")
        peer.send(Dialog(peer).request("OPTIONS"))
        await peer.response(200, "OPTIONS")
    finally:
        await peer.close()


async def test_thousands_of_mutated_messages_never_break_the_server(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(15)
    answers = iter(rng.choice("rax-") for _ in range(100000))

    def on_invite(call: IncomingCall) -> None:
        action = next(answers)
        if action == "r":
            call.ringing()
        elif action == "a":
            call.answer(ANSWER)
        elif action == "x":
            call.reject(486)

    peer = await Peer.open("udp", harness.uas.port)
    try:
        dialog, _ = await _established(harness, peer)
        harness.uas._on_invite = on_invite
        live = [dialog.next(m) for m in ("INFO", "NOTIFY", "INVITE", "OPTIONS", "BYE")]
        seeds = [*ALL, *live]
        # Responses go to a port nobody listens on: what matters is the server's side.
        nowhere = Flow("udp", ("127.0.0.1", 9))
        with caplog.at_level(logging.WARNING, logger="hark.transports.sip"):
            for i in range(4000):
                harness.uas._on_message(_mutate(rng, seeds[i % len(seeds)]), nowhere)
                if i % 200 == 0:
                    await asyncio.sleep(0)
        # The stack's own records only: the garbage collector may log for an earlier test's
        # event loop meanwhile.
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [r for r in errors if r.name.startswith("hark.transports.sip")] == []
        # Still answering.
        peer.send(Dialog(peer).request("OPTIONS"))
        while (await peer.receive()).cseq.method != "OPTIONS":
            pass
    finally:
        await peer.close()


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made for this test."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hark test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_a_call_over_tls(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))
    harness = Harness()
    harness.uas = UserAgentServer(
        on_invite=harness._on_invite,
        host="127.0.0.1",
        port=0,
        tls_port=0,
        ssl_context=server_context,
    )
    await harness.uas.start()
    assert harness.uas.tls_port not in (None, 0, harness.uas.port)
    assert harness.uas.tls_port is not None
    peer = await Peer.open("tls", harness.uas.tls_port, client_context)
    try:
        dialog, call = await _established(harness, peer)
        call.hangup()
        bye = await peer.request("BYE")
        assert bye.vias[0].transport == "TLS"
        assert bye.vias[0].port == harness.uas.tls_port
        peer.reply(bye, 200)
        peer.send(dialog.next("OPTIONS"))
        await peer.response(481, "OPTIONS")
        peer.send(Dialog(peer).request("OPTIONS"))
        await peer.response(200, "OPTIONS")
    finally:
        await peer.close()
        await harness.uas.stop()


async def test_a_bye_on_the_early_dialog_ends_the_invite(harness: Harness, peer: Peer) -> None:
    dialog = Dialog(peer)
    peer.send(dialog.invite())
    await peer.response(100)
    call = await harness.call()
    call.ringing()
    dialog.to_tag = (await peer.response(180)).to_addr.tag
    peer.send(dialog.next("BYE"))
    await peer.response(200, "BYE")
    await peer.response(487, "INVITE")
    assert harness.ended[dialog.call_id] == ["bye"]


async def test_a_hangup_before_the_ack_waits_for_it(harness: Harness, peer: Peer) -> None:
    dialog = Dialog(peer)
    peer.send(dialog.invite())
    await peer.response(100)
    call = await harness.call()
    call.answer(ANSWER)
    dialog.to_tag = (await peer.response(200, "INVITE")).to_addr.tag
    # A reINVITE before the ACK finds the INVITE unfinished (§14.2).
    peer.send(dialog.next("INVITE", body=OFFER.encode()))
    pending = await peer.response(500, "INVITE")
    assert pending.get("Retry-After") is not None
    call.hangup()
    assert call.state == "ended"
    # §15: the BYE goes out only once the 2xx is acknowledged.
    peer.send(dialog.request("ACK", cseq=1))
    while isinstance(message := await peer.receive(), Response):
        assert message.cseq.method == "INVITE"
    assert isinstance(message, Request) and message.method == "BYE"
    assert harness.ended[dialog.call_id] == []


async def test_a_refer_without_final_notify_times_out() -> None:
    async with running(FAST_TIMERS) as harness:
        peer = await Peer.open("udp", harness.uas.port)
        try:
            await _a_refer_without_final_notify_times_out(harness, peer)
        finally:
            await peer.close()


async def _a_refer_without_final_notify_times_out(harness: Harness, peer: Peer) -> None:
    _, call = await _established(harness, peer)
    transfer = asyncio.create_task(call.refer("sip:bob@example.com"))
    peer.reply(await peer.request("REFER"), 202)
    with pytest.raises(TimeoutError):
        await transfer
    # The transfer is over: another may start; the call ending before the REFER is taken
    # fails it at once.
    transfer = asyncio.create_task(call.refer("sip:carol@example.com"))
    await peer.request("REFER")
    call.hangup()
    with pytest.raises(RuntimeError):
        await transfer


def _notify(dialog: Dialog, fragment: bytes, state: str) -> bytes:
    return dialog.next(
        "NOTIFY",
        body=fragment,
        headers=(
            ("Event", "refer"),
            ("Subscription-State", state),
            ("Content-Type", "message/sipfrag"),
        ),
    )


async def test_a_transferee_hanging_up_after_the_refer_still_reports(
    harness: Harness, peer: Peer
) -> None:
    dialog, call = await _established(harness, peer)
    transfer = asyncio.create_task(call.refer("sip:bob@example.com"))
    peer.reply(await peer.request("REFER"), 202)
    # As baresip does: BYE at once, the outcome of the transfer in NOTIFYs after it.
    peer.send(dialog.next("BYE"))
    await peer.response(200, "BYE")
    assert call.state == "ended" and harness.ended[dialog.call_id] == ["bye"]
    peer.send(dialog.next("INFO"))
    await peer.response(481, "INFO")
    peer.send(_notify(dialog, b"SIP/2.0 180 Ringing\r\n", "active;expires=60"))
    await peer.response(200, "NOTIFY")
    assert not transfer.done()
    peer.send(_notify(dialog, b"SIP/2.0 200 OK\r\n", "terminated;reason=noresource"))
    await peer.response(200, "NOTIFY")
    assert await asyncio.wait_for(transfer, RECEIVE_TIMEOUT) == 200
    peer.send(_notify(dialog, b"SIP/2.0 200 OK\r\n", "terminated"))
    await peer.response(481, "NOTIFY")


async def test_a_subscription_ended_without_outcome_gives_the_last_status(
    harness: Harness, peer: Peer
) -> None:
    dialog, call = await _established(harness, peer)
    transfer = asyncio.create_task(call.refer("sip:bob@example.com"))
    peer.reply(await peer.request("REFER"), 202)
    peer.send(_notify(dialog, b"SIP/2.0 100 Trying\r\n", "terminated;reason=deactivated"))
    await peer.response(200, "NOTIFY")
    assert await asyncio.wait_for(transfer, RECEIVE_TIMEOUT) == 100

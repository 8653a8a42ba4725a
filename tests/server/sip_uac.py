"""A small SIP caller (UAC) over loopback UDP for the call-control tests: it places an
INVITE with a G.711 offer, acknowledges the final answer, and answers what the server sends
in the dialog (BYE, REFER, NOTIFY's counterpart). It is written from RFC 3261 directly and
shares no code with hark's SIP stack, so that it checks the stack rather than mirrors it: it
reads messages with the bench's SIP caller's parser (``hark.bench.sip.SipMessage``); the
real softphones and SIPp live in tests/transports/sip."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from hark.bench.sip import SipMessage, dtmf_packets, tag_of, uri_of


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, queue: asyncio.Queue[tuple[bytes, tuple[str, int]]]) -> None:
        self.queue = queue

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if not self.queue.full():
            self.queue.put_nowait((data, addr))


@dataclass
class Uac:
    """One caller: a SIP socket and an RTP socket on loopback."""

    server: tuple[str, int]
    sip: asyncio.DatagramTransport
    rtp: asyncio.DatagramTransport
    messages: asyncio.Queue[tuple[bytes, tuple[str, int]]]
    rtp_in: asyncio.Queue[tuple[bytes, tuple[str, int]]]
    call_id: str = field(default_factory=lambda: secrets.token_hex(8) + "@127.0.0.1")
    from_tag: str = field(default_factory=lambda: secrets.token_hex(4))
    to_tag: str = ""
    remote_target: str = ""
    cseq: int = 1
    invite_branch: str = ""
    answer: str = ""
    # Requests the server sent that a test has not taken yet.
    requests: list[SipMessage] = field(default_factory=list)
    provisional: list[int] = field(default_factory=list)
    answered_with: SipMessage | None = None

    @property
    def port(self) -> int:
        """The caller's SIP port."""
        return int(self.sip.get_extra_info("sockname")[1])

    @property
    def rtp_port(self) -> int:
        """The caller's RTP port (in its offer)."""
        return int(self.rtp.get_extra_info("sockname")[1])

    def offer(self) -> str:
        """PCMU, PCMA and telephone-event, as a desk phone offers them."""
        return (
            "v=0\r\n"
            f"o=uac 1 1 IN IP4 127.0.0.1\r\n"
            "s=call\r\n"
            "c=IN IP4 127.0.0.1\r\n"
            "t=0 0\r\n"
            f"m=audio {self.rtp_port} RTP/AVP 0 8 101\r\n"
            "a=rtpmap:0 PCMU/8000\r\n"
            "a=rtpmap:8 PCMA/8000\r\n"
            "a=rtpmap:101 telephone-event/8000\r\n"
            "a=fmtp:101 0-16\r\n"
            "a=ptime:20\r\n"
            "a=sendrecv\r\n"
        )

    def _send(self, text: str, body: bytes = b"") -> None:
        self.sip.sendto(text.encode() + b"\r\n" + body, self.server)

    def _via(self, branch: str) -> str:
        return f"SIP/2.0/UDP 127.0.0.1:{self.port};branch={branch};rport"

    def _from(self) -> str:
        return f"<sip:caller@127.0.0.1:{self.port}>;tag={self.from_tag}"

    def _to(self) -> str:
        tag = f";tag={self.to_tag}" if self.to_tag else ""
        return f"<sip:hark@{self.server[0]}:{self.server[1]}>{tag}"

    def invite(self, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Send the INVITE (with the offer and any ``headers`` added)."""
        self.invite_branch = "z9hG4bK" + secrets.token_hex(8)
        body = self.offer().encode()
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
        self._send(
            f"INVITE sip:hark@{self.server[0]}:{self.server[1]} SIP/2.0\r\n"
            f"Via: {self._via(self.invite_branch)}\r\n"
            "Max-Forwards: 70\r\n"
            f"From: {self._from()}\r\n"
            f"To: {self._to()}\r\n"
            f"Call-ID: {self.call_id}\r\n"
            f"CSeq: {self.cseq} INVITE\r\n"
            f"Contact: <sip:caller@127.0.0.1:{self.port}>\r\n"
            f"{extra}"
            "Content-Type: application/sdp\r\n"
            f"Content-Length: {len(body)}\r\n",
            body,
        )

    async def receive(self, timeout_s: float = 30.0) -> SipMessage:
        """The next message from the server; requests are answered as a phone would."""
        data, _ = await asyncio.wait_for(self.messages.get(), timeout_s)
        return SipMessage.parse(data)

    async def final(self, timeout_s: float = 30.0, *, ack: bool = True) -> SipMessage:
        """The INVITE's final response, acknowledged (a 2xx only if ``ack``: ``send_ack``
        does it later); the provisional statuses before it go to ``provisional``."""
        while True:
            message = await self.receive(timeout_s)
            if not message.is_response:
                self.requests.append(message)
                continue
            if message.method != "INVITE":
                continue
            if message.status < 200:
                self.provisional.append(message.status)
                continue
            self.to_tag = tag_of(message.header("to"))
            if message.status < 300:
                self.remote_target = uri_of(message.header("contact"))
                self.answer = message.body.decode()
                self.answered_with = message
                if ack:
                    self._ack(message)
            else:
                self._ack_error(message)
            return message

    async def final_response(self, method: str, timeout_s: float = 30.0) -> SipMessage:
        """The final response to the in-dialog request ``method`` the caller sent."""
        while True:
            message = await self.receive(timeout_s)
            if not message.is_response:
                self.requests.append(message)
            elif message.method == method and message.status >= 200:
                return message

    def send_ack(self) -> None:
        """Acknowledge the 2xx that ``final(ack=False)`` left unacknowledged."""
        assert self.answered_with is not None
        self._ack(self.answered_with)

    def _ack(self, response: SipMessage) -> None:
        # A 2xx's ACK is a request of its own: a new branch, to the remote target.
        self._send(
            f"ACK {uri_of(response.header('contact'))} SIP/2.0\r\n"
            f"Via: {self._via('z9hG4bK' + secrets.token_hex(8))}\r\n"
            "Max-Forwards: 70\r\n"
            f"From: {self._from()}\r\n"
            f"To: {response.header('to')}\r\n"
            f"Call-ID: {self.call_id}\r\n"
            f"CSeq: {self.cseq} ACK\r\n"
            "Content-Length: 0\r\n"
        )
        # Its microphone starts, as a phone's does: the server sends RTP only to where the
        # caller's comes from, once it has come.
        silence = struct.pack("!BBHII", 0x80, 0, 999, 999 * 160, 0x1234) + b"\xff" * 160
        self.rtp.sendto(silence, self.server_rtp())

    def _ack_error(self, response: SipMessage) -> None:
        # A non-2xx's ACK belongs to the INVITE's transaction: same branch, same URI.
        self._send(
            f"ACK sip:hark@{self.server[0]}:{self.server[1]} SIP/2.0\r\n"
            f"Via: {self._via(self.invite_branch)}\r\n"
            "Max-Forwards: 70\r\n"
            f"From: {self._from()}\r\n"
            f"To: {response.header('to')}\r\n"
            f"Call-ID: {self.call_id}\r\n"
            f"CSeq: {self.cseq} ACK\r\n"
            "Content-Length: 0\r\n"
        )

    async def request(self, method: str, timeout_s: float = 30.0) -> SipMessage:
        """The next request ``method`` the server sends in the dialog, answered 200 (202
        for a REFER)."""
        while True:
            for message in self.requests:
                if message.method == method:
                    self.requests.remove(message)
                    self.respond(message, 202 if method == "REFER" else 200)
                    return message
            message = await self.receive(timeout_s)
            if not message.is_response:
                self.requests.append(message)

    def respond(self, request: SipMessage, status: int) -> None:
        """Answer a request from the server."""
        reason = {200: "OK", 202: "Accepted"}.get(status, "Error")
        vias = "".join(f"Via: {via}\r\n" for via in request.all("via"))
        self._send(
            f"SIP/2.0 {status} {reason}\r\n"
            f"{vias}"
            f"From: {request.header('from')}\r\n"
            f"To: {request.header('to')}\r\n"
            f"Call-ID: {request.header('call-id')}\r\n"
            f"CSeq: {request.header('cseq')}\r\n"
            "Content-Length: 0\r\n"
        )

    def in_dialog(
        self, method: str, body: bytes = b"", headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """Send a request in the dialog (BYE, INFO, NOTIFY …)."""
        self.cseq += 1
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
        self._send(
            f"{method} {self.remote_target} SIP/2.0\r\n"
            f"Via: {self._via('z9hG4bK' + secrets.token_hex(8))}\r\n"
            "Max-Forwards: 70\r\n"
            f"From: {self._from()}\r\n"
            f"To: {self._to()}\r\n"
            f"Call-ID: {self.call_id}\r\n"
            f"CSeq: {self.cseq} {method}\r\n"
            f"{extra}"
            f"Content-Length: {len(body)}\r\n",
            body,
        )

    def notify_transfer(self, refer: SipMessage, status_line: str) -> None:
        """Report a transfer's progress as a ``message/sipfrag`` NOTIFY (RFC 3515)."""
        final = int(status_line.split()[1]) >= 200
        state = "terminated;reason=noresource" if final else "active"
        self.in_dialog(
            "NOTIFY",
            status_line.encode() + b"\r\n",
            (
                ("Event", "refer"),
                ("Subscription-State", state),
                ("Content-Type", "message/sipfrag;version=2.0"),
            ),
        )

    def server_rtp(self) -> tuple[str, int]:
        """Where the answer says the server takes RTP."""
        address, port = "", 0
        for line in self.answer.splitlines():
            if line.startswith("c=IN IP4 "):
                address = line.split()[2]
            elif line.startswith("m=audio "):
                port = int(line.split()[1])
        return address, port

    def send_dtmf(self, digit: str, seq: int = 1000) -> None:
        """Press a key (RFC 4733 packets to the server's RTP port)."""
        for packet in dtmf_packets(digit, ssrc=0x1234, seq=seq, timestamp=seq * 160):
            self.rtp.sendto(packet, self.server_rtp())

    async def next_rtp(self, timeout_s: float = 30.0) -> bytes:
        """The next RTP packet from the server."""
        data, _ = await asyncio.wait_for(self.rtp_in.get(), timeout_s)
        return data


@contextlib.asynccontextmanager
async def uac(server: tuple[str, int]) -> AsyncIterator[Uac]:
    """A caller with its SIP and RTP sockets on 127.0.0.1, closed afterwards."""
    loop = asyncio.get_running_loop()
    messages: asyncio.Queue[tuple[bytes, tuple[str, int]]] = asyncio.Queue(1000)
    rtp_in: asyncio.Queue[tuple[bytes, tuple[str, int]]] = asyncio.Queue(10000)
    sip, _ = await loop.create_datagram_endpoint(
        lambda: _Endpoint(messages), local_addr=("127.0.0.1", 0)
    )
    rtp, _ = await loop.create_datagram_endpoint(
        lambda: _Endpoint(rtp_in), local_addr=("127.0.0.1", 0)
    )
    try:
        yield Uac(server, sip, rtp, messages, rtp_in)
    finally:
        sip.close()
        rtp.close()

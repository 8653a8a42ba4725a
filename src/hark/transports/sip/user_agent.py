"""The SIP user agent server: incoming calls over UDP, TCP and TLS (RFC 3261 UAS core).

``UserAgentServer`` ties the transport to the sans-I/O parts: each message is parsed,
matched to its server or client transaction (``transaction.py``) or to a dialog
(``dialog.py``), and answered; transactions' timers run on the event loop's clock. Every
new INVITE becomes an ``IncomingCall`` handed to ``on_invite`` after 100 Trying; its owner
rings, answers, rejects, transfers (REFER) and hangs up through it, and hears of the peer's
BYE, CANCEL, re-INVITE and INFO through its callbacks.

What the server answers by itself: OPTIONS (200 with Allow and Accept), CANCEL (200, and
487 to the INVITE it cancels), requests for dialogs it does not know (481), methods it
knows but does not take (405 with Allow) or does not know (501), Require'd extensions
(420), URI schemes other than sip/sips/tel (416), merged requests of a forking proxy (482),
and malformed requests (400, when Via, From, To, Call-ID and CSeq can still be read;
otherwise they are dropped). Nothing a peer sends, and nothing a callback raises, gets out
of the message handler.

New INVITEs pass an ``InviteAdmission`` first (``admission.py``: the per-source rate
limit, the inbound trunks, a trunk's TLS client certificate, digest authentication): one it
refuses is answered statelessly (403, 401 with a challenge, 503 with Retry-After) and never
becomes a call, so a stranger costs no transaction, no ring and no webhook. Every other
request outside a dialog (OPTIONS, and methods answered 405 or 501) passes the same gate
first, less the dialled numbers, as Asterisk challenges OPTIONS as it does INVITE and
Kamailio's ``pike`` counts every request: a scanner at an address no trunk lists learns no
methods or capabilities, and all of a source's requests share its rate.

In-dialog requests of ours (BYE, REFER) go back along the INVITE's own flow: on its
connection (TCP, TLS) or to the address and port it came from (UDP), never to a host or
transport the peer's Contact or Record-Route names, so that a caller cannot aim our
requests at a third party. When the INVITE's connection has closed, the next hop's port is
used only on the INVITE's own address and transport.

A transfer (``IncomingCall.refer``) is a REFER and the implicit subscription it creates
(RFC 3515): its outcome comes in NOTIFYs, which may still arrive after the transferee has
hung up (many phones do so as soon as they take the REFER); the dialog stays for them until
``refer`` returns, answering 481 to anything but NOTIFY meanwhile.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hark.transports.sip.admission import InviteAdmission, Verdict
from hark.transports.sip.dialog import Dialog, incoming_dialog_id, new_branch, new_tag
from hark.transports.sip.message import (
    Request,
    Response,
    SipParseError,
    SipUri,
    Via,
    build_response,
    canonical_name,
    format_host,
    parse_message,
    sipfrag_status,
)
from hark.transports.sip.transaction import (
    RFC_TIMERS,
    ClientTransaction,
    InviteServerTransaction,
    ServerTransaction,
    Timers,
    TransactionKey,
    client_key,
    server_key,
)
from hark.transports.sip.transport import (
    DEFAULT_PORT,
    Flow,
    SipTransport,
    TransportName,
    response_flow,
    stamp_received,
)
from hark.transports.sip.trunk import InboundTrunk

logger = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY"
# Methods of SIP extensions this UAS knows of and does not take: 405, not 501 (§21.4.6).
_KNOWN_NOT_ALLOWED = frozenset(
    {"REGISTER", "SUBSCRIBE", "REFER", "UPDATE", "PRACK", "MESSAGE", "PUBLISH"}
)
_URI_SCHEMES = frozenset({"sip", "sips", "tel"})
# The bound on live transactions: beyond it new requests get 503 without one.
MAX_TRANSACTIONS = 20000
_DEFAULT_TLS_PORT = 5061
# The user part of our Contact; user_agent (the Server and User-Agent headers) may be any
# text, a URI may not.
_CONTACT_USER = "hark"

CallState = Literal["ringing", "answered", "ended"]
ServerTx = InviteServerTransaction | ServerTransaction
_MANDATORY = ("via", "from", "to", "call-id", "cseq")
_START_LINE = re.compile(r"^([A-Za-z]+) \S+ SIP/2\.0$")
_SALVAGE_LINES = 64
_PROTOCOLS: dict[str, TransportName] = {"udp": "udp", "tcp": "tcp", "tls": "tls"}


@dataclass(eq=False)
class _Entry:
    """A live transaction with where its messages go and its armed timer."""

    key: TransactionKey
    tx: InviteServerTransaction | ServerTransaction | ClientTransaction
    flow: Flow
    timer: asyncio.TimerHandle | None = None
    call: IncomingCall | None = None
    on_final: Callable[[Response | None], None] | None = None


class IncomingCall:
    """An INVITE received, and the dialog it makes once answered.

    ``sip_call_id``, ``headers`` (as received, in order), ``offer`` (the SDP, "" when
    none), ``remote`` (the INVITE's source address) and ``trunk`` (the inbound trunk that
    admitted it; None when no trunks are configured) describe it; ``state`` is
    "ringing" until answered or ended. The callbacks are set by the owner: ``on_ended``
    (BYE or CANCEL from the peer, or a timeout; not called for the owner's own ``reject``
    or ``hangup``), ``on_reoffer`` (a re-INVITE's offer → the answer SDP, or None for 488;
    a re-INVITE without an offer gets the last SDP sent, without a call)
    and ``on_info`` (an INFO's media type and body; answered 200 either way). ``acked`` is
    set when the peer's ACK of the answer arrives.
    """

    def __init__(
        self,
        uas: UserAgentServer,
        entry: _Entry,
        invite: Request,
        headers: list[tuple[str, str]],
        flow: Flow,
        dialog: Dialog,
        trunk: InboundTrunk | None = None,
    ) -> None:
        self.sip_call_id = invite.call_id
        self.headers = headers
        self.offer = invite.body.decode("utf-8", "replace")
        self.remote = flow.remote
        self.trunk = trunk
        self.state: CallState = "ringing"
        self.on_ended: Callable[[str], None] | None = None
        self.on_reoffer: Callable[[str], str | None] | None = None
        self.on_info: Callable[[str, bytes], None] | None = None
        self._uas = uas
        self._invite = entry
        self._flow = flow
        self._dialog = dialog
        self._hangup_after_ack = False
        self._local_sdp = ""
        self._refer: asyncio.Future[int] | None = None
        # The peer took the REFER (2xx): its NOTIFYs may outlive the call (see _ended_by_peer).
        self._refer_accepted = False
        self._refer_last = 0
        # Set when the peer acknowledges the answer: its media path is up from then on.
        self.acked = asyncio.Event()

    @property
    def secure(self) -> bool:
        """Whether the INVITE came over TLS (where SRTP keys may travel in its SDP)."""
        return self._flow.protocol == "tls"

    def ringing(self) -> None:
        """Send 180 Ringing (nothing once answered or ended)."""
        if self.state == "ringing":
            self._uas._respond_invite(self, 180)

    def answer(self, sdp: str) -> None:
        """Send 200 OK with the SDP answer; it is retransmitted until the peer's ACK.

        With no ACK in 32 s the call is hung up (BYE) and ends with "no ACK".
        """
        if self.state != "ringing":
            raise RuntimeError(f"cannot answer a call that is {self.state}")
        self.state = "answered"
        self._dialog.state = "confirmed"
        self._local_sdp = sdp
        self._uas._respond_invite(self, 200, body=sdp.encode())

    def reject(self, status: int = 603, reason: str | None = None) -> None:
        """Refuse the call with a final error status (486 Busy Here, 603 Decline …)."""
        if not 300 <= status < 700:
            raise ValueError(f"a rejection needs a status from 300 to 699, not {status}")
        if self.state != "ringing":
            return
        self.state = "ended"
        self._uas._respond_invite(self, status, reason)
        self._uas._forget_call(self)

    def hangup(self) -> None:
        """End the call: BYE once answered (after the ACK), 480 before the answer."""
        if self.state == "ringing":
            self.reject(480)
            return
        if self.state != "answered":
            return
        self.state = "ended"
        self._fail_refer(RuntimeError("the call ended"))
        tx = self._invite.tx
        unacknowledged = isinstance(tx, InviteServerTransaction) and not tx.acknowledged
        if unacknowledged and tx.state == "accepted":
            # §15: no BYE before the 2xx's ACK (or its timeout) on a confirmed dialog.
            self._hangup_after_ack = True
            return
        self._uas._send_bye(self)

    async def refer(self, target_uri: str) -> int:
        """Ask the peer to call ``target_uri`` (REFER with Refer-To and Referred-By).

        Returns the final status the peer reports in its NOTIFYs (200 when the transfer
        succeeded), or the REFER's own error status. TimeoutError after 64·T1 (32 s) without one;
        RuntimeError when the call is not answered, ends meanwhile, or is being transferred
        already; SipParseError when ``target_uri`` is not a URI.
        """
        if self.state != "answered":
            raise RuntimeError(f"cannot transfer a call that is {self.state}")
        if self._refer is not None and not self._refer.done():
            raise RuntimeError("a transfer of this call is already under way")
        SipUri.parse(target_uri)
        self._refer = asyncio.get_running_loop().create_future()
        self._refer_accepted = False
        self._refer_last = 0
        future = self._refer
        self._uas._send_in_dialog(
            self,
            self._dialog.create_refer(target_uri, via=self._uas._via(self._flow)),
            self._refer_answered,
        )
        try:
            return await asyncio.wait_for(future, self._uas.timers.timeout)
        finally:
            self._refer = None
            if self.state == "ended":
                self._uas._forget_call(self)

    def _refer_answered(self, response: Response | None) -> None:
        if self._refer is None or self._refer.done():
            return
        if response is None:
            self._refer.set_exception(TimeoutError("no answer to the REFER"))
        elif response.status >= 300:
            self._refer.set_result(response.status)
        else:
            self._refer_accepted = True

    def _refer_progress(self, status: int | None, terminated: bool) -> None:
        """A NOTIFY of the transfer: a final status ends the wait, and so does the end of
        the subscription, with the last status reported (the outcome is unknown then)."""
        if self._refer is None or self._refer.done():
            return
        if status is not None:
            self._refer_last = status
        if status is not None and status >= 200:
            self._refer.set_result(status)
        elif terminated:
            self._refer.set_result(self._refer_last)

    def _awaits_notify(self) -> bool:
        return self._refer is not None and not self._refer.done() and self._refer_accepted

    def _fail_refer(self, exc: Exception) -> None:
        if self._refer is not None and not self._refer.done():
            self._refer.set_exception(exc)

    def _ended_by_peer(self, reason: str) -> None:
        self.state = "ended"
        # A transferee often hangs up as soon as it has taken the REFER; the transfer's
        # subscription then keeps the dialog for its NOTIFYs (RFC 5057) until refer() ends.
        if not self._awaits_notify():
            self._fail_refer(RuntimeError("the call ended"))
            self._uas._forget_call(self)
        if self.on_ended is not None:
            try:
                self.on_ended(reason)
            except Exception:
                logger.exception("sip: on_ended failed")


class UserAgentServer:
    """The SIP UAS of a worker: listens, answers, and hands each new call to ``on_invite``.

    ``port`` is the bound UDP and TCP port once started (``port=0`` picks one);
    ``tls_port`` the TLS one, when an ``ssl_context`` is given. ``advertise_ip`` is the
    address put in Via and Contact (by default, the local address the peer reaches);
    ``user_agent`` the Server and User-Agent headers. An ``ssl_context`` without a
    ``tls_port`` listens for TLS on 5061. ``timers`` are the transactions' (and a REFER's
    wait for its outcome). ``admission`` decides which new INVITEs may become calls (None:
    all of them).
    """

    def __init__(
        self,
        *,
        on_invite: Callable[[IncomingCall], None],
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        advertise_ip: str | None = None,
        tls_port: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
        user_agent: str = "hark",
        timers: Timers = RFC_TIMERS,
        admission: InviteAdmission | None = None,
    ) -> None:
        self._on_invite = on_invite
        self.timers = timers
        self.admission = admission
        self._advertise_ip = advertise_ip
        self._user_agent = user_agent
        self._transport = SipTransport(
            self._on_message,
            host=host,
            port=port,
            tls_port=_DEFAULT_TLS_PORT
            if ssl_context is not None and tls_port is None
            else tls_port,
            ssl_context=ssl_context,
            in_use=self._flow_in_use,
        )
        self._server: dict[TransactionKey, _Entry] = {}
        self._client: dict[TransactionKey, _Entry] = {}
        self._calls: dict[tuple[str, str, str], IncomingCall] = {}
        # INVITEs in progress by (Call-ID, From tag, CSeq): a second copy on another branch
        # is a forking proxy's merged request (§8.2.2.2).
        self._merging: dict[tuple[str, str, int], TransactionKey] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def port(self) -> int:
        """The bound UDP and TCP port."""
        return self._transport.port

    @property
    def tls_port(self) -> int | None:
        """The bound TLS port, if any."""
        return self._transport.tls_port

    async def start(self) -> None:
        """Bind the sockets and start answering."""
        self._loop = asyncio.get_running_loop()
        await self._transport.start()

    async def stop(self) -> None:
        """Stop answering: timers cancelled, sockets closed."""
        for entry in [*self._server.values(), *self._client.values()]:
            if entry.timer is not None:
                entry.timer.cancel()
        for call in list(self._calls.values()):
            call._fail_refer(RuntimeError("the SIP server stopped"))
        self._server.clear()
        self._client.clear()
        self._calls.clear()
        self._merging.clear()
        await self._transport.stop()

    # Incoming messages

    def _on_message(self, data: bytes, flow: Flow) -> None:
        try:
            message = parse_message(data)
        except SipParseError as exc:
            self._answer_malformed(data, flow, str(exc))
            return
        try:
            if isinstance(message, Response):
                self._on_response(message)
            else:
                self._on_request(message, flow)
        except Exception:
            logger.exception("sip: a message from %s could not be handled", flow.remote[0])

    def _answer_malformed(self, data: bytes, flow: Flow, problem: str) -> None:
        """400 to a request whose headers do not parse, if what a response needs does."""
        lines = data.lstrip(b"\r\n").split(b"\n", _SALVAGE_LINES)
        match = _START_LINE.match(lines[0].decode("utf-8", "replace").rstrip("\r"))
        if match is None or match.group(1) == "ACK":
            logger.info("sip: dropped a malformed message from %s: %s", flow.remote[0], problem)
            return
        request = Request(method=match.group(1), uri="sip:invalid")
        for raw in lines[1:]:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if not line:
                break
            if not line.isprintable():
                continue
            name, colon, value = line.partition(":")
            if colon and canonical_name(name.strip()) in _MANDATORY:
                request.add(name.strip(), value.strip())
        self._bad_request(request, flow, problem)

    def _bad_request(self, request: Request, flow: Flow, problem: str) -> None:
        self._answer_stateless(request, flow, 400, _reason_phrase("Bad Request", problem))

    def _answer_stateless(
        self,
        request: Request,
        flow: Flow,
        status: int,
        reason: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """Answer without a transaction (a request that cannot have one, or one too many).

        A request that lacks what a response needs (a Via to go by; From, To, Call-ID and
        CSeq to copy), or whose response would not parse itself, is dropped and logged.
        """
        try:
            via = stamp_received(request, flow)
            response = self._response(request, status, headers, reason=reason)
            for name in _MANDATORY:
                if response.get(name) is None:
                    raise SipParseError(f"missing {name}")
            data = response.encode()
            # What goes out must be SIP, even when what came in was only nearly so.
            parse_message(data)
        except SipParseError as exc:
            logger.info("sip: dropped a request from %s (%s): %s", flow.remote[0], status, exc)
            return
        self._transport.send(response_flow(via, flow), data)

    def _on_request(self, request: Request, flow: Flow) -> None:
        if request.method == "ACK":
            self._on_ack(request, flow)
            return
        try:
            request.validate()
        except SipParseError as exc:
            self._bad_request(request, flow, str(exc))
            return
        if request.version != "2.0":
            self._answer_stateless(request, flow, 505)
            return
        as_received = list(request.headers)
        stamp_received(request, flow)
        key = server_key(request)
        entry = self._server.get(key)
        if entry is not None:
            tx = entry.tx
            assert not isinstance(tx, ClientTransaction)
            tx.receive_request(request, self._now())
            self._pump(entry)
            return
        if len(self._server) >= MAX_TRANSACTIONS:
            self._answer_stateless(request, flow, 503)
            return
        if request.method == "CANCEL":
            self._on_cancel(request, flow, key)
            return
        trunk = None
        if not request.to_addr.tag and self.admission is not None:
            # Before anything that answers: a stranger's 405 would list our methods too.
            certificate = self._transport.peer_certificate(flow)
            verdict = self.admission.check(request, flow.remote[0], self._now(), certificate)
            if verdict.status is not None:
                self._refuse(request, flow, verdict)
                return
            trunk = verdict.trunk
        status = self._precheck(request)
        if status is not None:
            self._reply(request, flow, *status)
            return
        if request.to_addr.tag:
            self._in_dialog(request, flow)
        else:
            self._out_of_dialog(request, flow, key, as_received, trunk)

    def _refuse(self, request: Request, flow: Flow, verdict: Verdict) -> None:
        """Answer a request the admission refused, statelessly."""
        assert verdict.status is not None
        # Only a call's refusal is worth a line at info: a flood's, or a scanner's probes,
        # would make a log as large as they are.
        quiet = verdict.status == 503 or request.method != "INVITE"
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "sip: %s from %s refused (%d): %s",
            request.method,
            flow.remote[0],
            verdict.status,
            verdict.reason,
        )
        self._answer_stateless(request, flow, verdict.status, None, verdict.headers)

    def _precheck(self, request: Request) -> tuple[int, list[tuple[str, str]]] | None:
        """A status to refuse the request with before it is looked at further, or None."""
        if SipUri.parse(request.uri).scheme not in _URI_SCHEMES:
            return 416, []
        required = request.get_all("Require")
        if required:
            return 420, [("Unsupported", ", ".join(required))]
        method = request.method
        if method in _KNOWN_NOT_ALLOWED:
            return 405, [("Allow", ALLOW)]
        if method not in ALLOW.split(", "):
            return 501, [("Allow", ALLOW)]
        return None

    def _out_of_dialog(
        self,
        request: Request,
        flow: Flow,
        key: TransactionKey,
        as_received: list[tuple[str, str]],
        trunk: InboundTrunk | None,
    ) -> None:
        if request.method == "OPTIONS":
            self._reply(request, flow, 200, self._capabilities())
        elif request.method == "INVITE":
            self._new_call(request, flow, key, as_received, trunk)
        else:
            self._reply(request, flow, 481)

    def _in_dialog(self, request: Request, flow: Flow) -> None:
        call = self._calls.get(incoming_dialog_id(request))
        if call is None:
            self._reply(request, flow, 481)
            return
        if call.state == "ended" and request.method != "NOTIFY":
            # Only the transfer's subscription is left of this dialog.
            self._reply(request, flow, 481)
            return
        refused = call._dialog.receive_request(request)
        if refused is not None:
            self._reply(request, flow, refused)
            return
        method = request.method
        if method == "BYE":
            self._reply(request, flow, 200)
            if call.state == "ringing":
                # A BYE on the early dialog ends the INVITE too (§15.1.2).
                self._respond_invite(call, 487)
            call._ended_by_peer("bye")
        elif method == "INVITE":
            self._reinvite(call, request, flow)
        elif method == "INFO":
            if call.on_info is not None:
                try:
                    call.on_info(request.content_type, request.body)
                except Exception:
                    logger.exception("sip: on_info failed")
            self._reply(request, flow, 200)
        elif method == "NOTIFY":
            self._reply(request, flow, 200)
            if (request.get("Event") or "").strip().lower().startswith("refer"):
                state = (request.get("Subscription-State") or "").strip().lower()
                call._refer_progress(sipfrag_status(request.body), state.startswith("terminated"))
        else:
            self._reply(request, flow, 200, self._capabilities())

    def _new_call(
        self,
        request: Request,
        flow: Flow,
        key: TransactionKey,
        as_received: list[tuple[str, str]],
        trunk: InboundTrunk | None = None,
    ) -> None:
        merge_key = (request.call_id, request.from_addr.tag or "", request.cseq.number)
        if self._merging.get(merge_key, key) != key:
            self._reply(request, flow, 482)
            return
        contact = request.contact
        if contact is None:
            self._reply(request, flow, 400, reason="Bad Request (no Contact)")
            return
        entry = self._open_server(request, flow, key)
        assert isinstance(entry.tx, InviteServerTransaction)
        self._merging[merge_key] = key
        entry.tx.send_response(self._response(request, 100), self._now())
        self._pump(entry)
        dialog = Dialog.from_request(
            request,
            local_tag=new_tag(),
            local_contact=self._contact(flow),
            local_seq=random.randrange(1, 2**16),
        )
        call = IncomingCall(self, entry, request, as_received, flow, dialog, trunk)
        entry.call = call
        self._calls[dialog.id] = call
        try:
            self._on_invite(call)
        except Exception:
            logger.exception("sip: on_invite failed")
            if call.state == "ringing":
                call.reject(500)

    def _reinvite(self, call: IncomingCall, request: Request, flow: Flow) -> None:
        previous = call._invite.tx
        assert isinstance(previous, InviteServerTransaction)
        if (
            call.state != "answered"
            or previous.state == "proceeding"
            or (previous.state == "accepted" and not previous.acknowledged)
        ):
            # §14.2: an INVITE while another is unfinished.
            retry = str(random.randrange(0, 11))
            self._reply(request, flow, 500, [("Retry-After", retry)])
            return
        entry = self._open_server(request, flow, server_key(request))
        entry.call = call
        call._invite = entry
        answer: str | None = None
        if not request.body.strip():
            # No offer (a session refresh): ours goes again, and the ACK's answer to it
            # changes nothing we sent (§14.2).
            answer = call._local_sdp
        elif call.on_reoffer is not None:
            try:
                answer = call.on_reoffer(request.body.decode("utf-8", "replace"))
            except Exception:
                logger.exception("sip: on_reoffer failed")
                self._final(entry, self._response(request, 500))
                return
        if answer is None:
            self._final(entry, self._response(request, 488))
            return
        response = self._response(
            request,
            200,
            [("Contact", call._dialog.local_contact), ("Content-Type", "application/sdp")],
            to_tag=call._dialog.local_tag,
            body=answer.encode(),
        )
        call._local_sdp = answer
        self._final(entry, response)

    def _on_cancel(self, request: Request, flow: Flow, key: TransactionKey) -> None:
        invite = self._server.get((*key[:-1], "INVITE"))
        if invite is None or invite.call is None:
            self._reply(request, flow, 481)
            return
        self._reply(request, flow, 200)
        call = invite.call
        if call.state == "ringing" and call._invite is invite:
            self._respond_invite(call, 487)
            call._ended_by_peer("cancelled")

    def _on_ack(self, request: Request, flow: Flow) -> None:
        try:
            cseq = request.cseq
            request.vias  # noqa: B018
            key = server_key(request)
            dialog_id = incoming_dialog_id(request)
        except SipParseError:
            return
        entry = self._server.get(key)
        if entry is not None:
            # The ACK of a non-2xx final response: part of the INVITE's transaction.
            assert isinstance(entry.tx, InviteServerTransaction)
            entry.tx.receive_request(request, self._now())
            self._pump(entry)
            return
        call = self._calls.get(dialog_id)
        if call is None:
            return
        tx = call._invite.tx
        if isinstance(tx, InviteServerTransaction) and tx.request.cseq.number == cseq.number:
            tx.ack_received(self._now())
            call.acked.set()
            self._pump(call._invite)
            if call._hangup_after_ack:
                call._hangup_after_ack = False
                self._send_bye(call)

    def _on_response(self, response: Response) -> None:
        try:
            key = client_key(response.vias[0].branch or "", response.cseq.method)
        except SipParseError:
            return
        entry = self._client.get(key)
        if entry is None:
            return
        tx = entry.tx
        assert isinstance(tx, ClientTransaction)
        passed = tx.receive_response(response, self._now())
        self._pump(entry)
        if passed is not None and passed.status >= 200 and entry.on_final is not None:
            entry.on_final(passed)

    # Responses and requests of ours

    def _respond_invite(
        self, call: IncomingCall, status: int, reason: str | None = None, body: bytes = b""
    ) -> None:
        entry = call._invite
        tx = entry.tx
        if not isinstance(tx, InviteServerTransaction) or tx.state != "proceeding":
            return
        headers: list[tuple[str, str]] = []
        if 100 < status < 300:
            headers += [("Contact", call._dialog.local_contact), ("Allow", ALLOW)]
        if body:
            headers.append(("Content-Type", "application/sdp"))
        response = self._response(
            tx.request, status, headers, reason=reason, to_tag=call._dialog.local_tag, body=body
        )
        if status >= 200:
            self._final(entry, response)
        else:
            tx.send_response(response, self._now())
            self._pump(entry)

    def _final(self, entry: _Entry, response: Response) -> None:
        tx = entry.tx
        assert not isinstance(tx, ClientTransaction)
        tx.send_response(response, self._now())
        self._pump(entry)

    def _reply(
        self,
        request: Request,
        flow: Flow,
        status: int,
        headers: list[tuple[str, str]] | None = None,
        reason: str | None = None,
    ) -> None:
        """Answer a request with a final response, in a transaction of its own."""
        entry = self._open_server(request, flow, server_key(request))
        self._final(entry, self._response(request, status, headers or [], reason=reason))

    def _response(
        self,
        request: Request,
        status: int,
        headers: list[tuple[str, str]] | None = None,
        *,
        reason: str | None = None,
        to_tag: str | None = None,
        body: bytes = b"",
    ) -> Response:
        if to_tag is None and status != 100:
            to_tag = new_tag()
        response = build_response(
            request, status, reason, to_tag=to_tag, headers=headers or [], body=body
        )
        self._add_server_header(response)
        return response

    def _add_server_header(self, response: Response) -> None:
        response.add("Server", self._user_agent)

    def _capabilities(self) -> list[tuple[str, str]]:
        return [("Allow", ALLOW), ("Accept", "application/sdp")]

    def _send_bye(self, call: IncomingCall) -> None:
        bye = call._dialog.create_request("BYE", via=self._via(call._flow))
        self._send_in_dialog(call, bye, None)
        self._forget_call(call)

    def _send_in_dialog(
        self,
        call: IncomingCall,
        request: Request,
        on_final: Callable[[Response | None], None] | None,
    ) -> None:
        request.add("User-Agent", self._user_agent)
        flow = self._next_hop_flow(call)
        tx = ClientTransaction(request, reliable=flow.reliable, now=self._now(), timers=self.timers)
        entry = _Entry(tx.key, tx, flow, call=call, on_final=on_final)
        self._client[tx.key] = entry
        self._pump(entry)

    def _next_hop_flow(self, call: IncomingCall) -> Flow:
        """The INVITE's flow (see the module's docstring): its connection while open, else
        the next hop's port on the INVITE's address when the hop is that address."""
        flow = call._flow
        if not flow.reliable or self._transport.connected(flow):
            return flow
        try:
            hop = call._dialog.next_hop()
            same_host = ipaddress.ip_address(hop.host) == ipaddress.ip_address(flow.remote[0])
        except (SipParseError, ValueError):
            return flow
        if not same_host or _PROTOCOLS.get(hop.transport or flow.protocol) != flow.protocol:
            return flow
        default = _DEFAULT_TLS_PORT if flow.protocol == "tls" else DEFAULT_PORT
        return Flow(flow.protocol, (flow.remote[0], hop.port or default))

    def _flow_in_use(self, flow: Flow) -> bool:
        """Whether a call or a transaction still sends or expects messages on ``flow`` (an
        idle connection that none uses is closed)."""
        if any(call._flow == flow and call.state != "ended" for call in self._calls.values()):
            return True
        return any(e.flow == flow for e in (*self._server.values(), *self._client.values()))

    def _via(self, flow: Flow) -> Via:
        port = self.tls_port if flow.protocol == "tls" else self.port
        return Via(
            flow.via_transport,
            self._advertised(flow),
            port,
            {"branch": new_branch(), "rport": None},
        )

    def _contact(self, flow: Flow) -> str:
        host = format_host(
            self._advertised(flow), self.tls_port if flow.protocol == "tls" else self.port
        )
        transport = "" if flow.protocol == "udp" else f";transport={flow.protocol}"
        return f"<sip:{_CONTACT_USER}@{host}{transport}>"

    def _advertised(self, flow: Flow) -> str:
        if self._advertise_ip is not None:
            return self._advertise_ip
        return self._transport.local_ip_for(flow.remote[0])

    # Transactions and their timers

    def _open_server(self, request: Request, flow: Flow, key: TransactionKey) -> _Entry:
        reply_flow = response_flow(request.vias[0], flow)
        tx: ServerTx
        if request.method == "INVITE":
            tx = InviteServerTransaction(
                request, reliable=flow.reliable, now=self._now(), timers=self.timers
            )
        else:
            tx = ServerTransaction(
                request, reliable=flow.reliable, now=self._now(), timers=self.timers
            )
        entry = _Entry(key, tx, reply_flow)
        self._server[key] = entry
        return entry

    def _pump(self, entry: _Entry) -> None:
        """Send what the transaction has to send, then arm its timer or forget it."""
        for data in entry.tx.data_to_send():
            self._transport.send(entry.flow, data)
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        if entry.tx.state == "terminated":
            self._drop(entry)
            return
        when = entry.tx.get_timer()
        if when is not None and self._loop is not None:
            entry.timer = self._loop.call_at(when, self._fire, entry)

    def _fire(self, entry: _Entry) -> None:
        entry.timer = None
        try:
            when = entry.tx.get_timer()
            timed_out = entry.tx.handle_timer(max(self._now(), when or 0.0))
            self._pump(entry)
            if timed_out:
                self._timed_out(entry)
        except Exception:
            logger.exception("sip: a transaction timer failed")

    def _timed_out(self, entry: _Entry) -> None:
        if isinstance(entry.tx, ClientTransaction):
            if entry.on_final is not None:
                entry.on_final(None)
            return
        call = entry.call
        if call is None:
            return
        # A 2xx never acknowledged: the session is torn down with a BYE (§13.3.1.4).
        was_hung_up = call._hangup_after_ack
        call._hangup_after_ack = False
        self._send_bye(call)
        if not was_hung_up and call.state != "ended":
            call._ended_by_peer("no ACK")

    def _drop(self, entry: _Entry) -> None:
        table = self._client if isinstance(entry.tx, ClientTransaction) else self._server
        if table.get(entry.key) is entry:
            del table[entry.key]
        if isinstance(entry.tx, InviteServerTransaction):
            request = entry.tx.request
            merge_key = (request.call_id, request.from_addr.tag or "", request.cseq.number)
            if self._merging.get(merge_key) == entry.key:
                del self._merging[merge_key]

    def _forget_call(self, call: IncomingCall) -> None:
        if self._calls.get(call._dialog.id) is call:
            del self._calls[call._dialog.id]
        call._dialog.state = "terminated"

    def _now(self) -> float:
        assert self._loop is not None, "the user agent is not started"
        return self._loop.time()


def _reason_phrase(base: str, problem: str) -> str:
    """A reason phrase carrying the parse problem, kept to one short printable line."""
    detail = "".join(ch for ch in problem if ch.isprintable())[:80]
    return f"{base} ({detail})" if detail else base

"""SIP dialogs on the UAS side (RFC 3261 §12), sans-I/O.

A dialog is made from the INVITE that creates it (§12.1.1): the remote tag and URI from
From, the local URI from To plus a tag of ours, the remote target from Contact, and the
route set from Record-Route in the order it came (the UAS's order). It builds the requests
this side sends inside it (BYE, REFER, …) with the next local CSeq and the route set
applied (§12.2.1.1, loose and strict routing), and checks the requests the peer sends
inside it: their CSeq must rise (§12.2.2) and a target refresh (re-INVITE, UPDATE) moves
the remote target to its Contact.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from hark.transports.sip.message import (
    BRANCH_COOKIE,
    NameAddr,
    Request,
    SipParseError,
    SipUri,
    Via,
)

DialogId = tuple[str, str, str]
DialogState = Literal["early", "confirmed", "terminated"]
MAX_FORWARDS = 70
_TARGET_REFRESH = frozenset({"INVITE", "UPDATE"})
_NO_SEQUENCE_CHECK = frozenset({"ACK", "CANCEL"})


def new_tag() -> str:
    """A fresh random tag (§19.3: at least 32 bits of randomness)."""
    return secrets.token_hex(8)


def new_branch() -> str:
    """A fresh branch with the RFC 3261 magic cookie (§8.1.1.7)."""
    return BRANCH_COOKIE + secrets.token_hex(10)


def incoming_dialog_id(request: Request) -> DialogId:
    """The id of the dialog a request from the peer belongs to: (Call-ID, To tag, From tag)."""
    return (request.call_id, request.to_addr.tag or "", request.from_addr.tag or "")


@dataclass(eq=False, kw_only=True, slots=True)
class Dialog:
    """One dialog this UAS is in; ``id`` is ``(Call-ID, local tag, remote tag)``."""

    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: NameAddr
    remote_uri: NameAddr
    remote_target: str
    route_set: list[str]
    remote_seq: int
    local_seq: int
    local_contact: str
    state: DialogState = field(default="early", init=False)

    @classmethod
    def from_request(
        cls, request: Request, *, local_tag: str, local_contact: str, local_seq: int = 0
    ) -> Dialog:
        """The dialog an INVITE sets up once answered with ``local_tag`` (§12.1.1).

        ``local_seq`` is the CSeq number before this side's first request; 0 unless the
        caller wants another start.
        """
        contact = request.contact
        if contact is None:
            raise SipParseError("a dialog-creating request needs a Contact")
        local = request.to_addr
        local.params["tag"] = local_tag
        remote = request.from_addr
        return cls(
            call_id=request.call_id,
            local_tag=local_tag,
            remote_tag=remote.tag or "",
            local_uri=local,
            remote_uri=remote,
            remote_target=contact.uri,
            route_set=request.get_all("Record-Route"),
            remote_seq=request.cseq.number,
            local_seq=local_seq,
            local_contact=local_contact,
        )

    @property
    def id(self) -> DialogId:
        """``(Call-ID, local tag, remote tag)``."""
        return (self.call_id, self.local_tag, self.remote_tag)

    def receive_request(self, request: Request) -> int | None:
        """Check and take in a request from the peer in this dialog (§12.2.2).

        Returns the status to reject it with (500 for a CSeq out of order), or None. A
        target refresh with a Contact moves the remote target.
        """
        if request.method in _NO_SEQUENCE_CHECK:
            return None
        number = request.cseq.number
        if number <= self.remote_seq:
            return 500
        self.remote_seq = number
        if request.method in _TARGET_REFRESH:
            contact = request.contact
            if contact is not None:
                self.remote_target = contact.uri
        return None

    def next_hop(self) -> SipUri:
        """Where this side's requests go first: the first route, else the remote target."""
        first = NameAddr.parse(self.route_set[0]).uri if self.route_set else self.remote_target
        return SipUri.parse(first)

    def create_request(
        self,
        method: str,
        *,
        via: Via,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Request:
        """A request of this side in the dialog (§12.2.1.1), with the next local CSeq.

        ``via`` is this side's Via (its branch names the transaction). With a loose-routing
        first route (``lr``) the Request-URI is the remote target and the route set goes in
        Route; with a strict router the first route becomes the Request-URI instead.
        """
        self.local_seq += 1
        uri = self.remote_target
        routes = list(self.route_set)
        if routes:
            first = NameAddr.parse(routes[0])
            if "lr" not in first.sip_uri().params:
                strict = first.sip_uri()
                strict.params = {}
                uri = str(strict)
                routes = [*routes[1:], f"<{self.remote_target}>"]
        request = Request(method=method, uri=uri)
        request.add("Via", str(via))
        request.add("Max-Forwards", str(MAX_FORWARDS))
        request.add("From", str(self.local_uri))
        request.add("To", str(self.remote_uri))
        request.add("Call-ID", self.call_id)
        request.add("CSeq", f"{self.local_seq} {method}")
        for route in routes:
            request.add("Route", route)
        if method != "BYE":
            request.add("Contact", self.local_contact)
        for name, value in headers:
            request.add(name, value)
        request.body = body
        return request

    def create_refer(self, target_uri: str, *, via: Via) -> Request:
        """A REFER (RFC 3515) asking the peer to call ``target_uri``; we are the referrer."""
        return self.create_request(
            "REFER",
            via=via,
            headers=[
                ("Refer-To", f"<{target_uri}>"),
                ("Referred-By", f"<{self.local_uri.uri}>"),
            ],
        )

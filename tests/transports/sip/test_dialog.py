"""UAS dialogs: what an INVITE sets up, the requests built inside, the requests checked."""

from __future__ import annotations

import pytest

from hark.transports.sip.dialog import Dialog, incoming_dialog_id, new_branch
from hark.transports.sip.message import (
    BRANCH_COOKIE,
    Request,
    SipParseError,
    Via,
    parse_message,
)
from tests.transports.sip.captured import BARESIP_BYE, BARESIP_INVITE

CONTACT = "<sip:hark@192.0.2.10:5060>"


def _request(data: bytes) -> Request:
    message = parse_message(data)
    assert isinstance(message, Request)
    return message


def _proxied_invite(*routes: bytes) -> Request:
    extra = b"".join(b"Record-Route: " + r + b"\r\n" for r in routes)
    return _request(
        BARESIP_INVITE.replace(b"Max-Forwards: 70\r\n", extra + b"Max-Forwards: 70\r\n")
    )


def _via() -> Via:
    return Via("UDP", "192.0.2.10", 5060, {"branch": new_branch(), "rport": None})


def test_an_invite_sets_up_the_dialog() -> None:
    invite = _proxied_invite(b"<sip:p2.example.com;lr>", b"<sip:p1.example.com;lr>")
    dialog = Dialog.from_request(invite, local_tag="ours", local_contact=CONTACT, local_seq=7)
    assert dialog.id == ("bf287a847a6ecd78", "ours", "8e879056e547b804")
    assert dialog.local_uri.uri == "sip:hark@127.0.0.1:5090" and dialog.local_uri.tag == "ours"
    assert dialog.remote_uri.uri == "sip:alice@127.0.0.1"
    assert dialog.remote_target == "sip:alice-0x5577c377db70@127.0.0.1:5072"
    # The UAS keeps Record-Route in the order received (§12.1.1).
    assert dialog.route_set == ["<sip:p2.example.com;lr>", "<sip:p1.example.com;lr>"]
    assert dialog.remote_seq == 16583 and dialog.state == "early"
    assert dialog.next_hop().host == "p2.example.com"


def test_a_bye_inside_the_dialog_follows_the_route_set() -> None:
    invite = _proxied_invite(b"<sip:p2.example.com;lr>", b"<sip:p1.example.com;lr>")
    dialog = Dialog.from_request(invite, local_tag="ours", local_contact=CONTACT, local_seq=7)
    via = _via()
    bye = _request(dialog.create_request("BYE", via=via).encode())
    bye.validate()
    assert bye.uri == dialog.remote_target
    assert bye.get_all("Route") == dialog.route_set
    assert bye.from_addr.tag == "ours" and bye.to_addr.tag == "8e879056e547b804"
    assert bye.call_id == invite.call_id
    assert (bye.cseq.number, bye.cseq.method) == (8, "BYE")
    assert bye.vias == [via] and via.branch is not None and via.branch.startswith(BRANCH_COOKIE)
    assert bye.get("Contact") is None and bye.get("Max-Forwards") == "70"
    # The peer's requests name the same dialog from its side.
    assert incoming_dialog_id(_request(BARESIP_BYE.replace(b"67314e133ad243a9", b"ours"))) == (
        dialog.id
    )
    assert dialog.create_request("BYE", via=_via()).cseq.number == 9


def test_a_strict_router_gets_the_request_uri() -> None:
    invite = _proxied_invite(b"<sip:strict.example.com;maddr=10.0.0.1>", b"<sip:p1.example.com;lr>")
    dialog = Dialog.from_request(invite, local_tag="ours", local_contact=CONTACT)
    bye = dialog.create_request("BYE", via=_via())
    # §12.2.1.1: the first route (stripped of parameters) becomes the Request-URI, and the
    # remote target goes last in Route.
    assert bye.uri == "sip:strict.example.com"
    assert bye.get_all("Route") == [
        "<sip:p1.example.com;lr>",
        "<sip:alice-0x5577c377db70@127.0.0.1:5072>",
    ]


def test_requests_from_the_peer_must_rise_and_refresh_the_target() -> None:
    invite = _request(BARESIP_INVITE)
    dialog = Dialog.from_request(invite, local_tag="ours", local_contact=CONTACT)
    stale = _request(BARESIP_BYE.replace(b"CSeq: 16584 BYE", b"CSeq: 16583 BYE"))
    assert dialog.receive_request(stale) == 500
    reinvite = _request(
        BARESIP_INVITE.replace(b"CSeq: 16583", b"CSeq: 16590").replace(
            b"<sip:alice-0x5577c377db70@127.0.0.1:5072>", b"<sip:alice@192.0.2.77:5072>"
        )
    )
    assert dialog.receive_request(reinvite) is None
    assert dialog.remote_seq == 16590
    assert dialog.remote_target == "sip:alice@192.0.2.77:5072"
    assert dialog.receive_request(_request(BARESIP_BYE)) == 500
    ack = _request(BARESIP_BYE.replace(b"BYE", b"ACK").replace(b"16584", b"16590"))
    assert dialog.receive_request(ack) is None


def test_a_refer_names_the_target_and_the_referrer() -> None:
    dialog = Dialog.from_request(
        _request(BARESIP_INVITE), local_tag="ours", local_contact=CONTACT, local_seq=1
    )
    refer = _request(dialog.create_refer("tel:+15550100", via=_via()).encode())
    refer.validate()
    assert refer.method == "REFER" and refer.cseq.number == 2
    assert refer.get("Refer-To") == "<tel:+15550100>"
    assert refer.get("Referred-By") == "<sip:hark@127.0.0.1:5090>"
    assert refer.get("Contact") == CONTACT
    assert refer.get("r") == refer.get("Refer-To")


def test_an_invite_without_contact_cannot_make_a_dialog() -> None:
    invite = _request(BARESIP_INVITE)
    invite.remove("Contact")
    with pytest.raises(SipParseError):
        Dialog.from_request(invite, local_tag="ours", local_contact=CONTACT)

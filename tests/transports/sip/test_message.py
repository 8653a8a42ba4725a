"""The SIP message parser: real captured messages, compact forms, folding, limits, framing,
responses, and thousands of mutated messages that must fail only with SipParseError."""

from __future__ import annotations

import contextlib
import random

import pytest

from hark.transports.sip.message import (
    MAX_HEADERS,
    MAX_LINE_BYTES,
    MAX_MESSAGE_BYTES,
    CSeq,
    NameAddr,
    Request,
    Response,
    SipParseError,
    SipUri,
    StreamFramer,
    Via,
    build_response,
    parse_message,
    sipfrag_status,
)
from tests.transports.sip.captured import (
    ALL,
    BARESIP_BYE,
    BARESIP_INVITE,
    BARESIP_OPTIONS,
    SIPP_INVITE,
)


def _request(data: bytes) -> Request:
    message = parse_message(data)
    assert isinstance(message, Request)
    return message


def test_a_captured_invite_is_read_whole() -> None:
    invite = _request(BARESIP_INVITE)
    invite.validate()
    assert (invite.method, invite.uri) == ("INVITE", "sip:hark@127.0.0.1:5090")
    via = invite.vias[0]
    assert (via.transport, via.host, via.port) == ("UDP", "127.0.0.1", 5072)
    assert via.branch == "z9hG4bKc45c7461c808ec7b"
    assert "rport" in via.params and via.params["rport"] is None
    assert invite.from_addr.tag == "8e879056e547b804"
    assert invite.to_addr.tag is None
    assert invite.call_id == "bf287a847a6ecd78"
    assert invite.cseq == CSeq(16583, "INVITE")
    contact = invite.contact
    assert contact is not None
    assert contact.sip_uri().port == 5072
    assert invite.content_type == "application/sdp"
    assert len(invite.body) == 338 and invite.body.startswith(b"v=0\r\n")
    assert invite.get_all("Supported") == []
    assert "REFER" in invite.get_all("Allow")


def test_sipp_bare_uri_contact_and_padded_content_length() -> None:
    invite = _request(SIPP_INVITE)
    invite.validate()
    contact = invite.contact
    assert contact is not None and contact.uri == "sip:sipp@127.0.0.1:5060"
    assert invite.from_addr.display == "sipp"
    assert len(invite.body) == 129


@pytest.mark.parametrize("data", ALL)
def test_encoding_a_parsed_message_gives_it_back(data: bytes) -> None:
    message = parse_message(data)
    again = parse_message(message.encode())
    assert again == message


def test_compact_forms_case_and_folding() -> None:
    data = (
        b"BYE sip:hark@10.0.0.1 SIP/2.0\r\n"
        b"v: SIP/2.0/TCP 10.0.0.2:5060;branch=z9hG4bKabc\r\n"
        b"f: <sip:a@10.0.0.2>;tag=1\r\n"
        b"t: <sip:hark@10.0.0.1>;tag=2\r\n"
        b"i: call-1\r\n"
        b"cSeQ: 2 BYE\r\n"
        b"Subject: a long\r\n"
        b"   subject\r\n"
        b"\tfolded\r\n"
        b"l: 0\r\n"
        b"\r\n"
    )
    bye = _request(data)
    bye.validate()
    assert bye.call_id == "call-1"
    assert bye.get("Call-ID") == bye.get("i") == bye.get("CALL-ID") == "call-1"
    assert bye.get("subject") == "a long subject folded"
    assert bye.vias[0].transport == "TCP"
    assert bye.to_addr.tag == "2"
    assert bye.headers[0] == ("v", "SIP/2.0/TCP 10.0.0.2:5060;branch=z9hG4bKabc")


def test_list_headers_split_outside_quotes_and_brackets() -> None:
    data = (
        b"INVITE sip:hark@10.0.0.1 SIP/2.0\r\n"
        b"Via: SIP/2.0/UDP proxy.example.com;branch=z9hG4bK1, SIP/2.0/UDP 10.0.0.9:5070"
        b";branch=z9hG4bK2;received=192.0.2.1\r\n"
        b"Via: SIP/2.0/UDP [2001:db8::1]:5062;branch=z9hG4bK3\r\n"
        b'Record-Route: <sip:p1.example.com;lr>, "Proxy, Two" <sip:p2.example.com;lr>\r\n'
        b"Record-Route: <sip:p3.example.com;lr;x=a,b>\r\n"
        b'Contact: "Doe, John" <sip:john@10.0.0.9:5070>;expires=60\r\n'
        b"From: <sip:john@example.com>;tag=x\r\nTo: <sip:hark@example.com>\r\n"
        b"Call-ID: c\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
    )
    invite = _request(data)
    invite.validate()
    assert [v.branch for v in invite.vias] == ["z9hG4bK1", "z9hG4bK2", "z9hG4bK3"]
    assert invite.vias[1].params["received"] == "192.0.2.1"
    assert invite.vias[2].host == "2001:db8::1" and invite.vias[2].port == 5062
    routes = invite.get_all("Record-Route")
    assert routes == [
        "<sip:p1.example.com;lr>",
        '"Proxy, Two" <sip:p2.example.com;lr>',
        "<sip:p3.example.com;lr;x=a,b>",
    ]
    contact = invite.contact
    assert contact is not None
    assert contact.display == '"Doe, John"' and contact.params == {"expires": "60"}


def test_addresses_uris_and_vias_round_trip() -> None:
    addr = NameAddr.parse('"A \\"B\\"" <sip:a@[2001:db8::2]:5080;transport=tcp>;tag=9')
    assert addr.tag == "9"
    uri = addr.sip_uri()
    assert (uri.user, uri.host, uri.port, uri.transport) == ("a", "2001:db8::2", 5080, "tcp")
    assert NameAddr.parse(str(addr)) == addr
    assert str(SipUri.parse("sips:bob@example.com")) == "sips:bob@example.com"
    assert SipUri.parse("sips:bob@example.com").transport == "tls"
    tel = SipUri.parse("tel:+15550100;phone-context=x")
    assert (tel.scheme, str(tel)) == ("tel", "tel:+15550100;phone-context=x")
    via = Via.parse("SIP / 2.0 / UDP 10.0.0.1 ;branch=z9hG4bKx ; rport")
    assert (via.host, via.port, via.branch) == ("10.0.0.1", None, "z9hG4bKx")
    assert Via.parse(str(via)) == via
    for bad in ("sip:", "nocolon", "sip:a@b:99999", "sip:a@b c"):
        with pytest.raises(SipParseError):
            SipUri.parse(bad)
    for bad in ('"open <sip:a@b>', "<sip:a@b", "Name <sip:a@b>;;", "plain words"):
        with pytest.raises(SipParseError):
            NameAddr.parse(bad)


def test_a_response_is_parsed() -> None:
    data = (
        b"SIP/2.0 486 Busy Here Right Now\r\nVia: SIP/2.0/UDP 10.0.0.1;branch=z9hG4bKq\r\n"
        b"From: <sip:a@b>;tag=1\r\nTo: <sip:c@d>;tag=2\r\nCall-ID: x\r\nCSeq: 5 REFER\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    response = parse_message(data)
    assert isinstance(response, Response)
    assert (response.status, response.reason) == (486, "Busy Here Right Now")
    assert response.cseq == CSeq(5, "REFER")


def test_content_length_frames_a_datagram() -> None:
    head = b"OPTIONS sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bKa\r\n"
    assert parse_message(head + b"Content-Length: 3\r\n\r\nabcdef").body == b"abc"
    assert parse_message(head + b"\r\nabcdef").body == b"abcdef"
    with pytest.raises(SipParseError):
        parse_message(head + b"Content-Length: 9\r\n\r\nabcdef")
    with pytest.raises(SipParseError):
        parse_message(head + b"Content-Length: -1\r\n\r\n")
    with pytest.raises(SipParseError):
        parse_message(head + b"Content-Length: 1\r\nl: 2\r\n\r\nab")


def test_limits() -> None:
    head = BARESIP_OPTIONS.split(b"\r\n\r\n")[0]
    too_big = head + b"\r\nContent-Length: 0\r\n\r\n" + b"x" * MAX_MESSAGE_BYTES
    many = head + b"".join(b"\r\nX-H%d: v" % i for i in range(MAX_HEADERS)) + b"\r\n\r\n"
    long_line = head + b"\r\nX-Long: " + b"a" * MAX_LINE_BYTES + b"\r\n\r\n"
    for data in (too_big, many, long_line):
        with pytest.raises(SipParseError):
            parse_message(data)
    fewer = head + b"".join(b"\r\nX-H%d: v" % i for i in range(MAX_HEADERS - 20)) + b"\r\n\r\n"
    assert isinstance(parse_message(fewer), Request)


def test_validate_names_what_is_missing_or_wrong() -> None:
    good = _request(BARESIP_BYE)
    good.validate()
    for header in ("Via", "From", "To", "Call-ID", "CSeq"):
        broken = _request(BARESIP_BYE)
        broken.remove(header)
        with pytest.raises(SipParseError, match="missing"):
            broken.validate()
    mismatched = _request(BARESIP_BYE)
    mismatched.set("CSeq", "16584 INVITE")
    with pytest.raises(SipParseError, match="CSeq"):
        mismatched.validate()
    huge = _request(BARESIP_BYE)
    huge.set("CSeq", f"{2**31} BYE")
    with pytest.raises(SipParseError):
        huge.validate()


def test_stream_framing_at_every_split() -> None:
    stream = BARESIP_INVITE + b"\r\n\r\n" + BARESIP_BYE + BARESIP_OPTIONS
    for cut in range(0, len(stream), 7):
        framer = StreamFramer()
        messages = framer.feed(stream[:cut]) + framer.feed(stream[cut:])
        assert messages == [BARESIP_INVITE, BARESIP_BYE, BARESIP_OPTIONS]
        assert framer.pings == 1


def test_stream_framing_refuses_what_cannot_be_framed() -> None:
    without_length = BARESIP_OPTIONS.replace(b"Content-Length: 0\r\n", b"")
    with pytest.raises(SipParseError):
        StreamFramer().feed(without_length)
    with pytest.raises(SipParseError):
        StreamFramer().feed(b"INVITE sip:a@b SIP/2.0\r\nContent-Length: 70000\r\n\r\n")
    with pytest.raises(SipParseError):
        StreamFramer().feed(b"X" * (MAX_MESSAGE_BYTES + 1))


def test_a_response_copies_what_it_must() -> None:
    invite = _request(BARESIP_INVITE)
    invite.add("Record-Route", "<sip:proxy.example.com;lr>")
    invite.add("Timestamp", "54")
    trying = build_response(invite, 100, to_tag="ours")
    assert trying.to_addr.tag is None
    assert trying.get("Timestamp") == "54"
    assert trying.get("Record-Route") is None
    ok = build_response(invite, 200, to_tag="ours", headers=[("Contact", "<sip:h@1.2.3.4>")])
    assert ok.reason == "OK"
    assert ok.to_addr.tag == "ours"
    for name in ("Via", "From", "Call-ID", "CSeq"):
        assert ok.get(name) == invite.get(name)
    assert ok.get("Record-Route") == "<sip:proxy.example.com;lr>"
    assert ok.get("Timestamp") is None
    busy = build_response(invite, 486, to_tag="ours")
    assert busy.get("Record-Route") is None and busy.reason == "Busy Here"
    bye = _request(BARESIP_BYE)
    assert build_response(bye, 200, to_tag="other").to_addr.tag == "67314e133ad243a9"


def test_replace_top_via_keeps_the_others() -> None:
    request = _request(
        BARESIP_BYE.replace(b"rport\r\n", b"rport, SIP/2.0/UDP 10.9.9.9;branch=z9hG4bKz\r\n")
    )
    top = request.vias[0]
    top.params["received"] = "192.0.2.7"
    request.replace_top_via(top)
    assert [v.params.get("received") for v in request.vias] == ["192.0.2.7", None]
    assert request.vias[1].host == "10.9.9.9"


def test_sipfrag_status() -> None:
    assert sipfrag_status(b"SIP/2.0 200 OK\r\n") == 200
    assert sipfrag_status(b"SIP/2.0 100 Trying") == 100
    assert sipfrag_status(b"SIP/2.0 503\r\n") == 503
    assert sipfrag_status(b"garbage") is None


_INTERESTING = [
    b":",
    b";",
    b",",
    b"<",
    b">",
    b'"',
    b"\\",
    b"\r\n",
    b"\n",
    b"\r",
    b" ",
    b"\t",
    b"\x00",
    b"\xff",
    b"=",
    b"@",
    b"[",
    b"]",
    b"SIP/2.0",
    b"\r\n\r\n",
    b"Content-Length: 99999\r\n",
    b"l: 5\r\n",
    b"Via: ,\r\n",
    b"\r\n ",
    b"9" * 12,
]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(buf) + 1)
        kind = rng.randrange(7)
        if kind == 0 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif kind == 1:
            buf[pos:pos] = rng.choice(_INTERESTING)
        elif kind == 2:
            del buf[pos : pos + rng.randint(1, 40)]
        elif kind == 3:
            end = min(len(buf), pos + rng.randint(1, 80))
            buf[pos:pos] = buf[pos:end] * rng.randint(1, 3)
        elif kind == 4:
            del buf[pos:]
        elif kind == 5:
            lines = bytes(buf).split(b"\r\n")
            rng.shuffle(lines)
            buf = bytearray(b"\r\n".join(lines))
        else:
            buf[pos:pos] = bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 20)))
    return bytes(buf)


def _exercise(message: Request | Response) -> None:
    """Every accessor a UAS uses: each may refuse the message, only with SipParseError."""
    for access in (
        lambda: message.vias,
        lambda: message.from_addr,
        lambda: message.to_addr,
        lambda: message.call_id,
        lambda: message.cseq,
        lambda: message.contact,
        lambda: message.get_all("Record-Route"),
        lambda: message.get_all("Require"),
        lambda: message.content_type,
        lambda: [NameAddr.parse(v) for v in message.get_all("Record-Route")],
        lambda: message.validate() if isinstance(message, Request) else None,
        lambda: build_response(message, 400, to_tag="t") if isinstance(message, Request) else None,
    ):
        with contextlib.suppress(SipParseError):
            access()


def test_mutated_messages_fail_only_with_sip_parse_error() -> None:
    rng = random.Random(20261124)
    parsed = refused = 0
    for i in range(6000):
        data = _mutate(rng, ALL[i % len(ALL)])
        try:
            message = parse_message(data)
        except SipParseError:
            refused += 1
        else:
            parsed += 1
            _exercise(message)
            again = parse_message(message.encode())
            # Encoding adds the Content-Length a datagram may lack; nothing else changes.
            again.headers = [h for h in again.headers if h[0] in dict(message.headers)]
            assert again == message
        framer = StreamFramer()
        with contextlib.suppress(SipParseError):
            for chunk_start in range(0, len(data), 97):
                framer.feed(data[chunk_start : chunk_start + 97])
    # Both outcomes occur: the mutations are neither all harmless nor all fatal.
    assert parsed > 500 and refused > 500


def test_a_request_with_two_of_a_single_header_is_refused() -> None:
    # Found by fuzzing: a second, broken To behind a good one.
    twice = _request(BARESIP_BYE.replace(b"Call-ID:", b"To: <sip:\r\nCall-ID:"))
    with pytest.raises(SipParseError, match="more than one To"):
        twice.validate()
    refused = build_response(twice, 400, to_tag="t")
    assert refused.get_all("To") == ["<sip:hark@127.0.0.1:5090>;tag=67314e133ad243a9"]

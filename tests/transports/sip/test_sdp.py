"""SDP offers as phones write them, and the answers to them."""

from __future__ import annotations

import base64

import pytest

from hark.transports.sip.sdp import Answerer, SdpError, media_security, negotiate, parse_offer


def offer(*lines: str, media: str = "m=audio 40000 RTP/AVP 0 8 101") -> str:
    head = ["v=0", "o=alice 1 1 IN IP4 192.0.2.10", "s=-", "c=IN IP4 192.0.2.10", "t=0 0"]
    body = [media, "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-15", *lines]
    return "\r\n".join(head + body) + "\r\n"


def answer_lines(text: str) -> list[str]:
    assert text.endswith("\r\n")
    return text.split("\r\n")[:-1]


def test_a_softphone_offer_is_read() -> None:
    parsed = parse_offer(offer("a=ptime:20", "a=sendrecv"))
    assert (parsed.address, parsed.port, parsed.ptime) == ("192.0.2.10", 40000, 20)
    assert [(c.payload_type, c.name, c.clock_rate) for c in parsed.codecs] == [
        (0, "PCMU", 8000),
        (8, "PCMA", 8000),
        (101, "telephone-event", 8000),
    ]
    assert parsed.codecs[2].fmtp == "0-15"
    assert parsed.direction == "sendrecv" and not parsed.held


def test_the_answer_takes_the_offerers_first_g711_and_its_telephone_event() -> None:
    text = offer(media="m=audio 40000 RTP/AVP 9 8 0 101")
    agreed = negotiate(parse_offer(text))
    assert (agreed.codec.payload_type, agreed.codec.name) == (8, "PCMA")
    assert agreed.telephone_event is not None and agreed.telephone_event.payload_type == 101
    answer = answer_lines(
        Answerer().answer(parse_offer(text), agreed, address="198.51.100.7", port=30000)
    )
    assert answer[0] == "v=0"
    assert answer[1].startswith("o=hark ") and answer[1].endswith(" IN IP4 198.51.100.7")
    assert "c=IN IP4 198.51.100.7" in answer
    assert "m=audio 30000 RTP/AVP 8 101" in answer
    assert "a=rtpmap:8 PCMA/8000" in answer
    assert "a=rtpmap:101 telephone-event/8000" in answer
    assert "a=fmtp:101 0-15" in answer
    assert "a=ptime:20" in answer and "a=sendrecv" in answer
    assert "a=rtcp:30000" in answer


def test_dynamic_payload_types_and_lower_case_names_are_honoured() -> None:
    text = offer(
        "a=rtpmap:96 opus/48000/2",
        "a=rtpmap:97 pcmu/8000",
        "a=rtpmap:100 telephone-event/48000",
        media="m=audio 40000 RTP/AVP 96 97 100 101",
    )
    agreed = negotiate(parse_offer(text))
    assert (agreed.codec.payload_type, agreed.codec.name) == (97, "PCMU")
    # The event type at the codec's clock rate, not the first one offered.
    assert agreed.telephone_event is not None and agreed.telephone_event.payload_type == 101


def test_without_telephone_event_the_answer_has_the_codec_alone() -> None:
    text = (
        "v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\n"
        "m=audio 4000 RTP/AVP 0\r\n"
    )
    agreed = negotiate(parse_offer(text))
    assert agreed.telephone_event is None
    answer = answer_lines(
        Answerer().answer(parse_offer(text), agreed, address="10.0.0.2", port=5000)
    )
    assert "m=audio 5000 RTP/AVP 0" in answer
    assert not [line for line in answer if "telephone-event" in line or "fmtp" in line]


@pytest.mark.parametrize(
    ("theirs", "ours", "sending", "receiving"),
    [
        ("a=sendrecv", "sendrecv", True, True),
        ("a=sendonly", "recvonly", False, False),
        ("a=recvonly", "sendonly", True, False),
        ("a=inactive", "inactive", False, False),
    ],
)
def test_the_direction_mirrors_the_offer(
    theirs: str, ours: str, sending: bool, receiving: bool
) -> None:
    parsed = parse_offer(offer(theirs))
    agreed = negotiate(parsed)
    assert agreed.direction == ours
    assert (agreed.sending, agreed.receiving) == (sending, receiving)
    answer = Answerer().answer(parsed, agreed, address="10.0.0.2", port=5000)
    assert f"a={ours}\r\n" in answer


def test_a_session_level_direction_applies_unless_the_media_says_otherwise() -> None:
    text = offer().replace("t=0 0\r\n", "t=0 0\r\na=sendonly\r\n")
    assert parse_offer(text).direction == "sendonly"
    assert parse_offer(text + "a=sendrecv\r\n").direction == "sendrecv"


def test_the_old_hold_address_stops_our_audio() -> None:
    parsed = parse_offer(offer().replace("c=IN IP4 192.0.2.10", "c=IN IP4 0.0.0.0"))
    agreed = negotiate(parsed)
    assert parsed.held and not agreed.sending and not agreed.receiving


def test_a_media_level_address_wins_and_rtcp_ports_are_read() -> None:
    parsed = parse_offer(offer("c=IN IP4 203.0.113.5", "a=rtcp:40003"))
    agreed = negotiate(parsed)
    assert agreed.remote == ("203.0.113.5", 40000)
    assert agreed.remote_rtcp == ("203.0.113.5", 40003)
    assert negotiate(parse_offer(offer())).remote_rtcp == ("192.0.2.10", 40001)
    muxed = negotiate(parse_offer(offer("a=rtcp-mux")))
    assert muxed.rtcp_mux and muxed.remote_rtcp == ("192.0.2.10", 40000)
    assert "a=rtcp-mux\r\n" in Answerer().answer(
        parse_offer(offer("a=rtcp-mux")), muxed, address="10.0.0.2", port=5000
    )


def test_other_media_lines_are_refused_in_place() -> None:
    text = (
        "v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\n"
        "m=video 5002 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n"
        "m=audio 0 RTP/AVP 0\r\n"
        "m=audio 5000 RTP/AVP 0\r\n"
    )
    parsed = parse_offer(text)
    assert parsed.port == 5000
    answer = answer_lines(
        Answerer().answer(parsed, negotiate(parsed), address="10.0.0.2", port=6000)
    )
    media = [line for line in answer if line.startswith("m=")]
    assert media == ["m=video 0 RTP/AVP 96", "m=audio 0 RTP/AVP 0", "m=audio 6000 RTP/AVP 0"]


def test_ipv6_offers_get_ipv6_answers() -> None:
    text = offer().replace("IN IP4 192.0.2.10", "IN IP6 2001:db8::1")
    parsed = parse_offer(text)
    assert parsed.address == "2001:db8::1"
    answer = Answerer().answer(parsed, negotiate(parsed), address="2001:db8::2", port=5000)
    assert "c=IN IP6 2001:db8::2\r\n" in answer


def test_the_origin_version_moves_only_when_the_answer_changes() -> None:
    answerer = Answerer()

    def version(text: str) -> int:
        parsed = parse_offer(text)
        answer = answerer.answer(parsed, negotiate(parsed), address="10.0.0.2", port=5000)
        origin = answer_lines(answer)[1].split()
        return int(origin[2])

    first = version(offer())
    assert version(offer()) == first
    assert version(offer("a=sendonly")) == first + 1
    assert version(offer("a=sendrecv")) == first + 2


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (offer(media="m=audio 40000 RTP/AVP 9 18"), "no common codec"),
        (offer(media="m=audio 40000 UDP/TLS/RTP/SAVPF 0"), "UDP/TLS/RTP/SAVPF"),
        (offer(media="m=audio 40000 RTP/SAVP 0"), "without a=crypto"),
        (
            offer("a=crypto:1 F8_128_HMAC_SHA1_80 inline:AAAA", media="m=audio 40000 RTP/SAVP 0"),
            "F8_128_HMAC_SHA1_80 is not supported",
        ),
        (
            offer("a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:AAAA", media="m=audio 4 RTP/SAVP 0"),
            "30 bytes",
        ),
        (offer(media="m=video 40000 RTP/AVP 96"), "no audio"),
        (offer(media="m=audio 0 RTP/AVP 0"), "no audio"),
        (offer().replace("c=IN IP4 192.0.2.10\r\n", ""), "no connection"),
        (offer().replace("c=IN IP4 192.0.2.10", "c=IN IP4 phone.example"), "not an IP"),
        (offer().replace("v=0", "v=1"), "version"),
        (offer().replace("v=0\r\n", ""), "no v="),
        (offer(media="m=audio x RTP/AVP 0"), "media port"),
        (offer(media="m=audio 70000 RTP/AVP 0"), "media port"),
        (offer(media="m=audio 4000 RTP/AVP zero"), "payload type"),
        (offer("a=rtpmap:101 telephone-event"), "rtpmap"),
        (offer("garbage"), "not an SDP line"),
        ("", "no v="),
        ("v=0\r\n" + "a=x\r\n" * 20000, "too large"),
    ],
)
def test_offers_we_cannot_answer_say_why(text: str, reason: str) -> None:
    with pytest.raises(SdpError, match=reason) as caught:
        negotiate(parse_offer(text))
    assert reason in caught.value.reason


def test_bare_line_feeds_are_accepted() -> None:
    assert parse_offer(offer().replace("\r\n", "\n")).port == 40000


def test_the_media_security_a_webhook_tells_is_what_the_answer_will_select() -> None:
    key = "inline:" + base64.b64encode(bytes(range(30))).decode()
    srtp = offer(f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 {key}", media="m=audio 40000 RTP/SAVP 0")
    assert media_security(offer(), secure=False) == "rtp"
    assert media_security(offer(), secure=True) == "rtp"
    assert media_security(srtp, secure=True) == "srtp"
    # A key over plain signalling is refused at the answer, as is an offer with no common
    # codec: unknown, so the webhook leaves the field out.
    assert media_security(srtp, secure=False) is None
    assert media_security(offer(media="m=audio 40000 RTP/AVP 18"), secure=True) is None

"""SIP messages captured from real peers on loopback (baresip 1.0.0, SIPp 3.x) calling hark.

Kept byte for byte (line ends included) as the parser's reference inputs and the seeds of
its fuzzing.
"""

BARESIP_INVITE = (
    b"INVITE sip:hark@127.0.0.1:5090 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 127.0.0.1:5072;branch=z9hG4bKc45c7461c808ec7b;rport\r\n"
    b"Contact: <sip:alice-0x5577c377db70@127.0.0.1:5072>\r\n"
    b"Max-Forwards: 70\r\n"
    b"To: <sip:hark@127.0.0.1:5090>\r\n"
    b"From: <sip:alice@127.0.0.1>;tag=8e879056e547b804\r\n"
    b"Call-ID: bf287a847a6ecd78\r\n"
    b"CSeq: 16583 INVITE\r\n"
    b"User-Agent: baresip v1.0.0 (x86_64/linux)\r\n"
    b"Allow: INVITE,ACK,BYE,CANCEL,OPTIONS,NOTIFY,SUBSCRIBE,INFO,MESSAGE,REFER\r\n"
    b"Supported:\r\n"
    b"Content-Type: application/sdp\r\n"
    b"Content-Length: 338\r\n"
    b"\r\n"
    b"v=0\r\n"
    b"o=- 2858415836 1804417229 IN IP4 192.0.2.2\r\n"
    b"s=-\r\n"
    b"c=IN IP4 192.0.2.2\r\n"
    b"t=0 0\r\n"
    b"a=tool:baresip 1.0.0\r\n"
    b"m=audio 4488 RTP/AVP 0 8 101\r\n"
    b"a=rtpmap:0 PCMU/8000\r\n"
    b"a=rtpmap:8 PCMA/8000\r\n"
    b"a=rtpmap:101 telephone-event/8000\r\n"
    b"a=fmtp:101 0-15\r\n"
    b"a=sendrecv\r\n"
    b"a=label:1\r\n"
    b"a=rtcp-rsize\r\n"
    b"a=ssrc:1201368930 cname:sip:alice@127.0.0.1\r\n"
    b"a=minptime:20\r\n"
    b"a=ptime:20\r\n"
)

BARESIP_ACK = (
    b"ACK sip:hark@127.0.0.1:5090 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 127.0.0.1:5072;branch=z9hG4bK71fd5252c583d3c9;rport\r\n"
    b"Max-Forwards: 70\r\n"
    b"To: <sip:hark@127.0.0.1:5090>;tag=67314e133ad243a9\r\n"
    b"From: <sip:alice@127.0.0.1>;tag=8e879056e547b804\r\n"
    b"Call-ID: bf287a847a6ecd78\r\n"
    b"CSeq: 16583 ACK\r\n"
    b"User-Agent: baresip v1.0.0 (x86_64/linux)\r\n"
    b"Content-Length: 0\r\n"
    b"\r\n"
)

BARESIP_BYE = (
    b"BYE sip:hark@127.0.0.1:5090 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 127.0.0.1:5072;branch=z9hG4bK6ee6363c1496beef;rport\r\n"
    b"Max-Forwards: 70\r\n"
    b"To: <sip:hark@127.0.0.1:5090>;tag=67314e133ad243a9\r\n"
    b"From: <sip:alice@127.0.0.1>;tag=8e879056e547b804\r\n"
    b"Call-ID: bf287a847a6ecd78\r\n"
    b"CSeq: 16584 BYE\r\n"
    b"User-Agent: baresip v1.0.0 (x86_64/linux)\r\n"
    b"Content-Length: 0\r\n"
    b"\r\n"
)

BARESIP_OPTIONS = (
    b"OPTIONS sip:hark@127.0.0.1:5090 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 127.0.0.1:5072;branch=z9hG4bKdd5885e9c540fe67;rport\r\n"
    b"Max-Forwards: 70\r\n"
    b"To: <sip:hark@127.0.0.1:5090>\r\n"
    b"From: <sip:alice@127.0.0.1>;tag=2ebb88470e7cd6b6\r\n"
    b"Call-ID: 5030dd552c835552\r\n"
    b"CSeq: 59838 OPTIONS\r\n"
    b"User-Agent: baresip v1.0.0 (x86_64/linux)\r\n"
    b"Accept: application/sdp\r\n"
    b"Content-Length: 0\r\n"
    b"\r\n"
)

SIPP_INVITE = (
    b"INVITE sip:service@127.0.0.1:5090 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK-11607-1-0\r\n"
    b"From: sipp <sip:sipp@127.0.0.1:5060>;tag=11607SIPpTag001\r\n"
    b"To: service <sip:service@127.0.0.1:5090>\r\n"
    b"Call-ID: 1-11607@127.0.0.1\r\n"
    b"CSeq: 1 INVITE\r\n"
    b"Contact: sip:sipp@127.0.0.1:5060\r\n"
    b"Max-Forwards: 70\r\n"
    b"Subject: Performance Test\r\n"
    b"Content-Type: application/sdp\r\n"
    b"Content-Length:   129\r\n"
    b"\r\n"
    b"v=0\r\n"
    b"o=user1 53655765 2353687637 IN IP4 127.0.0.1\r\n"
    b"s=-\r\n"
    b"c=IN IP4 127.0.0.1\r\n"
    b"t=0 0\r\n"
    b"m=audio 6000 RTP/AVP 0\r\n"
    b"a=rtpmap:0 PCMU/8000\r\n"
)

ALL = [BARESIP_INVITE, BARESIP_ACK, BARESIP_BYE, BARESIP_OPTIONS, SIPP_INVITE]

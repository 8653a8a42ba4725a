"""The encapsulation between relay and worker: the client's address before each datagram.

Relay and worker exchange the client's datagrams (STUN, DTLS, SRTP: untouched) behind a
header that names the client::

    0xFE | 4 | client port (2, big-endian) | client IPv4 (4)          8 bytes
    0xFE | 6 | client port (2, big-endian) | client IPv6 (16)        20 bytes

Both directions use it: relay → worker, "this came from the client at ..."; worker →
relay, "send this to the client at ...". A family byte of 0 (``CONTROL``) is a message of
the relay's own: its hello (``hark.edge.relay_hello``), by which a worker learns which
addresses may send it framed datagrams at all. The first byte is outside every range RFC 7983
assigns (STUN 0-3, DTLS 20-63, RTP/RTCP 128-191), so a worker's shared port can tell
relayed datagrams from direct ones by their first byte.

Why a header and not a socket per flow on the relay: the worker keeps seeing each client's
real address (its ICE, logs and limits stay per client), the relay needs two sockets per
process however many flows it carries (so one ``recvmmsg`` reads a batch of many flows), and
nothing at the worker changes when a relay restarts or another relay takes a flow over: the
next datagram names the same client.
"""

from __future__ import annotations

import ipaddress
import struct

MAGIC = 0xFE
CONTROL = 0
IPV4 = 4
IPV6 = 6
HEADER_V4 = 8
HEADER_V6 = 20

Address = tuple[str, int]


def encode_header(client: Address) -> bytes:
    """The header naming ``client``."""
    ip = ipaddress.ip_address(client[0])
    family = IPV4 if ip.version == 4 else IPV6
    return struct.pack("!BBH", MAGIC, family, client[1]) + ip.packed


def decode(data: bytes) -> tuple[Address, bytes] | None:
    """The client and the datagram of an encapsulated datagram, or None if it is not one."""
    if len(data) < HEADER_V4 or data[0] != MAGIC:
        return None
    family = data[1]
    port = int.from_bytes(data[2:4], "big")
    if family == IPV4:
        return (str(ipaddress.IPv4Address(data[4:8])), port), data[HEADER_V4:]
    if family == IPV6 and len(data) >= HEADER_V6:
        return (str(ipaddress.IPv6Address(data[4:20])), port), data[HEADER_V6:]
    return None

"""The one thing the edge reads in a STUN message: the USERNAME of a Binding request.

Kept apart from the WebRTC transport (which uses it too) so that the relay's processes
import nothing of aiortc: a small heap keeps the garbage collector's pauses short.
"""

from __future__ import annotations

import struct

_STUN_MAGIC_COOKIE = b"\x21\x12\xa4\x42"
_STUN_BINDING_REQUEST = 0x0001
_STUN_USERNAME = 0x0006
_STUN_HEADER = 20


def stun_request_username(data: bytes) -> str | None:
    """The USERNAME of a STUN Binding request, or None for anything else.

    Only the header and the attribute list are read: integrity is for the ICE connection
    to check once the datagram reaches it.
    """
    if len(data) < _STUN_HEADER or data[4:8] != _STUN_MAGIC_COOKIE:
        return None
    message_type, length = struct.unpack_from("!HH", data, 0)
    if message_type != _STUN_BINDING_REQUEST:
        return None
    end = min(len(data), _STUN_HEADER + length)
    pos = _STUN_HEADER
    while pos + 4 <= end:
        attr_type, attr_len = struct.unpack_from("!HH", data, pos)
        if attr_type == _STUN_USERNAME:
            return data[pos + 4 : pos + 4 + attr_len].decode("utf-8", "replace")
        pos += 4 + ((attr_len + 3) & ~3)
    return None

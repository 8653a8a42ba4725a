"""What ICE peers send, made by hand for the tests of the UDP mux and of the relay."""

from __future__ import annotations

from aioice import stun


def binding_request(username: str) -> bytes:
    """A STUN binding request with ``username`` (``server-ufrag:client-ufrag``), with a
    fixed password's integrity and a fingerprint."""
    request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    request.attributes["USERNAME"] = username
    request.attributes["PRIORITY"] = 1
    request.add_message_integrity(b"0123456789012345678901")
    request.add_fingerprint()
    return bytes(request)

"""What the fleet secret does to the records of a shared store: named by a keyed hash,
signed, and their secrets encrypted.

Redis is shared over the network and often run with little care; what a worker reads
there decides who may use the API (ephemeral keys) and where clients' requests, with their
API keys, are sent (the worker registry, calls). So a record read from it is believed only
if it was made by a holder of the fleet secret (``--fleet-secret`` / ``HARK_FLEET_SECRET``):

- an ephemeral key's record is stored under ``HMAC(secret, digest of the key)``, not the
  digest itself (so whoever reads Redis cannot test guessed keys), and encrypted with
  AES-256-GCM under a key derived from the secret, bound to its name and its expiry: a
  record written without the secret does not open and is ignored, and what a key's session
  holds (MCP ``authorization`` headers, instructions) is not readable in Redis;
- a call's record and a worker's registry entry carry an HMAC over every field that is
  used (and their id), so a call pointed at another worker or a worker added by hand is
  ignored: no forwarded request ever goes to it.

What is not sealed: the per-key counters (open sessions, usage per minute). Whoever can
write Redis can make a key look over its limit or under it, as they can delete anything;
they cannot mint a key or receive a request. Each use has its own key derived from the
secret, so no output of one can be replayed as another.
"""

from __future__ import annotations

import hashlib
import hmac
import os

_MAC_BYTES = 16
_NONCE_BYTES = 12
# The length of a signature (hex digits).
SIGNATURE_CHARS = 2 * _MAC_BYTES


def _derive(secret: bytes, label: bytes) -> bytes:
    return hmac.new(secret, b"hark store " + label, hashlib.sha256).digest()


def _fields(parts: tuple[str | bytes, ...]) -> bytes:
    """``parts`` each behind its length: no two lists of fields read as the same bytes."""
    out = bytearray()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        out += len(data).to_bytes(4, "big") + data
    return bytes(out)


class Seal:
    """Keyed names, signatures and encryption for store records, from the fleet secret."""

    def __init__(self, secret: str) -> None:
        key = secret.encode("utf-8")
        self._name_key = _derive(key, b"name")
        self._sign_key = _derive(key, b"sign")
        self._encrypt_key = _derive(key, b"encrypt")

    def __repr__(self) -> str:
        return "Seal()"

    def name(self, digest: str) -> str:
        """Where the record of ``digest`` (a key's hash) is stored: a keyed hash of it."""
        return hmac.new(self._name_key, digest.encode("ascii"), hashlib.sha256).hexdigest()

    def sign(self, kind: str, *fields: str | bytes) -> str:
        """The signature (hex) of a record of ``kind`` made of ``fields``."""
        signed = _fields((kind, *fields))
        return hmac.new(self._sign_key, signed, hashlib.sha256).hexdigest()[:SIGNATURE_CHARS]

    def verify(self, signature: str | bytes, kind: str, *fields: str | bytes) -> bool:
        """Whether ``signature`` is this fleet's for that record."""
        if isinstance(signature, bytes):
            signature = signature.decode("ascii", "replace")
        return hmac.compare_digest(signature, self.sign(kind, *fields))

    def encrypt(self, plaintext: bytes, *context: str | bytes) -> bytes:
        """``plaintext`` encrypted and authenticated, bound to ``context`` (not stored)."""
        # aiortc depends on cryptography for DTLS; it is imported here only, so the relay's
        # processes, which never handle a key record, do not load it.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(_NONCE_BYTES)
        return nonce + AESGCM(self._encrypt_key).encrypt(nonce, plaintext, _fields(context))

    def decrypt(self, sealed: bytes, *context: str | bytes) -> bytes | None:
        """What ``encrypt`` sealed with the same ``context``, or None for anything else."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(sealed) < _NONCE_BYTES + 16:
            return None
        nonce, body = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
        try:
            return AESGCM(self._encrypt_key).decrypt(nonce, body, _fields(context))
        except InvalidTag:
            return None

"""The routing hint in a server ICE ufrag: which worker of which fleet issued an answer.

A worker behind the relay hands out server ufrags that are a signed token, base64 with the
standard alphabet (whose 64 characters are exactly ICE's ``ice-char``), 32 characters::

    version (1) | fleet tag (2) | worker (6) | nonce (6) | MAC (9)      = 24 bytes

- *fleet tag*: the first bytes of ``HMAC(secret, "hark fleet tag")``. It names the fleet
  (the set of hosts sharing the secret) without revealing the secret, so a relay can tell a
  hint of another fleet, or of a rotated secret, from a forged one.
- *worker*: the 6 bytes of the worker's id (``wrk_`` + 12 hex digits).
- *nonce*: random, so that every ufrag is distinct (it is what made a ufrag unique before).
- *MAC*: ``HMAC-SHA256(secret, "hark route v1" | the 15 bytes before it)`` cut to 72 bits.

The MAC covers the nonce, so each hint is good for the one answer that carried it: a
client cannot write a hint for a worker that never answered it, nor reuse one hint to name
another worker. Forging one takes about 2**72 tries, each a packet the relay drops and
counts. The fleet secret (``--fleet-secret`` / ``HARK_FLEET_SECRET``) is never logged.

``RouteSigner`` is the worker's side, ``RouteVerifier`` the relay's; both are here so that
the two agree by construction.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from enum import Enum

HINT_VERSION = 1
HINT_LENGTH = 32
_TOKEN_BYTES = 24
_SIGNED_BYTES = 15
_MAC_BYTES = 9
_WORKER_ID = re.compile(r"^wrk_([0-9a-f]{12})$")
_MAC_LABEL = b"hark route v1"
_TAG_LABEL = b"hark fleet tag"
# A secret shorter than this is guessable offline from one captured hint.
MIN_SECRET_BYTES = 16


class HintError(Enum):
    """Why a ufrag does not route; the relay counts drops under these names."""

    MALFORMED = "malformed_hint"
    OTHER_FLEET = "other_fleet"
    BAD_MAC = "bad_hint"


@dataclass(frozen=True, slots=True)
class Route:
    """What a verified hint says: the worker that issued the answer."""

    worker_id: str


def _check_secret(secret: str) -> bytes:
    key = secret.encode("utf-8")
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"the fleet secret must be at least {MIN_SECRET_BYTES} bytes long")
    return key


def _fleet_tag(key: bytes) -> bytes:
    return hmac.new(key, _TAG_LABEL, hashlib.sha256).digest()[:2]


def _mac(key: bytes, signed: bytes) -> bytes:
    return hmac.new(key, _MAC_LABEL + signed, hashlib.sha256).digest()[:_MAC_BYTES]


class RouteSigner:
    """Makes the server ufrags of one worker: ``RouteSigner(secret, worker_id).ufrag()``."""

    def __init__(self, secret: str, worker_id: str) -> None:
        match = _WORKER_ID.match(worker_id)
        if match is None:
            raise ValueError(f"a worker id is wrk_ and 12 hex digits, not {worker_id!r}")
        self._key = _check_secret(secret)
        self._prefix = bytes([HINT_VERSION]) + _fleet_tag(self._key) + bytes.fromhex(match[1])
        self.worker_id = worker_id

    def __repr__(self) -> str:
        return f"RouteSigner(worker_id={self.worker_id!r})"

    def ufrag(self) -> str:
        """A fresh server ufrag naming this worker, good for one answer."""
        signed = self._prefix + secrets.token_bytes(6)
        return base64.b64encode(signed + _mac(self._key, signed)).decode("ascii")


class RouteVerifier:
    """Checks the hint of a server ufrag against the fleet secret (the relay's side)."""

    def __init__(self, secret: str) -> None:
        self._key = _check_secret(secret)
        self._tag = _fleet_tag(self._key)

    def __repr__(self) -> str:
        return "RouteVerifier()"

    def verify(self, ufrag: str) -> Route | HintError:
        """The route a server ufrag names, or why it names none."""
        if len(ufrag) != HINT_LENGTH:
            return HintError.MALFORMED
        try:
            token = base64.b64decode(ufrag, validate=True)
        except (binascii.Error, ValueError):
            return HintError.MALFORMED
        if len(token) != _TOKEN_BYTES or token[0] != HINT_VERSION:
            return HintError.MALFORMED
        if token[1:3] != self._tag:
            return HintError.OTHER_FLEET
        signed, mac = token[:_SIGNED_BYTES], token[_SIGNED_BYTES:]
        if not hmac.compare_digest(mac, _mac(self._key, signed)):
            return HintError.BAD_MAC
        return Route(worker_id="wrk_" + token[3:9].hex())

"""The routing hint in a server ICE ufrag: which worker of which fleet issued an answer,
and until when it may start new flows.

A worker behind the relay hands out server ufrags that are a signed token, base64 with the
standard alphabet (whose 64 characters are exactly ICE's ``ice-char``), 36 characters::

    version (1) | fleet tag (2) | worker (6) | expires (4) | nonce (5) | MAC (9)   = 27 bytes

- *fleet tag*: the first bytes of ``HMAC(secret, "hark fleet tag")``. It names the fleet
  (the set of hosts sharing the secret) without revealing the secret, so a relay can tell a
  hint of another fleet, or of a rotated secret, from a forged one.
- *worker*: the 6 bytes of the worker's id (``wrk_`` + 12 hex digits).
- *expires*: Unix seconds (big-endian), ``HINT_TTL_S`` after the answer. A relay makes no
  new flow from a hint past it: the hint of one old answer cannot make flows forever. The
  flows it made while it was fresh go on (the call's consent checks carry it all call
  long); a call that needs a new one later (a changed address) makes an ICE restart,
  whose answer carries a fresh hint.
- *nonce*: random, so that every ufrag is distinct (it is what made a ufrag unique before).
- *MAC*: ``HMAC-SHA256(secret, "hark route v2" | the 18 bytes before it)`` cut to 72 bits.

The MAC covers the nonce and the expiry, so each hint is good for the one answer that
carried it, until its time: a client cannot write a hint for a worker that never answered
it, reuse one hint to name another worker, or push its expiry back. Forging one takes about
2**72 tries, each a packet the relay drops and counts. The fleet secret
(``--fleet-secret`` / ``HARK_FLEET_SECRET``) is never logged.

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
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

HINT_VERSION = 2
HINT_LENGTH = 36
# How long after its answer a hint may start flows: room for a client that applies the
# answer late and for clocks of the fleet's hosts a little apart.
HINT_TTL_S = 120
_TOKEN_BYTES = 27
_SIGNED_BYTES = 18
_MAC_BYTES = 9
_WORKER_ID = re.compile(r"^wrk_([0-9a-f]{12})$")
_MAC_LABEL = b"hark route v2"
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
    """What a verified hint says: the worker that issued the answer, and until when (Unix
    seconds) the hint may start new flows."""

    worker_id: str
    expires_at: int


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
    """Makes the server ufrags of one worker: ``RouteSigner(secret, worker_id).ufrag()``.

    ``clock`` gives Unix seconds (the tests hand in an old one to make stale hints)."""

    def __init__(
        self, secret: str, worker_id: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        match = _WORKER_ID.match(worker_id)
        if match is None:
            raise ValueError(f"a worker id is wrk_ and 12 hex digits, not {worker_id!r}")
        self._key = _check_secret(secret)
        self._prefix = bytes([HINT_VERSION]) + _fleet_tag(self._key) + bytes.fromhex(match[1])
        self.worker_id = worker_id
        self._clock = clock

    def __repr__(self) -> str:
        return f"RouteSigner(worker_id={self.worker_id!r})"

    def ufrag(self) -> str:
        """A fresh server ufrag naming this worker, good for one answer."""
        expires = int(self._clock()) + HINT_TTL_S
        signed = self._prefix + expires.to_bytes(4, "big") + secrets.token_bytes(5)
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
        return Route(
            worker_id="wrk_" + token[3:9].hex(), expires_at=int.from_bytes(token[9:13], "big")
        )

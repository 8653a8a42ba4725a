"""How a worker learns which addresses its relays send from: the relay's signed hello.

A worker takes a framed datagram (``hark.edge.framing``) as the word of a relay, "this
came from the client at ...": whoever may send it one can speak for any client. So a worker
takes framed datagrams only from the addresses of relays that proved they hold the fleet
secret. Once a second each relay process sends every worker of the registry, from the
socket it forwards from, a hello in the framing with the family byte ``CONTROL``::

    0xFE | 0 | version (1) | sent at (8, Unix ms, big-endian) | worker (6) | MAC (16)

with MAC = ``HMAC-SHA256(secret, "hark relay hello v1" | the 17 bytes before it)`` cut to
128 bits. The worker checks it (its own id, sent within ``HELLO_WINDOW_S`` of its clock, a
MAC it has not seen before, the MAC itself) and then takes framed datagrams from the
hello's source address for ``HELLO_TTL_S``, which every hello pushes back.

Why a hello and not a MAC on every datagram or a list of addresses: the per-datagram check
is a look-up in a dict of a few addresses, and the HMAC is paid once a second per relay
process; the address is the one the worker actually sees (after whatever NAT is between
them), with nothing to configure; and a relay that stops saying hello stops being trusted
within seconds. What it does not stop: someone on the path between relay and worker, who
can spoof the relay's address anyway (keep that network private, as the chart's network
policy does).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections import OrderedDict
from collections.abc import Callable

from hark.edge import framing

HELLO_VERSION = 1
HELLO_LENGTH = 33
# A relay says hello this often, and a worker trusts its address this long after the last:
# a lost hello or two change nothing.
HELLO_INTERVAL_S = 1.0
HELLO_TTL_S = 5.0
# How far apart the relay's clock and the worker's may be. A replay is refused anyway
# (every MAC is taken once); the window bounds how many MACs a worker must remember.
HELLO_WINDOW_S = 30.0
_SIGNED_BYTES = 17
_MAC_BYTES = 16
_LABEL = b"hark relay hello v1"
_WORKER_ID = re.compile(r"^wrk_([0-9a-f]{12})$")
# Bound on remembered MACs: a relay process sends one per second per worker.
_MAX_SEEN = 65536


def _worker_bytes(worker_id: str) -> bytes | None:
    match = _WORKER_ID.match(worker_id)
    return None if match is None else bytes.fromhex(match[1])


def _mac(key: bytes, signed: bytes) -> bytes:
    return hmac.new(key, _LABEL + signed, hashlib.sha256).digest()[:_MAC_BYTES]


class HelloSigner:
    """The relay's side: ``HelloSigner(secret).hello(worker_id)`` is the datagram to send."""

    def __init__(self, secret: str, *, clock: Callable[[], float] = time.time) -> None:
        self._key = secret.encode("utf-8")
        self._clock = clock

    def __repr__(self) -> str:
        return "HelloSigner()"

    def hello(self, worker_id: str) -> bytes | None:
        """The hello for ``worker_id`` as of now (None for an id that is not a worker's)."""
        worker = _worker_bytes(worker_id)
        if worker is None:
            return None
        sent_at = int(self._clock() * 1000).to_bytes(8, "big")
        signed = bytes((framing.MAGIC, framing.CONTROL, HELLO_VERSION)) + sent_at + worker
        return signed + _mac(self._key, signed)


class HelloChecker:
    """The worker's side: whether a datagram is a fresh, genuine hello meant for it."""

    def __init__(
        self, secret: str, worker_id: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        worker = _worker_bytes(worker_id)
        if worker is None:
            raise ValueError(f"a worker id is wrk_ and 12 hex digits, not {worker_id!r}")
        self._key = secret.encode("utf-8")
        self._prefix = bytes((framing.MAGIC, framing.CONTROL, HELLO_VERSION))
        self._worker = worker
        self._clock = clock
        # MAC → when it may be forgotten (its hello is then outside the window anyway).
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def __repr__(self) -> str:
        return "HelloChecker()"

    def check(self, data: bytes) -> bool:
        """True for a hello of this fleet, for this worker, fresh and never seen before."""
        if len(data) != HELLO_LENGTH or data[:3] != self._prefix or data[11:17] != self._worker:
            return False
        now = self._clock()
        sent_at = int.from_bytes(data[3:11], "big") / 1000
        if abs(now - sent_at) > HELLO_WINDOW_S:
            return False
        mac = data[_SIGNED_BYTES:]
        if mac in self._seen or not hmac.compare_digest(mac, _mac(self._key, data[:17])):
            return False
        while self._seen and (
            next(iter(self._seen.values())) < now or len(self._seen) >= _MAX_SEEN
        ):
            self._seen.popitem(last=False)
        self._seen[mac] = now + 2 * HELLO_WINDOW_S
        return True

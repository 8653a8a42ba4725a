"""Digest authentication of SIP requests, the server's side (RFC 3261 §22, RFC 7616, RFC 8760).

A request without credentials is answered 401 with a challenge for each algorithm offered,
each with ``qop="auth"`` and a nonce of ours. By default only MD5 is offered: RFC 8760 has
a client take the first challenge it supports, but phones in the field do not (SIPp answers
only the first, baresip 1.0 gives up on a SHA-256 one even beside an MD5 one); SHA-256 is
there for a deployment whose phones all take it (``algorithms``). A nonce carries the time
it was issued and an HMAC of that time and the caller's address under a secret of this
process, so checking one needs no table of issued nonces: a forged nonce fails the HMAC, one
issued to another address fails it too, and one older than ``nonce_lifetime_s`` is *stale*,
answered with a fresh challenge marked ``stale=true`` (the phone retries with the same
password, without asking its user). Under ``qop=auth`` each nonce's count (``nc``) must rise,
so a captured request cannot be replayed from the same address while its nonce lives; the
last count of recent nonces is kept, bounded.

Sans-I/O: the time is an argument.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hark.transports.sip.message import Request, SipParseError, SipUri, split_list

DEFAULT_REALM = "hark"
NONCE_LIFETIME_S = 300.0
# Nonces whose last count is remembered (a few dozen bytes each).
MAX_TRACKED_NONCES = 10_000
ALGORITHMS: dict[str, Callable[[bytes], str]] = {
    "MD5": lambda data: hashlib.md5(data, usedforsecurity=False).hexdigest(),
    "SHA-256": lambda data: hashlib.sha256(data).hexdigest(),
}

DEFAULT_ALGORITHMS = ("MD5",)

Outcome = Literal["ok", "missing", "stale", "bad"]


@dataclass(frozen=True, slots=True)
class DigestResult:
    """What the credentials of a request came to: ``ok`` (``username`` proved its
    password), ``missing`` (none for our realm), ``stale`` (right, but on an old nonce) or
    ``bad`` (wrong, forged, replayed or malformed)."""

    outcome: Outcome
    username: str | None = None


class DigestAuthenticator:
    """Issues challenges and checks the answers to them for one realm."""

    def __init__(
        self,
        realm: str = DEFAULT_REALM,
        *,
        secret: bytes | None = None,
        nonce_lifetime_s: float = NONCE_LIFETIME_S,
        algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS,
    ) -> None:
        unknown = set(algorithms) - set(ALGORITHMS)
        if unknown or not algorithms:
            raise ValueError(f"digest algorithms are {', '.join(ALGORITHMS)}, not {unknown}")
        self.realm = realm
        self.algorithms = algorithms
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self._lifetime = nonce_lifetime_s
        self._counts: OrderedDict[str, int] = OrderedDict()

    def challenge(
        self, source_ip: str, now: float, *, stale: bool = False
    ) -> list[tuple[str, str]]:
        """The ``WWW-Authenticate`` headers of a 401 to a request from ``source_ip``."""
        nonce = self._nonce(source_ip, int(now * 1000))
        flag = ", stale=true" if stale else ""
        return [
            (
                "WWW-Authenticate",
                f'Digest realm="{self.realm}", nonce="{nonce}", algorithm={algorithm}, '
                f'qop="auth"{flag}',
            )
            for algorithm in self.algorithms
        ]

    def verify(
        self,
        request: Request,
        source_ip: str,
        now: float,
        password_of: Callable[[str], str | None],
    ) -> DigestResult:
        """Check the request's ``Authorization`` for our realm; ``password_of`` gives the
        password of a username (None: no such user)."""
        params = None
        for value in request.get_all("Authorization"):
            candidate = _parse(value)
            if candidate is not None and candidate.get("realm") == self.realm:
                params = candidate
                break
        if params is None:
            return DigestResult("missing")
        username = params.get("username")
        nonce, uri, response = params.get("nonce"), params.get("uri"), params.get("response")
        algorithm = params.get("algorithm", "MD5").upper()
        hash_of = ALGORITHMS.get(algorithm) if algorithm in self.algorithms else None
        if not username or not nonce or not uri or not response or hash_of is None:
            return DigestResult("bad", username)
        password = password_of(username)
        if password is None or not _same_host(uri, request.uri):
            return DigestResult("bad", username)
        issued = self._issued(nonce, source_ip)
        if issued is None:
            return DigestResult("bad", username)
        ha1 = hash_of(f"{username}:{self.realm}:{password}".encode())
        ha2 = hash_of(f"{request.method}:{uri}".encode())
        qop = params.get("qop")
        if qop is None:
            expected = hash_of(f"{ha1}:{nonce}:{ha2}".encode())
        elif qop.lower() == "auth" and params.get("cnonce") and params.get("nc"):
            nc = params["nc"]
            expected = hash_of(f"{ha1}:{nonce}:{nc}:{params['cnonce']}:auth:{ha2}".encode())
        else:
            return DigestResult("bad", username)
        if not hmac.compare_digest(expected.encode(), response.lower().encode()):
            return DigestResult("bad", username)
        if now * 1000 - issued > self._lifetime * 1000:
            return DigestResult("stale", username)
        if qop is not None and not self._count_rises(nonce, params["nc"]):
            return DigestResult("bad", username)
        return DigestResult("ok", username)

    def _nonce(self, source_ip: str, issued_ms: int) -> str:
        mac = hmac.new(self._secret, f"{issued_ms}:{source_ip}".encode(), hashlib.sha256)
        return f"{issued_ms:x}.{mac.hexdigest()[:32]}"

    def _issued(self, nonce: str, source_ip: str) -> int | None:
        """When ``nonce`` was issued to ``source_ip`` (ms), or None when we did not."""
        stamp, dot, _ = nonce.partition(".")
        if not dot or len(stamp) > 16:
            return None
        try:
            issued = int(stamp, 16)
        except ValueError:
            return None
        if not hmac.compare_digest(self._nonce(source_ip, issued), nonce):
            return None
        return issued

    def _count_rises(self, nonce: str, nc: str) -> bool:
        try:
            count = int(nc, 16)
        except ValueError:
            return False
        if count <= self._counts.get(nonce, 0):
            return False
        self._counts[nonce] = count
        self._counts.move_to_end(nonce)
        while len(self._counts) > MAX_TRACKED_NONCES:
            self._counts.popitem(last=False)
        return True


def _same_host(digest_uri: str, request_uri: str) -> bool:
    """Whether the credentials' ``uri`` names the request's host. Not the whole URI: SIPp,
    for one, leaves out the user part; the response covers the ``uri`` it names either way,
    and a count that must rise stops a replay to another number."""
    try:
        ours, theirs = SipUri.parse(request_uri), SipUri.parse(digest_uri)
    except SipParseError:
        return False
    if ours.scheme not in ("sip", "sips"):
        return digest_uri == request_uri
    return theirs.host.lower() == ours.host.lower() and theirs.port == ours.port


def _parse(value: str) -> dict[str, str] | None:
    """The parameters of a ``Digest`` credentials value (names lower-cased, values
    unquoted), or None when it is not one."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "digest":
        return None
    params: dict[str, str] = {}
    try:
        items = split_list(rest)
    except SipParseError:
        return None
    for item in items:
        name, eq, raw = item.partition("=")
        if not eq:
            return None
        raw = raw.strip()
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            raw = raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        params[name.strip().lower()] = raw
    return params

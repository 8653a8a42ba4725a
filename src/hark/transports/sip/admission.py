"""Whether a new INVITE may ring: the per-source rate limit, then the inbound trunks.

Every INVITE that would start a call (not a retransmission, not a re-INVITE) is looked at
here before anything else happens to it: no 100 Trying, no ring, no webhook. Any other
request outside a dialog (OPTIONS, REGISTER, MESSAGE…) is judged the same way, but for the
dialled numbers (it dials none), and is answered only once admitted. In order:

1. **Rate**: each source address has a token bucket of ``rate`` INVITEs a second, bursts of
   ``burst``; beyond it the INVITE is answered 503 with ``Retry-After`` (Kamailio's
   ``pike``). The buckets of at most ``MAX_SOURCES`` addresses are kept, the least recently
   seen dropped first.
2. **Trunks** (``trunk.py``), when any are configured: a source no trunk covers gets 403,
   and so does one whose trunks all require a TLS client certificate the request did not
   come with (``client_certificate.py``); a trunk that covers it without credentials
   admits it; one with credentials challenges it
   (401, ``digest.py``) and admits it once it answers with that trunk's username and
   password. Wrong credentials get 403; a stale nonce a fresh challenge. Only then are the
   dialled numbers checked (403 when the trunk may not call them), so that a stranger
   learns nothing of them.

Without trunks every INVITE that passes the rate limit is admitted, under no trunk: the
settings allow that only where SIP listens on loopback, or where a webhook decides each call.

Sans-I/O: the time is an argument.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from hark.transports.sip.client_certificate import ClientCertificate
from hark.transports.sip.digest import DigestAuthenticator
from hark.transports.sip.message import Request, SipParseError, SipUri
from hark.transports.sip.trunk import InboundTrunk

DEFAULT_RATE = 10.0
# Source addresses whose bucket is kept (about a hundred bytes each).
MAX_SOURCES = 10_000


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with an INVITE: admit it (``status`` None) under ``trunk`` (None: no
    trunks are configured), or answer ``status`` with ``headers``. ``reason`` says why, for
    the log."""

    status: int | None
    trunk: InboundTrunk | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    reason: str = ""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class InviteAdmission:
    """The gate in front of new calls: ``check`` each new INVITE."""

    def __init__(
        self,
        trunks: tuple[InboundTrunk, ...] = (),
        *,
        rate: float = DEFAULT_RATE,
        burst: float | None = None,
        digest: DigestAuthenticator | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError("the INVITE rate must be positive")
        self.trunks = trunks
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, 2 * rate)
        self.digest = digest if digest is not None else DigestAuthenticator()
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def check(
        self,
        request: Request,
        source_ip: str,
        now: float,
        certificate: ClientCertificate | None = None,
    ) -> Verdict:
        """The verdict on a new INVITE (or another out-of-dialog request) from ``source_ip``,
        over a TLS connection whose peer proved itself with ``certificate`` (None: none, or
        not over TLS)."""
        wait = self._take(source_ip, now)
        if wait is not None:
            retry = str(max(1, math.ceil(wait)))
            return Verdict(
                503, headers=[("Retry-After", retry)], reason="the per-source rate exceeded"
            )
        if not self.trunks:
            return Verdict(None)
        covering = [t for t in self.trunks if t.covers(source_ip)]
        if not covering:
            return Verdict(403, reason="no trunk takes calls from this address")
        covering = [t for t in covering if t.accepts(certificate)]
        if not covering:
            what = (
                "without a client certificate" if certificate is None else "with this certificate"
            )
            return Verdict(403, reason=f"no trunk takes calls from this address {what}")
        numbers = _dialled(request) if request.method == "INVITE" else None
        open_trunks = [t for t in covering if not t.needs_digest]
        for trunk in open_trunks:
            if numbers is None or trunk.may_call(*numbers):
                return Verdict(None, trunk)
        by_user = {t.username: t for t in covering if t.needs_digest}
        if not by_user:
            return Verdict(403, reason=f"trunk {open_trunks[0].name!r} may not call this number")

        def password_of(username: str) -> str | None:
            found = by_user.get(username)
            return found.password if found is not None else None

        result = self.digest.verify(request, source_ip, now, password_of)
        if result.outcome == "missing":
            return Verdict(401, headers=self.digest.challenge(source_ip, now), reason="challenged")
        chosen = by_user.get(result.username) if result.username is not None else None
        if chosen is None or result.outcome == "bad":
            return Verdict(403, reason="wrong credentials")
        if result.outcome == "stale":
            headers = self.digest.challenge(source_ip, now, stale=True)
            return Verdict(401, headers=headers, reason="stale nonce")
        if numbers is not None and not chosen.may_call(*numbers):
            return Verdict(403, reason=f"trunk {chosen.name!r} may not call this number")
        return Verdict(None, chosen)

    def _take(self, source_ip: str, now: float) -> float | None:
        """Take a token of ``source_ip``'s bucket: None, or the seconds until one is back."""
        bucket = self._buckets.get(source_ip)
        if bucket is None:
            bucket = self._buckets[source_ip] = _Bucket(self.burst, now)
            while len(self._buckets) > MAX_SOURCES:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(source_ip)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
            bucket.at = now
        if bucket.tokens < 1.0:
            return (1.0 - bucket.tokens) / self.rate
        bucket.tokens -= 1.0
        return None


def _dialled(request: Request) -> tuple[str | None, str | None]:
    """The numbers an INVITE dials: its Request-URI's user part and its To URI's."""
    users: list[str | None] = []
    for text in (request.uri, None):
        try:
            uri = SipUri.parse(text) if text is not None else request.to_addr.sip_uri()
        except SipParseError:
            users.append(None)
            continue
        # A tel: URI is all number (RFC 3966), its parameters after ';'.
        user = uri.opaque if uri.scheme == "tel" else uri.user
        users.append(user.partition(";")[0] if user else None)
    return users[0], users[1]

"""An offer's ICE candidates: how many it may list, and which the server sends checks to.

The server runs full ICE (aioice has no lite mode), so every candidate an offer lists is an
address the server sends STUN Binding requests to, with retransmissions. Taken as they
come, an offer would aim the server's packets at whatever it names: services on the
server's loopback, hosts of the network it sits in, cloud metadata, or a third party on
the internet, a few dozen times per candidate. So, before aiortc sees an offer:

- An offer may list at most ``MAX_OFFER_CANDIDATES`` distinct UDP candidates with an IP
  address (a candidate repeated in another media section counts once); one with more is
  refused (``OfferError``, a 400). Browsers list a handful: a host candidate per interface,
  one server-reflexive per STUN server, one relayed per TURN server.
- Only candidates whose address is within policy are kept (``CandidatePolicy``): public
  addresses; addresses of the same kind of network as the address clients reach the server
  at (loopback for a server on loopback, private for one on a private network, link-local
  for one on a link-local address); and the networks of the operator's egress allow-list
  (``--egress-allow``). Multicast, unspecified, documentation and reserved addresses are
  never kept unless allowed.
- Candidates the server could not check anyway are dropped too: TCP ones (aioice checks
  UDP only), mDNS names (``….local``, what browsers send by default; resolving them would
  need multicast), and anything that is not an IP address.
- ``a=end-of-candidates`` is dropped: with every listed candidate gone, aioice would
  declare the connection failed at once, before the client's own checks arrive.

Nothing is lost by this: the client is the controlling agent and checks the server's one
candidate itself, and the address its checks come from is learned as peer-reflexive and
checked back (RFC 8445 section 7.3.1.3). Those are addresses that talk to the server; a
call never connected is ended by the call's setup deadline.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field

from hark.tools.egress import EgressPolicy, IPAddress, refused_range

logger = logging.getLogger(__name__)

MAX_OFFER_CANDIDATES = 20
_END_OF_CANDIDATES = "a=end-of-candidates"
# The kinds of non-public network a candidate may share with the server (named as
# ``hark.tools.egress.refused_range`` names them); any other non-public range (multicast,
# unspecified, documentation, reserved…) is no network a peer can be on.
_NETWORK_KIND = {
    "loopback": "loopback",
    "private": "private",
    "unique local": "private",
    "site-local": "private",
    "shared (CGNAT)": "private",
    "link-local": "link-local",
}
_PUBLIC = "public"


class TooManyCandidates(ValueError):
    """The offer lists more candidates than ``MAX_OFFER_CANDIDATES``."""


def network_kind(address: IPAddress) -> str | None:
    """``"public"``, ``"loopback"``, ``"private"`` (RFC 1918, ULA, CGNAT), ``"link-local"``, or
    None for ranges no peer is on (multicast, unspecified, documentation, reserved…)."""
    why = refused_range(address)
    if why is None:
        return _PUBLIC
    return _NETWORK_KIND.get(why)


@dataclass(frozen=True, slots=True)
class CandidatePolicy:
    """Which candidate addresses a server reached at ``server`` sends checks to.

    ``server`` is the address clients reach the server at (the one its candidate carries;
    None when that is no IP address: then only public candidates qualify); ``allow`` is the
    operator's egress allow-list (only its networks apply: a candidate names an address,
    not a host).
    """

    server: IPAddress | None
    allow: EgressPolicy = field(default_factory=EgressPolicy)

    @classmethod
    def serving_at(cls, server: str, allow: EgressPolicy | None = None) -> CandidatePolicy:
        """The policy of a server whose candidate carries the address ``server``."""
        try:
            address: IPAddress | None = ipaddress.ip_address(server)
        except ValueError:
            address = None
        return cls(address, allow or EgressPolicy())

    def allows(self, address: IPAddress) -> bool:
        """Whether the server may send connectivity checks to ``address``."""
        kind = network_kind(address)
        if kind == _PUBLIC:
            return True
        if self.allow.refusal(address) is None:
            return True
        return kind is not None and self.server is not None and kind == network_kind(self.server)

    def screen(self, text: str) -> str:
        """``text`` (an SDP offer) with only the candidate lines this policy keeps, and no
        ``a=end-of-candidates``. Raises ``TooManyCandidates``."""
        lines = text.splitlines(keepends=True)
        kept: list[str] = []
        listed: set[tuple[str, IPAddress, str]] = set()
        dropped = 0
        for line in lines:
            if line.rstrip("\r\n") == _END_OF_CANDIDATES:
                continue
            if not line.startswith("a=candidate:"):
                kept.append(line)
                continue
            candidate = _udp_candidate(line)
            if candidate is None:
                dropped += 1
                continue
            listed.add(candidate)
            if len(listed) > MAX_OFFER_CANDIDATES:
                raise TooManyCandidates(
                    f"The SDP offer lists more than {MAX_OFFER_CANDIDATES} ICE candidates."
                )
            if self.allows(candidate[1]):
                kept.append(line)
            else:
                dropped += 1
        if dropped:
            logger.debug("offer: %d candidate lines dropped by the candidate policy", dropped)
        return "".join(kept)


def _udp_candidate(line: str) -> tuple[str, IPAddress, str] | None:
    """(component, address, port) of a UDP candidate line with an IP address, else None."""
    # a=candidate:foundation component transport priority address port typ type …
    fields = line.split()
    if len(fields) < 8 or fields[2].lower() != "udp" or fields[6] != "typ":
        return None
    try:
        address = ipaddress.ip_address(fields[4])
    except ValueError:
        return None
    if not fields[5].isdigit():
        return None
    return fields[1], address, fields[5]

"""Whether a verified binding request may make a new flow: limits per source and per hint.

A new flow costs the relay a table entry and a write to the flow mirror in Redis, and it
opens a path to a worker. Two limits keep that from being made in bulk:

- *per source IP*: a token bucket (``rate`` new flows a second, up to ``burst`` at once).
  A client makes a few flows per call (one per candidate address that reaches the relay);
  an office behind one NAT makes a few per call of each of its people. A flood from one
  host, over however many ports, gets ``rate`` a second and no more.
- *per hint*: the hint of one answer makes flows for at most ``MAX_FLOWS_PER_HINT`` client
  addresses. A hint is the call's (its nonce is the answer's), so a hint taken from one
  call, even fresh, cannot fan out over spoofed or hired addresses.

Only the slow path asks (a binding request that would make or move a flow); datagrams of
flows that exist never do. Both tables are bounded: hints are forgotten once expired
(``prune``), sources least recently seen first when there are too many (a forgotten source
gets its full burst again, nothing more).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

# Client addresses one answer's hint may make flows for: a browser's candidates that reach
# a public relay are its server-reflexive and relayed ones, a few per network interface.
MAX_FLOWS_PER_HINT = 8
# New flows a source IP may make per second, and at once.
SOURCE_FLOWS_PER_S = 20.0
SOURCE_FLOW_BURST = 100
# Bounds on the tables: hints still fresh, sources remembered.
MAX_HINTS = 65536
MAX_SOURCES = 65536

RATE_LIMITED = "rate_limited"
HINT_EXHAUSTED = "hint_exhausted"
TOO_MANY_HINTS = "too_many_hints"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass(slots=True)
class _Hint:
    expires_at: float
    clients: set[int]


@dataclass(slots=True, eq=False)
class FlowAdmission:
    """The relay process's limits on new flows (see the module docstring)."""

    rate: float = SOURCE_FLOWS_PER_S
    burst: int = SOURCE_FLOW_BURST
    per_hint: int = MAX_FLOWS_PER_HINT
    _sources: OrderedDict[str, _Bucket] = field(default_factory=OrderedDict, init=False, repr=False)
    _hints: dict[str, _Hint] = field(default_factory=dict, init=False, repr=False)

    def admit(
        self, source_ip: str, hint: str, hint_expires_at: float, client: int, now: float
    ) -> str | None:
        """Take a new flow of ``client`` (a flow key) from ``source_ip`` under ``hint``
        into account; None if it may be made, else the reason it may not (a drop reason).
        ``now`` is monotonic seconds; ``hint_expires_at`` Unix seconds (when to forget it)."""
        record = self._hints.get(hint)
        if record is not None and client not in record.clients:
            if len(record.clients) >= self.per_hint:
                return HINT_EXHAUSTED
        elif record is None and len(self._hints) >= MAX_HINTS:
            return TOO_MANY_HINTS
        bucket = self._sources.get(source_ip)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now)
            self._sources[source_ip] = bucket
            while len(self._sources) > MAX_SOURCES:
                self._sources.popitem(last=False)
        else:
            self._sources.move_to_end(source_ip)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.rate)
            bucket.at = now
        if bucket.tokens < 1.0:
            return RATE_LIMITED
        bucket.tokens -= 1.0
        if record is None:
            record = self._hints[hint] = _Hint(hint_expires_at, set())
        record.clients.add(client)
        return None

    def prune(self, wall_now: float) -> None:
        """Forget the hints that expired before ``wall_now`` (Unix seconds): they make no
        flows any more, whatever they made before."""
        for hint in [h for h, record in self._hints.items() if record.expires_at < wall_now]:
            del self._hints[hint]

"""The egress policy: which addresses a client may make this server connect to.

A session names places for the server to reach (an MCP tool's ``server_url``), and without a
policy every such URL is a way into the operator's network: loopback services, the pod
network, cloud metadata at 169.254.169.254. So a client-named host is resolved, and only
addresses on the public internet are connected to: loopback, private (RFC 1918, ULA),
link-local, shared (CGNAT), multicast, unspecified, documentation, benchmarking and other
reserved ranges are refused, in IPv4, IPv6 and the IPv6 forms that carry an IPv4 address
(mapped, compatible, NAT64, 6to4). The operator opens what clients are meant to reach with
an allow-list of networks and host names (``--egress-allow``).

The check is made on every connection, on the very address then connected to: the client
resolves with ``EgressPolicy.addresses`` and connects to an address it returned (the MCP
client's network backend does, ``hark.tools.mcp_client``), so a name that answers a public
address when checked and a private one when used (DNS rebinding) never gets through. URLs
the operator sets (``--llm-url``, webhooks) do not go through here.

One policy per process (``configure``, called by the app from its settings; ``hark serve``
runs one app per process), read by the session's MCP client when it connects.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# What a client may not reach unless the operator allows it, and what to call it in the log.
_REFUSED_V4: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignment"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
)
_REFUSED_V6: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "local NAT64"),
    ("100::/64", "discard"),
    ("2001::/23", "IETF protocol assignment"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
)
_REFUSED: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), why) for net, why in _REFUSED_V4 + _REFUSED_V6
)
# IPv6 forms that carry an IPv4 address, which is where a packet to them ends up.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


class EgressRefused(Exception):
    """A connection the egress policy does not allow; the message is fit for the client
    (it names the host the client gave, never what it resolved to)."""


class EgressPolicyError(ValueError):
    """An allow-list entry that is neither a network nor a host name."""


def refused_range(address: IPAddress) -> str | None:
    """Why ``address`` is refused by default (``"loopback"``, ``"private"``…), or None for a
    public address."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return refused_range(embedded)
    for network, why in _REFUSED:
        if address.version == network.version and address in network:
            return why
    return None


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64, 6to4)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or (address in _COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Public addresses, plus the networks and host names the operator allows.

    ``hosts``: names (lower case) whose addresses are all allowed; ``*.example.internal``
    allows every name under ``example.internal``.
    """

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> EgressPolicy:
        """A policy from allow-list entries: CIDRs or addresses (``10.0.0.0/8``,
        ``127.0.0.1``, ``fd00::/8``) and host names (``mcp.internal``, ``*.svc.local``).
        Raises ``EgressPolicyError``."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = entry.removeprefix("*.")
            labels = name.split(".")
            if not all(
                label and len(label) <= 63 and label.replace("-", "").isalnum() for label in labels
            ):
                raise EgressPolicyError(
                    f"{raw!r} is neither a network (CIDR or address) nor a host name"
                )
            hosts.add(entry)
        return cls(tuple(networks), frozenset(hosts))

    def allows_host(self, host: str) -> bool:
        """Whether the operator allowed ``host`` by name (then any address it has)."""
        name = host.rstrip(".").lower()
        return name in self.hosts or any(
            h.startswith("*.") and name.endswith(h[1:]) for h in self.hosts
        )

    def refusal(self, address: IPAddress) -> str | None:
        """Why a connection to ``address`` is refused, or None when it is allowed."""
        why = refused_range(address)
        if why is None:
            return None
        embedded = _embedded_ipv4(address)
        for candidate in (address, embedded):
            if candidate is not None and any(
                candidate.version == n.version and candidate in n for n in self.networks
            ):
                return None
        return why

    async def addresses(self, host: str, port: int) -> list[str]:
        """The addresses of ``host`` a connection may go to, in resolver order.

        Raises ``EgressRefused`` when there are none (all of them are refused), and
        ``OSError`` when the name does not resolve.
        """
        literal = _literal(host)
        if literal is not None:
            why = None if self.allows_host(host) else self.refusal(literal)
            if why is not None:
                log.info("egress: refused %s (%s)", literal, why)
                raise EgressRefused(
                    f"{host} is not a public address ({why}); this server does not connect there."
                )
            return [str(literal)]
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if self.allows_host(host):
            return found
        allowed: list[str] = []
        for address in found:
            why = self.refusal(ipaddress.ip_address(address.split("%", 1)[0]))
            if why is None:
                allowed.append(address)
            else:
                log.info("egress: refused %s, an address of %s (%s)", address, host, why)
        if not allowed:
            raise EgressRefused(
                f"{host} resolves only to addresses this server does not connect to "
                "(loopback, private, link-local or other non-public ranges)."
            )
        return allowed


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


_policy = EgressPolicy()


def configure(policy: EgressPolicy) -> None:
    """Make ``policy`` the process's egress policy (the app does, from its settings)."""
    global _policy
    _policy = policy


def current() -> EgressPolicy:
    """The process's egress policy (public addresses only until ``configure``)."""
    return _policy

"""Inbound trunks: who may call this server over SIP, and what they may call.

A trunk names the peers it stands for by their source addresses (``addresses``, CIDRs or
single addresses), by digest credentials (``username``/``password``, RFC 3261 §22), or
both; optionally the numbers they may call (the Request-URI's user part, or the To URI's);
and whether the address in their SDP may be sent media before their RTP arrives
(``trusted``: an SBC of a carrier that sends RTP from where it says). LiveKit's inbound
trunks and Asterisk's ``identify`` plus ``auth`` are the model.

A trunk may also require the client certificate its calls arrive with over TLS
(``client_certificate.py``): signed by its own CA (``tls_client_ca``), naming one of its
peers (``tls_client_names``), or pinned by SHA-256 (``tls_client_fingerprints``); all that
are given must hold, and such a trunk takes no call over UDP or TCP.

A trunk with neither addresses, credentials nor a client certificate would let anyone in, so
it is refused: an open trunk is written out as ``addresses = ["0.0.0.0/0", "::/0"]``.

Trunks come from the settings as a list of tables (``[[sip_trunks]]`` in the TOML file) or
as the same list in JSON (``HARK_SIP_TRUNKS``, ``--sip-trunks``).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hark.transports.sip.client_certificate import (
    CertificateError,
    ClientCertificate,
    load_authorities,
    normalize_fingerprint,
    normalize_name,
)

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_KEYS = frozenset(
    {
        "name",
        "addresses",
        "username",
        "password",
        "numbers",
        "trusted",
        "tls_client_ca",
        "tls_client_names",
        "tls_client_fingerprints",
    }
)


class TrunkError(ValueError):
    """A trunk's configuration is invalid; the message names the trunk and the problem
    (never the password)."""


@dataclass(frozen=True, slots=True)
class InboundTrunk:
    """One trunk: a name for the logs, the networks it calls from, its credentials and
    numbers (empty: any), and what its TLS client certificate must be: signed by the CA
    file ``client_ca`` (whose certificates' SHA-256 are ``client_authorities``), naming one
    of ``client_names``, one of ``client_fingerprints`` (SHA-256, lowercase hex). The
    password is left out of ``repr``."""

    name: str
    networks: tuple[IpNetwork, ...] = ()
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    numbers: frozenset[str] = frozenset()
    trusted: bool = False
    client_ca: str | None = None
    client_authorities: frozenset[bytes] = field(default=frozenset(), repr=False)
    client_names: frozenset[str] = frozenset()
    client_fingerprints: frozenset[str] = frozenset()

    @property
    def needs_digest(self) -> bool:
        """Whether its calls must answer a digest challenge."""
        return self.username is not None

    @property
    def needs_certificate(self) -> bool:
        """Whether its calls must come over TLS with a client certificate."""
        return bool(self.client_ca or self.client_names or self.client_fingerprints)

    def accepts(self, certificate: ClientCertificate | None) -> bool:
        """Whether a call whose TLS peer proved itself with ``certificate`` (None: not over
        TLS, or without one) may be this trunk's."""
        if not self.needs_certificate:
            return True
        if certificate is None:
            return False
        if self.client_authorities and not (self.client_authorities & certificate.chain):
            return False
        if self.client_names and not (self.client_names & certificate.names):
            return False
        return not self.client_fingerprints or certificate.fingerprint in self.client_fingerprints

    def covers(self, address: str) -> bool:
        """Whether a call from ``address`` may be this trunk's (no networks: from anywhere,
        the credentials decide)."""
        if not self.networks:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip.version == net.version and ip in net for net in self.networks)

    def may_call(self, *numbers: str | None) -> bool:
        """Whether any of the dialled ``numbers`` (Request-URI user, To user) is allowed."""
        if not self.numbers:
            return True
        return any(n is not None and n in self.numbers for n in numbers)


def parse_trunks(raw: object) -> tuple[InboundTrunk, ...]:
    """Trunks from the settings: a list of tables, or that list as a JSON string.

    Raises ``TrunkError`` when the value or a trunk is invalid, or two trunks share a name
    or a username.
    """
    if raw is None or raw == "" or raw == ():
        return ()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise TrunkError("sip_trunks must be a JSON list of trunks") from None
    if not isinstance(raw, (list, tuple)):
        raise TrunkError("sip_trunks must be a list of trunks")
    trunks = tuple(_parse_trunk(n, item) for n, item in enumerate(raw, 1))
    _unique((t.name for t in trunks), "name")
    _unique((t.username for t in trunks if t.username is not None), "username")
    return trunks


def _parse_trunk(number: int, item: object) -> InboundTrunk:
    if not isinstance(item, Mapping):
        raise TrunkError(f"sip trunk {number} must be a table (name, addresses, ...)")
    name = item.get("name", f"trunk-{number}")
    if not isinstance(name, str) or not name:
        raise TrunkError(f"sip trunk {number}: name must be a non-empty string")
    unknown = set(item) - _KEYS
    if unknown:
        raise TrunkError(
            f"sip trunk {name!r}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"known keys are {', '.join(sorted(_KEYS))}"
        )
    networks = tuple(_network(name, a) for a in _strings(name, item, "addresses"))
    username, password = item.get("username"), item.get("password")
    if (username is None) != (password is None):
        raise TrunkError(f"sip trunk {name!r}: username and password go together")
    for key, value in (("username", username), ("password", password)):
        if value is not None and (not isinstance(value, str) or not value):
            raise TrunkError(f"sip trunk {name!r}: {key} must be a non-empty string")
        if isinstance(value, str) and ('"' in value or "\\" in value or not value.isprintable()):
            raise TrunkError(f'sip trunk {name!r}: {key} must be printable, without " or \\')
    client_ca, authorities = item.get("tls_client_ca"), frozenset[bytes]()
    if client_ca is not None:
        if not isinstance(client_ca, str) or not client_ca:
            raise TrunkError(f"sip trunk {name!r}: tls_client_ca must be the path of a PEM file")
        try:
            authorities = load_authorities(client_ca)
        except CertificateError as exc:
            raise TrunkError(f"sip trunk {name!r}: tls_client_ca: {exc}") from None
    client_names = frozenset(normalize_name(n) for n in _strings(name, item, "tls_client_names"))
    try:
        fingerprints = frozenset(
            normalize_fingerprint(f) for f in _strings(name, item, "tls_client_fingerprints")
        )
    except CertificateError as exc:
        raise TrunkError(f"sip trunk {name!r}: tls_client_fingerprints: {exc}") from None
    certified = bool(client_ca or client_names or fingerprints)
    if not networks and username is None and not certified:
        raise TrunkError(
            f"sip trunk {name!r} needs addresses or a username and password (or a TLS client "
            "certificate: tls_client_ca, tls_client_names, tls_client_fingerprints): a trunk "
            'with none would take calls from anyone (write addresses = ["0.0.0.0/0", "::/0"] '
            "if that is meant)"
        )
    trusted = item.get("trusted", False)
    if not isinstance(trusted, bool):
        raise TrunkError(f"sip trunk {name!r}: trusted must be true or false")
    return InboundTrunk(
        name=name,
        networks=networks,
        username=username,
        password=password,
        numbers=frozenset(_strings(name, item, "numbers")),
        trusted=trusted,
        client_ca=client_ca,
        client_authorities=authorities,
        client_names=client_names,
        client_fingerprints=fingerprints,
    )


def _strings(name: str, item: Mapping[str, Any], key: str) -> list[str]:
    value = item.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TrunkError(f"sip trunk {name!r}: {key} must be a list of strings")
    return value


def _network(name: str, text: str) -> IpNetwork:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise TrunkError(
            f"sip trunk {name!r}: {text!r} is not an address or a network (CIDR)"
        ) from None


def _unique(values: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise TrunkError(f"two sip trunks have the {what} {value!r}")
        seen.add(value)

"""The certificate a TLS peer proved itself with, and what a trunk may ask of it.

A trunk may take its calls only over TLS from a peer whose certificate (``trunk.py``):

- was signed by the trunk's own CA (``tls_client_ca``, a PEM file of one or more
  certificates: the CA somewhere in the chain the handshake verified, as Kamailio's per-peer
  ``ca_list`` or Asterisk's ``ca_list_file`` decide it);
- names one of the trunk's peers (``tls_client_names``): a subjectAltName DNS name, SIP URI
  host or IP address, or, only where the certificate has no DNS name or SIP URI, its subject
  Common Name, as RFC 5922 §7.1 reads a SIP peer's identity (and FreeSWITCH's
  ``tls-verify-in-subjects``, Kamailio's ``$tls_peer_san_hostname``/``_subject_cn`` checks);
- is one of the trunk's pinned certificates (``tls_client_fingerprints``): the SHA-256 of
  the certificate, as ``openssl x509 -noout -fingerprint -sha256`` prints it.

The TLS handshake verifies the chain first (against every CA the port knows); what is kept
of a connection here is read once, when it opens, never per message or packet.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import ssl
from dataclasses import dataclass
from typing import Any

from hark.transports.sip.ssl_internals import verified_chain

_PEM_CERTIFICATE = re.compile(
    r"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL
)
_HEX = re.compile(r"[0-9a-f]{64}")


class CertificateError(ValueError):
    """A CA file or a fingerprint that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """What a TLS peer's verified certificate says: its SHA-256 fingerprint (lowercase hex),
    the names it stands for (lowercase) and the SHA-256 of each certificate of the chain the
    handshake verified, from the peer's own to the trusted CA."""

    fingerprint: str
    names: frozenset[str]
    chain: frozenset[bytes]

    @classmethod
    def of(cls, ssl_object: Any) -> ClientCertificate | None:
        """The certificate of a TLS connection's peer (an ``ssl.SSLObject``), or None when
        it sent none (the handshake refuses one that does not verify)."""
        if ssl_object is None:
            return None
        der = ssl_object.getpeercert(binary_form=True)
        if not der:
            return None
        return cls(
            fingerprint=hashlib.sha256(der).hexdigest(),
            names=_names(ssl_object.getpeercert() or {}),
            chain=frozenset(hashlib.sha256(c).digest() for c in verified_chain(ssl_object)),
        )


def _names(info: dict[str, Any]) -> frozenset[str]:
    """The identities of a certificate (``getpeercert()``'s form), RFC 5922 §7.1: its DNS
    names, SIP URIs' hosts and IP addresses; the subject CN only when there is no DNS name
    or SIP URI."""
    names: set[str] = set()
    domains = 0
    for kind, value in info.get("subjectAltName", ()):
        if kind == "DNS":
            names.add(value.lower())
            domains += 1
        elif kind == "URI" and value.lower().startswith(("sip:", "sips:")):
            host = value.partition(":")[2].rpartition("@")[2]
            host = host.split(";", 1)[0]
            if host.startswith("["):
                host = host[1 : host.find("]")] if "]" in host else host
            else:
                host = host.split(":", 1)[0]
            names.add(host.lower())
            domains += 1
        elif kind == "IP Address":
            names.add(normalize_name(value))
    if not domains:
        for rdn in info.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    names.add(value.lower())
    return frozenset(names)


def normalize_name(name: str) -> str:
    """A name as certificates and trunks are compared: lowercase, an IP address in its
    compressed form (OpenSSL writes IPv6 addresses in full)."""
    name = name.strip().lower()
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return name


def load_authorities(path: str) -> frozenset[bytes]:
    """The SHA-256 of each certificate of a PEM CA file; ``CertificateError`` when it cannot
    be read or holds no certificate OpenSSL takes."""
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            text = file.read()
    except OSError as exc:
        raise CertificateError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    blocks = _PEM_CERTIFICATE.findall(text)
    if not blocks:
        raise CertificateError(f"{path!r} holds no PEM certificate")
    try:
        # What the TLS port will load: refused here rather than when SIP starts.
        ssl.create_default_context().load_verify_locations(cadata="\n".join(blocks))
        return frozenset(hashlib.sha256(ssl.PEM_cert_to_DER_cert(b)).digest() for b in blocks)
    except (ssl.SSLError, ValueError) as exc:
        raise CertificateError(f"{path!r} holds a certificate that cannot be read: {exc}") from None


def normalize_fingerprint(text: str) -> str:
    """A SHA-256 fingerprint as lowercase hex: ``AB:CD:…`` (OpenSSL's form, with or without
    a ``sha256:`` or ``SHA256 Fingerprint=`` prefix) or plain hex; ``CertificateError`` when
    it is not 32 bytes of hex."""
    value = text.strip().lower()
    for prefix in ("sha256 fingerprint=", "sha-256 fingerprint=", "sha256:", "sha-256:"):
        value = value.removeprefix(prefix)
    value = value.replace(":", "").replace(" ", "")
    if not _HEX.fullmatch(value):
        raise CertificateError(
            f"{text!r} is not a SHA-256 fingerprint (64 hex digits, colons allowed)"
        )
    return value

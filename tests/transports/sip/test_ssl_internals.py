"""Pins the private part of Python's ``ssl`` that hark reaches
(``hark.transports.sip.ssl_internals``) against the running Python, on real TLS handshakes
run in memory: a release that removes or reshapes it fails here, naming it."""

from __future__ import annotations

import _ssl
import hashlib
import ssl
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from hark.transports.sip.client_certificate import ClientCertificate
from hark.transports.sip.ssl_internals import verified_chain
from tests.transports.sip.test_trunk_certificates import Authority

PYTHON = f"Python {sys.version.split()[0]}"
# What to change when a check below fails.
FIX = "hark.transports.sip.ssl_internals needs another way to read the verified chain"


def handshake(server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> ssl.SSLObject:
    """Run a TLS handshake between two in-memory ends; the server's end, the object asyncio
    hands the SIP transport as a connection's ``ssl_object``."""
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    client = client_context.wrap_bio(client_in, client_out)
    finished: set[ssl.SSLObject] = set()
    # TLS 1.3 with a client certificate takes three flights; more means it is stuck.
    for _ in range(8):
        for end in (client, server):
            if end not in finished:
                try:
                    end.do_handshake()
                    finished.add(end)
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if len(finished) == 2:
            return server
    raise AssertionError("the in-memory TLS handshake did not finish")


def contexts(
    root: Authority, server_pem: Path, client_pem: Path | None
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server that trusts ``root`` and asks for a client certificate (as a SIP TLS port
    does), and a client that sends ``client_pem``'s, if any."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_pem)
    server.load_verify_locations(root.path)
    server.verify_mode = ssl.CERT_OPTIONAL
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    if client_pem is not None:
        client.load_cert_chain(client_pem)
    return server, client


def der(authority: Authority) -> bytes:
    return authority.cert.public_bytes(serialization.Encoding.DER)


def test_the_chain_a_peer_proved(tmp_path: Path) -> None:
    root = Authority.make(tmp_path, "root")
    intermediate = Authority.make(tmp_path, "intermediate", root)
    server = handshake(
        *contexts(
            root,
            root.issue(tmp_path, dns=("hark.example",), cn="hark"),
            intermediate.issue(tmp_path, dns=("sbc.example",), cn="sbc"),
        )
    )
    leaf = server.getpeercert(binary_form=True)
    assert leaf is not None

    if sys.version_info >= (3, 13):
        # The public method the module calls from 3.13 on.
        assert server.get_verified_chain() == [leaf, der(intermediate), der(root)], PYTHON
    else:
        sslobj = getattr(server, "_sslobj", None)
        assert sslobj is not None, f"{PYTHON}: ssl.SSLObject has no _sslobj; {FIX}"
        assert callable(getattr(sslobj, "get_verified_chain", None)), (
            f"{PYTHON}: ssl.SSLObject._sslobj has no get_verified_chain(); {FIX}"
        )
        chain = sslobj.get_verified_chain()
        assert isinstance(chain, list) and all(isinstance(c, _ssl.Certificate) for c in chain), (
            f"{PYTHON}: _sslobj.get_verified_chain() gave {chain!r}, not _ssl.Certificate "
            f"objects; {FIX}"
        )
        assert getattr(_ssl, "ENCODING_DER", None) == 2, (
            f"{PYTHON}: _ssl.ENCODING_DER is not OpenSSL's DER format (2); {FIX}"
        )
        assert [c.public_bytes(_ssl.ENCODING_DER) for c in chain] == [
            leaf,
            der(intermediate),
            der(root),
        ], f"{PYTHON}: _ssl.Certificate.public_bytes(ENCODING_DER) is not the DER; {FIX}"

    assert verified_chain(server) == [leaf, der(intermediate), der(root)]
    certificate = ClientCertificate.of(server)
    assert certificate is not None
    assert certificate.chain == {
        hashlib.sha256(c).digest() for c in (leaf, der(intermediate), der(root))
    }


def test_a_peer_without_a_certificate(tmp_path: Path) -> None:
    root = Authority.make(tmp_path, "root")
    server = handshake(*contexts(root, root.issue(tmp_path, cn="hark"), None))
    assert server.getpeercert(binary_form=True) is None
    assert verified_chain(server) == []
    assert ClientCertificate.of(server) is None

"""The private part of Python's ``ssl`` that hark's SIP TLS transport relies on, in one place.

A trunk may take a peer by the CA its certificate chain ends at (``client_certificate.py``),
so the transport reads the chain OpenSSL verified. ``ssl.SSLObject.get_verified_chain`` is
public only from Python 3.13; before it, the same OpenSSL call (``SSL_get0_verified_chain``)
is reached through the object's ``_sslobj`` and gives ``_ssl.Certificate`` objects, which
``_ssl.ENCODING_DER`` turns into bytes. ``client_certificate.py`` does it through
:func:`verified_chain` and nothing else; ``tests/transports/sip/test_ssl_internals.py``
checks those names against the running Python, on a real handshake, so that a release that
renames one fails there, naming it, rather than on a trunk's calls. Once hark requires
Python 3.13 this module goes and the public method is called in its place.
"""

from __future__ import annotations

import _ssl
import ssl
import sys


def verified_chain(ssl_object: ssl.SSLObject) -> list[bytes]:
    """The DER certificates of the chain the handshake verified, the peer's first and the
    trusted CA last; empty when the peer sent no certificate."""
    if sys.version_info >= (3, 13):
        return ssl_object.get_verified_chain()
    chain: list[_ssl.Certificate] | None = ssl_object._sslobj.get_verified_chain()  # type: ignore[attr-defined]
    return [c.public_bytes(_ssl.ENCODING_DER) for c in chain or ()]

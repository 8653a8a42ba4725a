"""TLS on the worker-to-worker hop, for a fleet configured with a hop CA.

A request that belongs to another worker is passed to it with the client's own bearer key
(``hark.cluster.forwarding``). Without this, the hop is plain HTTP unless the operator puts
a TLS-terminating sidecar or mesh in front of each worker. With it, each worker has a
certificate and key signed by the fleet's own CA (``--hop-tls-cert``, ``--hop-tls-key``,
``--hop-tls-ca``, the same CA on every worker):

- the worker opens a TLS listener for hops (``--hop-port``) that takes only peers with a
  certificate the CA signed (mutual TLS), and advertises it in the signed registry as
  ``https://<host>:<port>``;
- it forwards only over TLS, to ``https`` URLs, verifying the other worker's certificate
  against the CA and presenting its own; a registration with a plain ``http`` URL is not
  forwarded to (``ForwardError``), so no key ever leaves in clear because one worker was
  configured differently.

The CA is the workers' identity: only a certificate it signed can receive a hop. Its
names are not checked against the URL's host (a pod's address changes with every restart
and is rarely in a certificate), so the CA must sign hark workers' certificates alone: a
private CA for the fleet, not a public one.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from yarl import URL


class HopTlsError(Exception):
    """The hop's certificate, key or CA could not be loaded; the message says which."""


@dataclass(frozen=True, slots=True)
class HopTls:
    """The two sides of the hop: ``server`` for this worker's hop listener, ``client`` for
    its forwarder."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    @classmethod
    def load(cls, cert: str, key: str, ca: str) -> HopTls:
        """Contexts from PEM files: this worker's certificate chain and key, and the fleet's
        CA bundle. Raises ``HopTlsError``."""
        try:
            server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
            server.load_cert_chain(cert, key)
            server.verify_mode = ssl.CERT_REQUIRED
            client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
            client.load_cert_chain(cert, key)
            # The chain is verified against the fleet's CA; the names are not (see above).
            client.check_hostname = False
            client.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise HopTlsError(f"cannot load the hop TLS certificate, key or CA: {exc}") from None
        for context in (server, client):
            context.minimum_version = ssl.TLSVersion.TLSv1_2
        return cls(server, client)


def hop_url(advertised: str, port: int) -> str:
    """The ``https`` URL of a hop listener on ``port`` of the host ``advertised`` names."""
    return str(URL(advertised).with_scheme("https").with_port(port).with_path(""))

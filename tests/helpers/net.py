"""Network helpers: a free port, an Authorization header."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now.

    The port is only probed, not held: another process may take it before the caller binds.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bearer(key: str) -> dict[str, str]:
    """The Authorization header that presents ``key`` as a bearer token."""
    return {"Authorization": f"Bearer {key}"}

"""SIP over UDP, TCP and TLS (RFC 3261 §18) on asyncio: sockets in, framed bytes out.

UDP and TCP listen on one port (``port=0`` picks a free one, the same for both); TLS on its
own ``tls_port`` when an ``ssl_context`` is given. What arrives is handed on as the bytes of
one message and the ``Flow`` it came by (a UDP datagram, or a message cut out of a
connection's stream by its Content-Length); the user agent parses it.

A response goes back the way its request came: on the same connection for TCP/TLS, and for
UDP to the top Via's ``received`` address and ``rport`` port (RFC 3581), which
``stamp_received`` writes into the request from the datagram's source. That is what gets
replies through NATs and proxies that rewrite nothing.

Bounds: ``max_connections`` open connections, ``MAX_CONNECTIONS_PER_SOURCE`` of them from
one address (more are closed at once), 64 KiB per message being framed,
``MAX_WRITE_BUFFER`` bytes waiting to be written to a peer that does not read (beyond it
the connection is closed), and ``MAX_PENDING`` messages waiting for an outgoing connection
to open. A connection must complete its first message within ``FIRST_MESSAGE_TIMEOUT``;
after that, one on which nothing has arrived (messages or CRLF keep-alives) for
``IDLE_TIMEOUT`` is closed unless the user agent still uses it (``in_use``: a call or a
transaction on it), so that one message cannot hold a slot for ever (Kamailio's
``tcp_connection_lifetime``).

A TLS connection's client certificate, when its peer sent one (the handshake verified it),
is read once as it opens (``peer_certificate``): the inbound trunks may ask for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from hark.transports.sip.client_certificate import ClientCertificate
from hark.transports.sip.message import Request, SipParseError, StreamFramer, Via

logger = logging.getLogger(__name__)

MAX_CONNECTIONS = 1024
# One address cannot take every slot.
MAX_CONNECTIONS_PER_SOURCE = 256
MAX_WRITE_BUFFER = 256 * 1024
MAX_PENDING = 32
# A connection that has not completed one message by then is closed: it holds a slot of
# max_connections and a buffer. Once it has, it stays (a call may be silent for hours).
FIRST_MESSAGE_TIMEOUT = 32.0
IDLE_TIMEOUT = 120.0
DEFAULT_PORT = 5060
# Room for bursts of many calls' signalling: the kernel's default is a few hundred packets.
SOCKET_BUFFER_BYTES = 1024 * 1024
_BIND_ATTEMPTS = 20

TransportName = Literal["udp", "tcp", "tls"]
Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Flow:
    """How a message came, or is to go: the transport and the peer's address."""

    protocol: TransportName
    remote: Address

    @property
    def reliable(self) -> bool:
        """TCP and TLS: nothing is retransmitted on them."""
        return self.protocol != "udp"

    @property
    def via_transport(self) -> str:
        """The transport's name in a Via (``UDP``, ``TCP``, ``TLS``)."""
        return self.protocol.upper()


MessageHandler = Callable[[bytes, Flow], None]


def stamp_received(request: Request, flow: Flow) -> Via:
    """Write ``received`` (and ``rport``'s value) into the top Via from where it came from.

    ``received`` is added when the sent-by host is not the source address (§18.2.1), and
    always when the peer asked for ``rport`` (RFC 3581 §4). Returns the stamped Via.
    """
    via = request.vias[0]
    host, port = flow.remote
    if "rport" in via.params:
        via.params["rport"] = str(port)
        via.params["received"] = host
    elif via.host != host:
        via.params["received"] = host
    request.replace_top_via(via)
    return via


def response_flow(via: Via, flow: Flow) -> Flow:
    """Where the responses to a request with this (stamped) top Via go (§18.2.2, RFC 3581)."""
    if flow.reliable:
        return flow
    host = via.params.get("received") or via.host
    rport = via.params.get("rport")
    port = int(rport) if rport else via.port or DEFAULT_PORT
    return Flow("udp", (host, port))


def peer_ip(flow: Flow | None) -> str:
    """The peer's address for a log line (never more than the address)."""
    return flow.remote[0] if flow is not None else "?"


def is_wildcard(host: str) -> bool:
    """``0.0.0.0``, ``::`` or empty: a socket bound to every address."""
    return host in ("", "0.0.0.0", "::")


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransport) -> None:
        self._owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self._owner.deliver(data, Flow("udp", (addr[0], addr[1])))

    def error_received(self, exc: Exception) -> None:
        # ICMP unreachable for a peer that went away: its transactions will time out.
        logger.debug("sip: udp error %s", exc)


class _Stream(asyncio.Protocol):
    """One TCP or TLS connection, either accepted or opened to send a request."""

    def __init__(self, owner: SipTransport, protocol: TransportName) -> None:
        self._owner = owner
        self._protocol: TransportName = protocol
        self._framer = StreamFramer()
        self._transport: asyncio.Transport | None = None
        self._first_message_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._heard = False
        self.flow: Flow | None = None
        self.certificate: ClientCertificate | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's stream transports have asyncio.Transport's methods without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if not peer:
            transport.close()
            return
        self.flow = Flow(self._protocol, (peer[0], peer[1]))
        if self._protocol == "tls":
            try:
                self.certificate = ClientCertificate.of(transport.get_extra_info("ssl_object"))
            except (ssl.SSLError, ValueError, AttributeError) as exc:
                # Taken as no certificate: a trunk that asks for one refuses the peer.
                logger.warning("sip: cannot read the certificate of %s: %s", peer[0], exc)
        if not self._owner.register(self):
            logger.warning("sip: too many connections, closing one from %s", peer[0])
            transport.close()
            return
        self._first_message_timer = asyncio.get_running_loop().call_later(
            FIRST_MESSAGE_TIMEOUT, self._idle
        )

    def _idle(self) -> None:
        logger.info("sip: no message on a connection from %s, closing it", peer_ip(self.flow))
        self.close()

    def _arm_idle(self) -> None:
        self._idle_timer = asyncio.get_running_loop().call_later(
            self._owner.idle_timeout, self._idle_check
        )

    def _idle_check(self) -> None:
        """Close the connection if nothing came since the last check and nothing uses it."""
        heard, self._heard = self._heard, False
        if heard or (self.flow is not None and self._owner.in_use(self.flow)):
            self._arm_idle()
            return
        logger.info("sip: closing an idle connection from %s", peer_ip(self.flow))
        self._idle_timer = None
        self.close()

    def data_received(self, data: bytes) -> None:
        if self.flow is None or self._transport is None:
            return
        pings = self._framer.pings
        try:
            messages = self._framer.feed(data)
        except SipParseError as exc:
            logger.info("sip: closing a connection from %s: %s", self.flow.remote[0], exc)
            self._transport.close()
            return
        if self._framer.pings != pings:
            self.write(b"\r\n")
        if messages or self._framer.pings != pings:
            self._heard = True
        if messages and self._first_message_timer is not None:
            self._first_message_timer.cancel()
            self._first_message_timer = None
            self._arm_idle()
        for message in messages:
            self._owner.deliver(message, self.flow)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._first_message_timer is not None:
            self._first_message_timer.cancel()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._owner.unregister(self)

    def write(self, data: bytes) -> None:
        """Write, or close a connection whose peer has stopped reading."""
        if self._transport is None or self._transport.is_closing():
            return
        if self._transport.get_write_buffer_size() + len(data) > MAX_WRITE_BUFFER:
            logger.warning("sip: peer %s is not reading, closing its connection", self.flow)
            self._transport.abort()
            return
        self._transport.write(data)

    def close(self) -> None:
        """Close the connection."""
        if self._transport is not None:
            self._transport.close()


class SipTransport:
    """The sockets of a SIP user agent: UDP and TCP on ``port``, TLS on ``tls_port``.

    ``in_use`` says whether a flow still carries a call or a transaction (an idle connection
    is kept while it does); ``idle_timeout`` is how long a connection may go without a
    message before that is asked.
    """

    def __init__(
        self,
        on_message: MessageHandler,
        *,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        tls_port: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        in_use: Callable[[Flow], bool] | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        if tls_port is not None and ssl_context is None:
            raise ValueError("a TLS port needs an ssl_context")
        self._on_message = on_message
        self.host = host
        self.port = port
        self.tls_port = tls_port
        self._ssl_context = ssl_context
        self._max_connections = max_connections
        self.in_use: Callable[[Flow], bool] = in_use if in_use is not None else lambda _: False
        self.idle_timeout = idle_timeout
        self._per_source: dict[str, int] = {}
        self._udp: asyncio.DatagramTransport | None = None
        self._servers: list[asyncio.Server] = []
        self._connections: dict[Flow, _Stream] = {}
        self._pending: dict[Flow, list[bytes]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._local_ips: dict[str, str] = {}

    async def start(self) -> None:
        """Bind the sockets; afterwards ``port`` (and ``tls_port``) are the bound ones."""
        loop = asyncio.get_running_loop()
        for attempt in range(_BIND_ATTEMPTS):
            udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(self.host, self.port)
            )
            sock = udp.get_extra_info("socket")
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
            bound = sock.getsockname()[1]
            try:
                tcp = await loop.create_server(
                    lambda: _Stream(self, "tcp"), self.host, bound, reuse_address=True
                )
            except OSError as exc:
                udp.close()
                # An ephemeral UDP port may be taken on TCP: try another one.
                if self.port != 0 or exc.errno != errno.EADDRINUSE or attempt == _BIND_ATTEMPTS - 1:
                    raise
                continue
            self._udp = udp
            self._servers.append(tcp)
            self.port = bound
            break
        if self.tls_port is not None:
            tls = await loop.create_server(
                lambda: _Stream(self, "tls"),
                self.host,
                self.tls_port,
                ssl=self._ssl_context,
                reuse_address=True,
            )
            self._servers.append(tls)
            self.tls_port = tls.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close every socket and connection."""
        for task in list(self._tasks):
            task.cancel()
        for server in self._servers:
            server.close()
        for connection in list(self._connections.values()):
            connection.close()
        if self._udp is not None:
            self._udp.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        self._connections.clear()
        self._per_source.clear()
        self._pending.clear()

    def deliver(self, data: bytes, flow: Flow) -> None:
        """Hand a received message on; nothing its handler raises reaches the socket."""
        try:
            self._on_message(data, flow)
        except Exception:
            logger.exception("sip: handling a message from %s failed", flow.remote[0])

    def register(self, connection: _Stream) -> bool:
        """Take in an open connection; False when at the limit (it is then closed)."""
        assert connection.flow is not None
        source = connection.flow.remote[0]
        if len(self._connections) >= self._max_connections:
            return False
        if self._per_source.get(source, 0) >= MAX_CONNECTIONS_PER_SOURCE:
            return False
        self._connections[connection.flow] = connection
        self._per_source[source] = self._per_source.get(source, 0) + 1
        for data in self._pending.pop(connection.flow, []):
            connection.write(data)
        return True

    def unregister(self, connection: _Stream) -> None:
        """Forget a closed connection."""
        if connection.flow is not None and self._connections.get(connection.flow) is connection:
            del self._connections[connection.flow]
            source = connection.flow.remote[0]
            left = self._per_source.get(source, 1) - 1
            if left > 0:
                self._per_source[source] = left
            else:
                self._per_source.pop(source, None)

    def connected(self, flow: Flow) -> bool:
        """Whether a connection of ``flow`` is open."""
        return flow in self._connections

    def peer_certificate(self, flow: Flow) -> ClientCertificate | None:
        """The verified client certificate of a TLS flow's open connection; None for any
        other flow, or a peer that sent none."""
        connection = self._connections.get(flow) if flow.protocol == "tls" else None
        return connection.certificate if connection is not None else None

    def send(self, flow: Flow, data: bytes) -> None:
        """Send a message: a datagram, or on the flow's connection (TCP opened if need be)."""
        if flow.protocol == "udp":
            if self._udp is not None:
                self._udp.sendto(data, flow.remote)
            return
        connection = self._connections.get(flow)
        if connection is not None:
            connection.write(data)
            return
        if flow.protocol == "tls":
            # Without the peer's certificate expectations we do not dial TLS ourselves; a
            # TLS peer keeps its connection open (RFC 5626) and is answered on it.
            logger.info("sip: no TLS connection to %s, message dropped", flow.remote[0])
            return
        pending = self._pending.get(flow)
        if pending is not None:
            if len(pending) < MAX_PENDING:
                pending.append(data)
            return
        self._pending[flow] = [data]
        task = asyncio.get_running_loop().create_task(self._connect(flow))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, flow: Flow) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: _Stream(self, "tcp"), *flow.remote)
        except OSError as exc:
            logger.info("sip: cannot connect to %s:%d: %s", *flow.remote, exc)
        finally:
            # Delivered by register() on success; dropped otherwise.
            self._pending.pop(flow, None)

    def local_ip_for(self, remote_ip: str) -> str:
        """The address of ours a peer at ``remote_ip`` reaches us on (for Via and Contact)."""
        if not is_wildcard(self.host):
            return self.host
        cached = self._local_ips.get(remote_ip)
        if cached is not None:
            return cached
        family = socket.AF_INET6 if ipaddress.ip_address(remote_ip).version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            # Connecting a UDP socket sends nothing: it only asks the kernel for the route.
            try:
                probe.connect((remote_ip, 9))
                local = str(probe.getsockname()[0])
            except OSError:
                local = "127.0.0.1"
        if len(self._local_ips) > 4096:
            self._local_ips.clear()
        self._local_ips[remote_ip] = local
        return local

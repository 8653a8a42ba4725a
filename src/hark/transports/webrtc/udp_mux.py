"""One UDP socket for all the WebRTC calls of a worker, demultiplexed per call.

Every call advertises the same single host candidate (the worker's one port), so a worker
needs one firewall rule and one socket however many calls it carries. Datagrams are routed
to the ICE connection they belong to:

1. A STUN Binding request carries ``USERNAME = "<server ufrag>:<client ufrag>"``. The server
   ufrag names the connection; the sender's address is bound to it from then on (this also
   follows a client whose NAT mapping changed, since its checks come from the new address).
2. Anything else (DTLS, SRTP, SRTCP, STUN responses) goes by the sender's ``(ip, port)``.
   An address is bound by rule 1, or when a connection first sends to it (the server's own
   checks towards the client's candidates), unless another connection holds it already.
3. Datagrams from unknown addresses are dropped.

The server ufrag is ``<hint><random>``: ``UFRAG_HINT_LENGTH`` (4) ice-chars of routing hint,
then ``UFRAG_RANDOM_LENGTH`` (12) random letters and digits (71 bits). A single worker uses
``DEFAULT_ROUTE_HINT``. A worker of a fleet behind ``hark relay`` is given a ``RouteSigner``
instead: its ufrags are signed tokens naming the worker (``hark.edge.route_hint``), which the
relay verifies before it forwards a client's first Binding request here.

Behind a relay (``relay`` given), the candidates carry the relay's public address, and the
relay's datagrams come wrapped in a header naming the client (``hark.edge.framing``): they
are routed as if they came from the client itself, and what is sent to that client goes
back through the relay it came by. Such a header speaks for any client, so it is taken only
from the addresses of relays that said a signed hello lately (``hark.edge.relay_hello``,
checked with ``hellos``): one dict look-up per framed datagram; framed datagrams from
anywhere else are dropped (``dropped_unrelayed``). Nothing is sent straight to a client
that was never heard through a relay: the worker is not meant to be reachable, and its own
checks towards the offer's candidates would otherwise leak its address (or find a path
around the relay).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import socket
import string
from typing import Any

from hark.edge import framing
from hark.edge.relay_hello import HELLO_TTL_S, HelloChecker
from hark.edge.route_hint import RouteSigner
from hark.edge.stun import stun_request_username

logger = logging.getLogger(__name__)

UFRAG_HINT_LENGTH = 4
UFRAG_RANDOM_LENGTH = 12
DEFAULT_ROUTE_HINT = "hark"
# Room for bursts of many calls: the kernel's default (~200 KiB) is a few hundred packets.
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024

_ICE_CHARS = re.compile(r"^[A-Za-z0-9+/]+$")
_RANDOM_ALPHABET = string.ascii_letters + string.digits

Address = tuple[str, int]


def make_ufrag(hint: str = DEFAULT_ROUTE_HINT) -> str:
    """A fresh server ufrag: the routing ``hint`` followed by random characters."""
    check_route_hint(hint)
    return hint + "".join(secrets.choice(_RANDOM_ALPHABET) for _ in range(UFRAG_RANDOM_LENGTH))


def route_hint(ufrag: str) -> str:
    """The routing hint a server ufrag starts with."""
    return ufrag[:UFRAG_HINT_LENGTH]


def check_route_hint(hint: str) -> None:
    """Raise ``ValueError`` unless ``hint`` is exactly ``UFRAG_HINT_LENGTH`` ice-chars."""
    if len(hint) != UFRAG_HINT_LENGTH or not _ICE_CHARS.match(hint):
        raise ValueError(
            f"a routing hint is {UFRAG_HINT_LENGTH} characters of A-Z, a-z, 0-9, + or /; "
            f"got {hint!r}"
        )


class MuxEndpoint(asyncio.DatagramTransport):
    """One ICE connection's view of the shared socket: an asyncio datagram transport.

    It sends through the shared socket and receives what the mux routes to its ufrag and
    its clients' addresses. Closing it unregisters it and tells its protocol the
    connection is lost, as closing a real socket would.
    """

    def __init__(self, mux: UdpMux, ufrag: str, protocol: asyncio.DatagramProtocol) -> None:
        super().__init__()
        self.ufrag = ufrag
        self.protocol = protocol
        self.addresses: set[Address] = set()
        self._mux = mux
        self._closing = False

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        """Send one datagram to ``addr`` from the shared port."""
        if self._closing or addr is None:
            return
        self._mux.send(self, bytes(data), (addr[0], addr[1]))

    def close(self) -> None:
        """Stop receiving; the protocol's ``connection_lost`` follows on the next loop turn."""
        if self._closing:
            return
        self._closing = True
        self._mux.unregister(self)
        asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        """The same as ``close``: nothing is buffered here."""
        self.close()

    def is_closing(self) -> bool:
        """Whether ``close`` was called."""
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``sockname`` is the address the candidates carry (the relay's, behind one): ICE
        reads it for the host candidate only."""
        if name == "sockname":
            return self._mux.candidate
        return default

    def get_protocol(self) -> asyncio.BaseProtocol:
        """The protocol datagrams are delivered to."""
        return self.protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """Deliver datagrams to another protocol."""
        assert isinstance(protocol, asyncio.DatagramProtocol)
        self.protocol = protocol

    def get_write_buffer_size(self) -> int:
        """Datagrams are never buffered here."""
        return 0

    def deliver(self, data: bytes, addr: Address) -> None:
        """Hand a routed datagram to the protocol; its failure is its call's alone."""
        try:
            self.protocol.datagram_received(data, addr)
        except Exception:
            logger.exception("a datagram for ufrag %s failed", self.ufrag)


class _SharedSocket(asyncio.DatagramProtocol):
    def __init__(self, mux: UdpMux) -> None:
        self._mux = mux

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self._mux.receive(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (a client gone away) concern one peer, never the shared socket.
        logger.debug("shared UDP socket: %s", exc)


class UdpMux:
    """The worker's shared UDP socket and its routing table.

    ``host``/``port`` is where to bind (port 0: any free port); ``advertise_ip`` is the
    address clients or relays reach this port at (default: ``host``, or for a wildcard bind
    the first address of this machine); ``route_hint`` starts every ufrag this mux hands
    out, unless ``signer`` is set (then ufrags are signed hints for a relay). ``relay`` is
    the relay's public address, put in the candidates instead of this port's; ``hellos``
    checks the relays' hellos (without it no framed datagram is taken).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        advertise_ip: str | None = None,
        route_hint: str = DEFAULT_ROUTE_HINT,
        relay: Address | None = None,
        signer: RouteSigner | None = None,
        hellos: HelloChecker | None = None,
    ) -> None:
        check_route_hint(route_hint)
        self.host = host
        self.port = port
        self.route_hint = route_hint
        self.relay = relay
        self.signer = signer
        self.hellos = hellos
        self._advertise_ip = advertise_ip
        self._transport: asyncio.DatagramTransport | None = None
        self._by_ufrag: dict[str, MuxEndpoint] = {}
        self._by_address: dict[Address, MuxEndpoint] = {}
        # Client address → the relay socket its datagrams last came through.
        self._relayed: dict[Address, Address] = {}
        # The relays' sending addresses, and until when (monotonic) each is trusted.
        self._relays: dict[Address, float] = {}
        self._relay_pruning: asyncio.TimerHandle | None = None
        self.dropped = 0
        # Framed datagrams from addresses that are no relay's (counted in ``dropped`` too).
        self.dropped_unrelayed = 0

    async def start(self) -> None:
        """Bind the socket; raises ``OSError`` if the port cannot be bound."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        host = "127.0.0.1" if self.host == "localhost" else self.host
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _SharedSocket(self), local_addr=(host, self.port), family=family
        )
        sock = transport.get_extra_info("socket")
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
            except OSError:
                logger.debug("could not enlarge the UDP socket buffers", exc_info=True)
        self._transport = transport
        self.port = transport.get_extra_info("sockname")[1]
        if self._advertise_ip is None:
            self._advertise_ip = _default_advertise_ip(host)
        logger.info(
            "WebRTC media on UDP %s port %d (advertised as %s)",
            host,
            self.port,
            self._advertise_ip,
        )

    @property
    def advertised(self) -> Address:
        """The ``(ip, port)`` this port is reached at (the registry's media address)."""
        assert self._advertise_ip is not None, "the mux is not started"
        return (self._advertise_ip, self.port)

    @property
    def candidate(self) -> Address:
        """The ``(ip, port)`` every call's host candidate carries: the relay's, if any."""
        return self.relay if self.relay is not None else self.advertised

    @property
    def started(self) -> bool:
        """Whether the socket is bound."""
        return self._transport is not None

    def new_ufrag(self) -> str:
        """A fresh server ufrag carrying this mux's routing hint."""
        while True:
            ufrag = self.signer.ufrag() if self.signer else make_ufrag(self.route_hint)
            if ufrag not in self._by_ufrag:
                return ufrag

    def open(self, ufrag: str, protocol: asyncio.DatagramProtocol) -> MuxEndpoint:
        """Register the ICE connection whose server ufrag is ``ufrag``."""
        if self._transport is None:
            raise RuntimeError("the UDP mux is not started")
        if ufrag in self._by_ufrag:
            raise ValueError("this ufrag is already in use")
        endpoint = MuxEndpoint(self, ufrag, protocol)
        self._by_ufrag[ufrag] = endpoint
        return endpoint

    def unregister(self, endpoint: MuxEndpoint) -> None:
        """Forget an endpoint, its ufrag and its addresses."""
        if self._by_ufrag.get(endpoint.ufrag) is endpoint:
            del self._by_ufrag[endpoint.ufrag]
        for address in endpoint.addresses:
            if self._by_address.get(address) is endpoint:
                del self._by_address[address]
                self._relayed.pop(address, None)
        endpoint.addresses.clear()

    @property
    def connections(self) -> int:
        """How many ICE connections are registered."""
        return len(self._by_ufrag)

    @property
    def addresses(self) -> int:
        """How many client addresses are routed."""
        return len(self._by_address)

    def send(self, endpoint: MuxEndpoint, data: bytes, addr: Address) -> None:
        """Send for ``endpoint``; the first send to an unclaimed address claims it."""
        if self._transport is None:
            return
        via = self._relayed.get(addr)
        if via is not None:
            self._transport.sendto(framing.encode_header(addr) + data, via)
            return
        if self.relay is not None:
            return
        if addr not in self._by_address:
            self._bind(addr, endpoint)
        self._transport.sendto(data, addr)

    def receive(self, data: bytes, addr: Address) -> None:
        """Route one datagram that arrived on the socket, unwrapping a relay's."""
        if data and data[0] == framing.MAGIC and self.relay is not None:
            decoded = framing.decode(data) if addr in self._relays else None
            if decoded is None:
                self._not_relayed(data, addr)
                return
            client, inner = decoded
            if self._relayed.get(client) == addr:
                self.route(inner, client)
                return
            # A client new to this relay: recorded before the datagram is delivered, since
            # the endpoint may answer within the delivery (ICE answers a Binding request at
            # once), and that answer goes back through the relay; forgotten again if the
            # datagram is nobody's.
            previous = self._relayed.get(client)
            self._relayed[client] = addr
            if self.route(inner, client) is None:
                if previous is None:
                    del self._relayed[client]
                else:
                    self._relayed[client] = previous
            else:
                # Moving the address to another call forgets its relay: it is this one.
                self._relayed[client] = addr
            return
        self.route(data, addr)

    def _not_relayed(self, data: bytes, addr: Address) -> None:
        """A framed datagram that names no client, or from an address no relay said hello
        from lately: a relay's hello, or dropped."""
        if self.hellos is not None and self.hellos.check(data):
            if addr not in self._relays:
                logger.info("a relay sends from %s:%d", *addr)
            self._trust_relay(addr)
            return
        self.dropped += 1
        if addr not in self._relays:
            self.dropped_unrelayed += 1

    def _trust_relay(self, addr: Address) -> None:
        loop = asyncio.get_running_loop()
        self._relays[addr] = loop.time() + HELLO_TTL_S
        if self._relay_pruning is None:
            self._relay_pruning = loop.call_later(HELLO_TTL_S, self._prune_relays)

    def _prune_relays(self) -> None:
        """Stop trusting relays that have not said hello for ``HELLO_TTL_S``."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for addr in [a for a, until in self._relays.items() if until <= now]:
            del self._relays[addr]
            logger.info("the relay at %s:%d went quiet", *addr)
        self._relay_pruning = (
            loop.call_later(HELLO_TTL_S, self._prune_relays) if self._relays else None
        )

    @property
    def relays(self) -> list[Address]:
        """The addresses framed datagrams are taken from now."""
        return list(self._relays)

    def route(self, data: bytes, addr: Address) -> MuxEndpoint | None:
        """Deliver one datagram from ``addr`` to the endpoint it belongs to (returned), or
        drop it (None)."""
        # RFC 7983: a first byte below 4 is STUN; only requests name their connection.
        if data and data[0] < 4:
            username = stun_request_username(data)
            if username is not None:
                endpoint = self._by_ufrag.get(username.partition(":")[0])
                if endpoint is not None:
                    if self._by_address.get(addr) is not endpoint:
                        self._bind(addr, endpoint)
                    endpoint.deliver(data, addr)
                    return endpoint
        endpoint = self._by_address.get(addr)
        if endpoint is None:
            self.dropped += 1
            return None
        endpoint.deliver(data, addr)
        return endpoint

    def _bind(self, addr: Address, endpoint: MuxEndpoint) -> None:
        previous = self._by_address.get(addr)
        if previous is not None:
            previous.addresses.discard(addr)
            self._relayed.pop(addr, None)
        self._by_address[addr] = endpoint
        endpoint.addresses.add(addr)

    async def close(self) -> None:
        """Close the socket; endpoints still open receive nothing more."""
        transport, self._transport = self._transport, None
        if self._relay_pruning is not None:
            self._relay_pruning.cancel()
            self._relay_pruning = None
        if transport is not None:
            transport.close()
            # Let the loop run the transport's close callbacks (the socket is closed then).
            await asyncio.sleep(0)


def _default_advertise_ip(host: str) -> str:
    """The bound host, unless it is a wildcard: then the machine's first address."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    from aioice.ice import get_host_addresses

    addresses = get_host_addresses(use_ipv4=host != "::", use_ipv6=host == "::")
    chosen = addresses[0] if addresses else "127.0.0.1"
    logger.warning(
        "WebRTC: bound to %s, advertising %s to clients; set --rtc-advertise-ip to the "
        "address clients reach this machine at",
        host,
        chosen,
    )
    return chosen


def behind_relay(
    mux: UdpMux, relay_address: str | None, fleet_secret: str | None, worker_id: str
) -> None:
    """Set ``mux`` up for a fleet: hints signed for ``worker_id`` and the relays' hellos
    checked when there is a fleet secret, and candidates carrying ``relay_address``
    (``IP:PORT``) when there is a relay."""
    if fleet_secret:
        mux.signer = RouteSigner(fleet_secret, worker_id)
        mux.hellos = HelloChecker(fleet_secret, worker_id)
    if relay_address:
        host, _, port = relay_address.rpartition(":")
        mux.relay = (host, int(port))

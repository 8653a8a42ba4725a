"""The relay on loopback: real worker muxes behind it, a real Redis, clients as plain UDP
sockets speaking STUN (the calls of real peers are in test_relay_calls)."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import Iterator

import pytest

from hark.edge import framing
from hark.edge.relay import Relay
from hark.transports.webrtc.udp_mux import UdpMux
from tests.edge.conftest import Fleet, Recorder, until
from tests.ice import binding_request


async def receive(sock: socket.socket) -> tuple[bytes, tuple[str, int]]:
    """A datagram from ``sock``, read off the event loop (the relay runs on it)."""
    data, source = await asyncio.to_thread(sock.recvfrom, 2048)
    return data, (source[0], source[1])


async def first_flow(mux: UdpMux, client: socket.socket, relay: tuple[str, int]) -> Recorder:
    """A new endpoint on ``mux`` whose first binding request ``client`` sent through the relay
    at ``relay``; returned once the request reached it."""
    received = Recorder()
    ufrag = mux.new_ufrag()
    mux.open(ufrag, received)
    client.sendto(binding_request(f"{ufrag}:c"), relay)
    await until(lambda: len(received.received) == 1)
    return received


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    sockets = []
    for _ in range(3):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5)
        sockets.append(sock)
    yield sockets
    for sock in sockets:
        sock.close()


async def test_first_binding_request_picks_the_worker_then_the_address_routes(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux_a = await fleet.worker("wrk_00000000000a")
    mux_b = await fleet.worker("wrk_00000000000b")
    relay = await fleet.relay()
    a, b = Recorder(), Recorder()
    ufrag_a, ufrag_b = mux_a.new_ufrag(), mux_b.new_ufrag()
    endpoint_a = mux_a.open(ufrag_a, a)
    mux_b.open(ufrag_b, b)
    one, two, _ = clients

    one.sendto(binding_request(f"{ufrag_a}:c1"), relay.address)
    two.sendto(binding_request(f"{ufrag_b}:c2"), relay.address)
    await until(lambda: len(a.received) == 1 and len(b.received) == 1)
    # The worker sees the client's own address, not the relay's.
    assert a.received[0][1] == one.getsockname()
    assert b.received[0][1] == two.getsockname()

    one.sendto(b"\x17dtls", relay.address)
    await until(lambda: len(a.received) == 2)
    assert a.received[1] == (b"\x17dtls", one.getsockname())
    assert len(b.received) == 1

    endpoint_a.sendto(b"\x17reply", one.getsockname())
    data, source = await receive(one)
    assert (data, source) == (b"\x17reply", relay.address)
    assert relay.counters["packets_in"] == 3
    assert relay.counters["packets_out"] == 1
    assert relay.counters["flows"] == 2


async def test_forged_hints_and_strangers_are_dropped_and_counted(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux_a = await fleet.worker("wrk_00000000000a")
    await fleet.worker("wrk_00000000000b")
    relay = await fleet.relay()
    a = Recorder()
    ufrag = mux_a.new_ufrag()
    mux_a.open(ufrag, a)
    attacker = clients[0]
    # The hint of worker a, rewritten to name worker b: its MAC no longer matches.
    token = bytearray(base64.b64decode(ufrag))
    token[8] = 0x0B
    attacker.sendto(binding_request(f"{base64.b64encode(token).decode()}:x"), relay.address)
    attacker.sendto(binding_request("hark0123456789ab:x"), relay.address)
    attacker.sendto(b"\x17not stun from a stranger", relay.address)
    await until(lambda: relay.counters["drop_bad_hint"] == 1)
    await until(lambda: relay.counters["drop_malformed_hint"] == 1)
    await until(lambda: relay.counters["drop_unknown_flow"] == 1)
    assert relay.counters["flows"] == 0
    assert relay.counters["packets_in"] == 0
    assert a.received == []


async def test_a_worker_cannot_send_to_another_workers_client(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux_a = await fleet.worker("wrk_00000000000a")
    mux_b = await fleet.worker("wrk_00000000000b")
    relay = await fleet.relay()
    ufrag = mux_a.new_ufrag()
    mux_a.open(ufrag, Recorder())
    b = Recorder()
    endpoint_b = mux_b.open(mux_b.new_ufrag(), b)
    client = clients[0]
    client.sendto(binding_request(f"{ufrag}:c"), relay.address)
    await until(lambda: relay.counters["flows"] == 1)
    # Worker b learns of the client only by a frame it fakes (as if relayed) ...
    relay_source = ("127.0.0.1", relay.internal_address[1])
    await until(lambda: relay_source in mux_b.relays)
    mux_b.receive(
        framing.encode_header(client.getsockname()) + binding_request(f"{endpoint_b.ufrag}:c"),
        relay_source,
    )
    endpoint_b.sendto(b"\x17spray", client.getsockname())
    await until(lambda: relay.counters["drop_wrong_worker"] == 1)
    client.settimeout(0.3)
    with pytest.raises(TimeoutError):
        await receive(client)


async def until_mirrored(fleet: Fleet, relay: Relay, client: socket.socket) -> None:
    """Wait until the client's flow is in Redis, as the relay mirrored it."""
    assert fleet.store is not None
    key = relay.mirror._key(client.getsockname())
    async with asyncio.timeout(10):
        while True:
            if await fleet.store.client.exists(key):
                return
            await asyncio.sleep(0.01)


async def test_a_restarted_relay_forwards_at_once_from_the_mirrored_table(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux = await fleet.worker("wrk_00000000000a")
    relay = await fleet.relay()
    port = relay.address[1]
    client = clients[0]
    a = await first_flow(mux, client, relay.address)
    # The flow reaches the mirror (its key is in Redis, not merely taken off the relay's
    # queue while the write is in flight), then the relay dies.
    await until_mirrored(fleet, relay, client)
    await relay.stop()
    fleet.relays.remove(relay)

    restarted = await fleet.relay(port=port)
    assert restarted.counters["flows_restored"] == 1
    client.sendto(b"\x17media after the restart", restarted.address)
    await until(lambda: len(a.received) == 2)
    assert a.received[1][0] == b"\x17media after the restart"


async def test_a_second_relay_takes_over_a_flow_it_never_saw(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux = await fleet.worker("wrk_00000000000a")
    first = await fleet.relay()
    second = await fleet.relay()
    client = clients[0]
    a = await first_flow(mux, client, first.address)
    await until_mirrored(fleet, first, client)
    # The first datagram to the second relay is looked up (and dropped); the next goes.
    client.sendto(b"\x17one", second.address)
    await until(lambda: second.counters["flows_restored"] == 1)
    client.sendto(b"\x17two", second.address)
    await until(lambda: len(a.received) == 2)
    assert a.received[1][0] == b"\x17two"


async def test_a_flow_written_into_redis_by_hand_is_not_taken(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux = await fleet.worker("wrk_00000000000a")
    relay = await fleet.relay()
    a = Recorder()
    mux.open(mux.new_ufrag(), a)
    assert fleet.store is not None
    client = clients[0]
    host, port = client.getsockname()
    worker_host, worker_port = mux.advertised
    # A flow for the client to a live worker, as the mirror held it before it was signed.
    await fleet.store.client.set(
        f"{fleet.prefix}relay-flow:{host}:{port}", f"wrk_00000000000a {worker_host}:{worker_port}"
    )
    client.sendto(b"\x17one", relay.address)
    await until(lambda: relay.counters["lookups"] == 1)
    await until(lambda: not relay._pending)
    client.sendto(b"\x17two", relay.address)
    await until(lambda: relay.counters["drop_unknown_flow"] == 2)
    assert relay.counters["flows_restored"] == 0
    assert a.received == []


async def test_flows_expire_when_idle_and_end_with_their_worker(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux_a = await fleet.worker("wrk_00000000000a")
    mux_b = await fleet.worker("wrk_00000000000b")
    relay: Relay = await fleet.relay(idle_s=0.5)
    ufrag_a, ufrag_b = mux_a.new_ufrag(), mux_b.new_ufrag()
    mux_a.open(ufrag_a, Recorder())
    mux_b.open(ufrag_b, Recorder())
    clients[0].sendto(binding_request(f"{ufrag_a}:c"), relay.address)
    await until(lambda: relay.counters["flows"] == 1)
    await until(lambda: relay.counters["flows_expired"] == 1)
    assert relay.counters["flows"] == 0

    clients[1].sendto(binding_request(f"{ufrag_b}:c"), relay.address)
    await until(lambda: relay.counters["flows"] == 1)
    assert fleet.store is not None
    await fleet.store.remove_worker("wrk_00000000000b")
    await until(lambda: relay.counters["flows_worker_gone"] == 1)
    assert relay.counters["flows"] == 0


async def test_a_binding_request_with_a_new_hint_moves_the_flow(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    # An ICE restart, or a new call from a reused address, answered by another worker.
    mux_a = await fleet.worker("wrk_00000000000a")
    mux_b = await fleet.worker("wrk_00000000000b")
    relay = await fleet.relay()
    client = clients[0]
    a = await first_flow(mux_a, client, relay.address)
    b = Recorder()
    ufrag_b = mux_b.new_ufrag()
    mux_b.open(ufrag_b, b)
    client.sendto(binding_request(f"{ufrag_b}:c"), relay.address)
    client.sendto(b"\x17after the restart", relay.address)
    await until(lambda: len(b.received) == 2)
    assert b.received[1] == (b"\x17after the restart", client.getsockname())
    assert len(a.received) == 1
    assert relay.counters["flows"] == 1

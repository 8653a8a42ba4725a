"""Who may call, and who gets media, against a real ``hark serve --engines fake``: SIPp and a
Python phone (the SIP bench's caller) on loopback, strangers on other 127/8 addresses.

SIP on loopback with no trunk takes any caller (this machine only); with trunks configured
only their addresses and credentials ring, and media goes only to the caller's own RTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hark.bench.sip import SipCaller
from hark.transports.rtp import RtpPacket
from hark.transports.sip.dtmf import TelephoneEvent
from tests.transports.conftest import until
from tests.transports.sip.conftest import (
    SipServer,
    WebhookSipServer,
    free_sip_port,
    run_sipp,
    sip_serve,
)
from tests.transports.sip.test_fuzz_sip import request, status_of
from tests.transports.sip.test_peers_sipp import final_status, has, sideband
from tests.transports.sip.test_user_agent import _self_signed

pytestmark = pytest.mark.realtime

PASSWORD = "correct horse battery staple"
# Bounds a hang, never speed.
LIVENESS_S = 30.0


def trunks(*items: dict[str, object]) -> dict[str, str]:
    """The server's environment for these trunks."""
    return {"HARK_SIP_TRUNKS": json.dumps(list(items))}


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_a_caller_from_an_unlisted_address_is_refused(tmp_path: Path, transport: str) -> None:
    env = trunks({"name": "pbx", "addresses": ["127.0.0.1/32"]})
    with sip_serve(tmp_path / "hark.log", env=env) as server:
        run = await run_sipp(
            "uac_rejected", server.sip_port, tmp_path, transport=transport, local_ip="127.0.0.2"
        )
        assert run.ok, run.describe()
        assert final_status(run) == 403
        # Turned away before it rang: no provisional response at all.
        assert [m.split(" ", 2)[1] for m in run.received()] == ["403"], run.describe()
        assert "refused (403)" in server.log()
        # The listed address still gets through.
        run = await run_sipp("uac_rtp", server.sip_port, tmp_path, transport=transport)
        assert run.ok, run.describe()
        # A scanner's OPTIONS from the unlisted address learns no capabilities; the trunk's
        # keepalive is answered.
        probe = await run_sipp(
            "options", server.sip_port, tmp_path, transport=transport, local_ip="127.0.0.2"
        )
        assert probe.ok, probe.describe()
        (refused,) = probe.received()
        assert refused.startswith("SIP/2.0 403") and "Allow:" not in refused, probe.describe()
        keepalive = await run_sipp("options", server.sip_port, tmp_path, transport=transport)
        assert keepalive.ok, keepalive.describe()
        assert keepalive.received()[0].startswith("SIP/2.0 200"), keepalive.describe()


async def test_a_caller_without_credentials_is_challenged_and_never_rings(tmp_path: Path) -> None:
    env = trunks({"name": "office", "username": "alice", "password": PASSWORD})
    with sip_serve(tmp_path / "hark.log", env=env) as server:
        run = await run_sipp("uac_rejected", server.sip_port, tmp_path)
        assert run.ok, run.describe()
        (challenge,) = run.received()
        assert challenge.startswith("SIP/2.0 401"), run.describe()
        assert 'realm="hark"' in challenge and "nonce=" in challenge


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_a_caller_with_credentials_is_answered(tmp_path: Path, transport: str) -> None:
    env = trunks(
        {"name": "office", "addresses": ["127.0.0.0/8"], "username": "alice", "password": PASSWORD}
    )
    with sip_serve(tmp_path / "hark.log", env=env) as server:
        run = await run_sipp(
            "uac_auth_rtp",
            server.sip_port,
            tmp_path,
            transport=transport,
            extra=("-au", "alice", "-ap", PASSWORD),
        )
        assert run.ok, run.describe()
        answer = next(m for m in run.received() if m.startswith("SIP/2.0 200") and "m=audio" in m)
        assert "RTP/AVP 0" in answer, answer
        # The wrong password is refused.
        run = await run_sipp(
            "uac_auth_rtp",
            server.sip_port,
            tmp_path,
            transport=transport,
            extra=("-au", "alice", "-ap", "wrong"),
            timeout_s=10,
        )
        assert not run.ok
        assert final_status(run) == 403, run.describe()
        assert server.alive()


async def test_a_flood_of_invites_from_one_address_is_refused(tmp_path: Path) -> None:
    with sip_serve(tmp_path / "hark.log", "--sip-invite-rate", "0.1") as server:
        sip_port = server.sip_port
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            port = sock.getsockname()[1]
            for n in range(5):
                invite = request(
                    "INVITE", port, branch=f"flood{n}", call_id=f"flood-{n}", body="v=0\r\n"
                )
                sock.sendto(invite.encode(), ("127.0.0.1", sip_port))
            finals: dict[str, bytes] = {}
            async with asyncio.timeout(LIVENESS_S):
                while len(finals) < 4:
                    data = await loop.sock_recv(sock, 65536)
                    status = status_of(data)
                    if status is not None and status >= 200:
                        call_id = data.split(b"Call-ID: ", 1)[1].split(b"\r\n", 1)[0]
                        finals[call_id.decode()] = data
        busy = [data for data in finals.values() if status_of(data) == 503]
        # The bucket holds one INVITE (bursts of twice 0.1 a second, at least one): the rest
        # of the burst is refused, each told when to try again.
        assert len(busy) >= 3, finals
        assert all(b"Retry-After: " in data for data in busy)
        assert server.alive()


@contextlib.asynccontextmanager
async def microphone(caller: SipCaller) -> AsyncIterator[None]:
    """The caller sends 20 ms of RTP every 20 ms while the block runs."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        while True:
            caller.tick(loop.time())
            await asyncio.sleep(0.02)

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def stranger_socket(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.setblocking(False)
    return sock


def drained(sock: socket.socket) -> list[bytes]:
    """What has arrived on ``sock`` so far."""
    got = []
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(sock.recv(65536))
    return got


class ThirdPartyCaller(SipCaller):
    """A caller whose SDP names somebody else's address and port."""

    def __init__(self, server: tuple[str, int], victim: tuple[str, int]) -> None:
        super().__init__(server)
        self.victim = victim

    def _offer(self) -> str:
        host, port = self.victim
        return (
            super()
            ._offer()
            .replace(f"c=IN IP4 {self.host}", f"c=IN IP4 {host}")
            .replace(f"m=audio {self.rtp_port} ", f"m=audio {port} ")
        )


async def test_an_sdp_naming_a_third_address_gets_no_rtp_until_the_callers_own(
    sip_server: SipServer,
) -> None:
    with stranger_socket("127.0.0.3") as victim:
        caller = ThirdPartyCaller(("127.0.0.1", sip_server.sip_port), victim.getsockname())
        await caller.open()
        try:
            await caller.invite(limit_s=LIVENESS_S)
            # The call is up; the caller has sent nothing yet. A second of nothing for the
            # third party (the server would have sent it 50 packets).
            await asyncio.sleep(1.0)
            assert drained(victim) == []
            assert caller.received == []
            async with microphone(caller):
                await until(lambda: len(caller.received) >= 10, LIVENESS_S)
            assert drained(victim) == []
            await caller.bye()
        finally:
            caller.close()
    assert sip_server.alive()


async def test_a_stranger_mid_call_gets_no_rtp_and_is_not_heard(
    webhook_sip_server: WebhookSipServer,
) -> None:
    server = webhook_sip_server.server
    caller = SipCaller(("127.0.0.1", server.sip_port))
    await caller.open()
    try:
        inviting = asyncio.create_task(caller.invite(limit_s=LIVENESS_S))
        event = await webhook_sip_server.incoming_call()
        call_id = event.data.call_id
        await server.sdk().realtime.calls.accept(call_id, type="realtime", model="gpt-realtime")
        await inviting
        target = caller.server_rtp
        assert target is not None
        async with sideband(server, call_id) as events, microphone(caller):
            await events.until(has("session.created"))
            await until(lambda: len(caller.received) >= 5, LIVENESS_S)
            with stranger_socket("127.0.0.2") as stranger:
                # Three packets in a row (what used to move the media), then a key press.
                for n in range(3):
                    packet = RtpPacket(0, 100 + n, 160 * n, 0xBAD, b"\x00" * 160)
                    stranger.sendto(packet.pack(), target)
                for n, duration in enumerate((160, 320, 480, 480)):
                    press = TelephoneEvent(7, duration == 480, 10, duration).pack()
                    stranger.sendto(RtpPacket(101, 103 + n, 480, 0xBAD, press).pack(), target)
                # Then the caller presses 5; once it is heard, the 7 would have been.
                caller.send_dtmf("5")
                await events.until(has("input_audio_buffer.dtmf_event_received"))
                received = len(caller.received)
                await until(lambda: len(caller.received) >= received + 10, LIVENESS_S)
                assert drained(stranger) == []
        pressed = [
            e for e in events.events if e["type"] == "input_audio_buffer.dtmf_event_received"
        ]
        assert [e["event"] for e in pressed] == ["5"], events.types()
        await caller.bye()
    finally:
        caller.close()
    assert server.alive()


async def test_sip_over_tls_with_a_client_ca_takes_only_certified_peers(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    (tmp_path / "phone").mkdir()
    cert, key = _self_signed(tmp_path / "server")
    phone_cert, phone_key = _self_signed(tmp_path / "phone")
    tls_port = free_sip_port()
    tls = ("--sip-tls-port", str(tls_port), "--sip-tls-cert", str(cert), "--sip-tls-key", str(key))
    with sip_serve(tmp_path / "hark.log", *tls, "--sip-tls-client-ca", str(phone_cert)):

        async def options(certified: bool) -> bytes:
            """OPTIONS over TLS, with or without the phone's certificate: the answer, or
            nothing when the server ended the connection."""
            context = ssl.create_default_context(cafile=str(cert))
            if certified:
                context.load_cert_chain(phone_cert, phone_key)
            branch = secrets.token_hex(4)
            message = request("OPTIONS", 5061, branch=branch, call_id=branch, transport="TLS")
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", tls_port, ssl=context)
            except (ssl.SSLError, ConnectionError):
                return b""
            try:
                writer.write(message.encode())
                return await asyncio.wait_for(reader.read(65536), LIVENESS_S)
            except (ssl.SSLError, ConnectionError):
                return b""
            finally:
                writer.close()

        assert status_of(await options(certified=True)) == 200
        assert await options(certified=False) == b""

"""A call's audio on hark's own RTP path over aiortc's ICE, DTLS and SRTP, with real aiortc
peers on loopback (fake ASR, LLM and TTS).

These also pin what ``hark.transports.webrtc.rtp_audio`` relies on in aiortc and aioice: a
call whose path could not take over would not connect, or its counts would stay at zero.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pylibsrtp
import pytest
from aiortc import RTCCertificate, RTCDtlsTransport, RTCIceGatherer, RTCIceTransport, RTCRtpSender

from hark.bench.webrtc import CallClient
from hark.transports.playout import MAX_LAG_SECONDS
from hark.transports.ticker import TICK_SECONDS
from hark.transports.webrtc.call import Call
from hark.transports.webrtc.playout import FRAME_SAMPLES, PLAYOUT_RATE, PlayoutTrack
from hark.transports.webrtc.rtp_audio import AudioReceiver, AudioSender, mid_extension
from tests.transports.conftest import API_KEY, RtcServer, collect, until

MakeClient = Callable[..., CallClient]


async def connected(http: aiohttp.ClientSession, server: RtcServer, client: CallClient) -> Call:
    """Connect ``client``; the server's side of the call, once its audio path runs.

    The waits bound hangs, never speed: ten calls set up at once (ICE, DTLS and SCTP in
    Python, server and clients in one process) take tens of seconds beside a CPU hog.
    """
    await client.connect(http, server.url, api_key=API_KEY)
    await client.next_event("session.created", 120.0)
    call = server.calls.get(client.call_id or "")
    assert call is not None
    await until(lambda: call.audio is not None, 120.0)
    return call


async def test_the_audio_of_a_connected_call_runs_on_hark_s_path(
    http: aiohttp.ClientSession, rtc_server: RtcServer, clients: MakeClient
) -> None:
    client = clients()
    call = await connected(http, rtc_server, client)
    path = call.audio
    assert path is not None
    ((endpoint, receiver),) = path.receivers
    assert endpoint.get_protocol() is receiver
    # The client's microphone (silence) arrives and is decoded here, none of it dropped.
    await until(lambda: receiver.packets >= 25)
    assert receiver.audio.dropped == receiver.rejected == 0
    client.send({"type": "response.create"})
    await collect(client, "output_audio_buffer.stopped")
    await until(lambda: len(client.frames) >= 50)
    # aiortc's receiver was never started: no inbound stream, no decoder thread; its
    # sender reports (RTCP SR) count what hark sent.
    (transceiver,) = call.pc.getTransceivers()
    inbound = (await transceiver.receiver.getStats()).values()
    assert not [s for s in inbound if s.type == "inbound-rtp"]
    # The one decoder thread left in this process is the aiortc client's.
    assert len([t for t in threading.enumerate() if t.name == "audio-decoder"]) == 1
    outbound = (await transceiver.sender.getStats()).values()
    (sent,) = [s for s in outbound if s.type == "outbound-rtp"]
    assert sent.packetsSent == path.sender.packets >= len(client.frames)
    assert sent.bytesSent == path.sender._octets > 0
    # The sender reports' NTP time is hark's reading of aiortc's clock, not aiortc's zero.
    assert transceiver.sender._RTCRtpSender__ntp_timestamp > 0  # type: ignore[attr-defined]
    await client.close()
    await until(lambda: rtc_server.calls.get(call.id) is None)
    # The path let go of the mux endpoint and the pacer.
    assert endpoint.get_protocol() is not receiver
    assert len(rtc_server.calls.host.pacer) == 0


async def test_silence_is_one_cached_packet_that_decodes_as_silence(
    http: aiohttp.ClientSession, rtc_server: RtcServer, clients: MakeClient
) -> None:
    client = clients(keep_audio=True)
    call = await connected(http, rtc_server, client)
    await until(lambda: len(client.frames) >= 50)
    # No audio yet: the encoder was never made, every frame was the cached packet.
    assert call.track._encoder is None
    decoded = np.concatenate([f.pcm for f in client.frames if f.pcm is not None])
    assert len(decoded) >= 50 * 960
    assert int(np.abs(decoded.astype(np.int32)).max()) <= 1
    # A reply, then silence again: half a second after its last loud frame (the client's
    # jitter buffer and decoder may still hold some of the reply when it has stopped on the
    # server, for longer on a busy machine), the frames are silent once more.
    start = len(client.frames)
    client.send({"type": "response.create"})
    await collect(client, "output_audio_buffer.stopped")

    def loud() -> list[int]:
        return [
            n
            for n, f in enumerate(client.frames[start:], start)
            if f.pcm is not None and int(np.abs(f.pcm.astype(np.int32)).max()) > 1000
        ]

    await until(lambda: bool(loud()) and len(client.frames) >= loud()[-1] + 50)
    after = [f.pcm for f in client.frames[loud()[-1] + 25 :] if f.pcm is not None]
    assert after and int(np.abs(np.concatenate(after).astype(np.int32)).max()) <= 1


async def test_ten_calls_share_one_ticker(
    http: aiohttp.ClientSession, rtc_server: RtcServer, clients: MakeClient
) -> None:
    made = [clients() for _ in range(10)]
    calls = await asyncio.gather(*(connected(http, rtc_server, c) for c in made))
    pacer = rtc_server.calls.host.pacer
    ticker = pacer.ticker
    assert len(pacer) == 10 and len(ticker) == 1

    def frames() -> list[int]:
        """Each call's frames so far: sent, or passed over by a restart after a stall (and
        one for each restart, which starts the schedule afresh up to a frame later)."""
        counts = []
        for c in calls:
            assert c.audio is not None
            playout = c.audio.sender.track.playout
            counts.append(playout.frames_sent + playout.frames_skipped + playout.late_restarts)
        return counts

    before = ticker.ticks, frames()
    await until(lambda: ticker.ticks >= before[0] + 10)
    ticks = ticker.ticks - before[0]
    after = frames()
    # Every tick of the one timer sent every call's frames due by then: at least one a tick,
    # less one at either end. (A tick the loop skipped sends its frames on the next, so a
    # busy machine gives more frames than ticks, never fewer.)
    for n0, n1 in zip(before[1], after, strict=True):
        assert n1 - n0 >= ticks - 2, (n1 - n0, ticks)


def test_the_mid_extension_is_rfc_8285_one_byte_form() -> None:
    assert mid_extension(4, "0") == b"\xbe\xde\x00\x01" + bytes([0x40]) + b"0\x00\x00"
    block = mid_extension(9, "audio")
    assert block[:2] == b"\xbe\xde"
    assert int.from_bytes(block[2:4]) * 4 == len(block) - 4
    assert block[4] == (9 << 4) | 4 and block[5:10] == b"audio"


def test_the_receiver_passes_everything_else_to_aioice() -> None:
    got: list[bytes] = []

    class Inner(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            got.append(data)

    receiver = AudioReceiver(Inner(), None, frozenset({111}), None)  # type: ignore[arg-type]
    stun = bytes([0, 1, 0, 0]) + bytes(16)
    dtls = bytes([22, 254, 253]) + bytes(10)
    srtcp = bytes([0x80, 200]) + bytes(30)
    for datagram in (stun, dtls, srtcp):
        receiver.datagram_received(datagram, ("127.0.0.1", 1))
    assert got == [stun, dtls, srtcp]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_stall_moves_the_rtp_timestamp_on_with_the_clock() -> None:
    # After a stall the playout restarts its schedule from now; the RTP timestamp must jump
    # by the time skipped, or the receiver's jitter buffer holds every later packet that
    # much longer (the stall's delay would stay in the call to its end).
    key = os.urandom(30)
    tx = pylibsrtp.Session(pylibsrtp.Policy(key=key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
    rx = pylibsrtp.Session(pylibsrtp.Policy(key=key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND))
    sent: list[tuple[float, int]] = []
    clock = _Clock()

    def sendto(datagram: bytes, addr: Any) -> None:
        sent.append((clock.now, struct.unpack_from("!I", rx.unprotect(datagram), 4)[0]))

    pair = SimpleNamespace(protocol=SimpleNamespace(transport=SimpleNamespace(sendto=sendto)))
    pair.remote_addr = ("127.0.0.1", 9)
    ice: Any = SimpleNamespace(_nominated={1: pair})
    dtls = RTCDtlsTransport(
        RTCIceTransport(RTCIceGatherer()), [RTCCertificate.generateCertificate()]
    )
    rtp_sender: Any = RTCRtpSender(PlayoutTrack(), dtls)
    track = PlayoutTrack(clock=clock)
    sender = AudioSender(track, tx, ice, rtp_sender, 111, b"")

    def tick() -> None:
        # What the pacer does on a tick at the clock's time.
        while (delay := track.playout.due_in(clock.now)) < TICK_SECONDS / 2:
            sender.send_frame(clock.now + delay)

    for _ in range(10):
        tick()
        clock.now += 0.02
    clock.now += MAX_LAG_SECONDS + 0.4
    for _ in range(10):
        tick()
        clock.now += 0.02
    assert track.playout.late_restarts == 1
    assert len(sent) == 20
    (t0, ts0), (t1, ts1) = sent[0], sent[-1]
    # The timestamps keep pace with the clock, within the one frame the restart rounds off.
    assert abs((ts1 - ts0) % 2**32 - (t1 - t0) * PLAYOUT_RATE) < FRAME_SAMPLES


def test_an_aiortc_sender_without_the_report_counters_is_refused() -> None:
    # What aiortc's sender reports are made of is private to it; a version that renamed it
    # must fail the call rather than report nothing sent.
    sender: Any = SimpleNamespace(_ssrc=1234)
    with pytest.raises(RuntimeError, match="__packet_count"):
        AudioSender(PlayoutTrack(), None, None, sender, 111, b"")  # type: ignore[arg-type]

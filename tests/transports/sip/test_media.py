"""``RtpSession`` on loopback against a test phone: a UDP socket that sends and records RTP.

Most tests are about pacing and playout and use a session of a trusted trunk (it sends to
the SDP's address at once); the latching tests use untrusted ones, with strangers on other
127/8 addresses.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import numpy.typing as npt
import pylibsrtp
import pytest

from hark.audio.codecs.g711 import ulaw_decode, ulaw_encode
from hark.transports.rtp import RtpPacket, is_rtcp, seq_diff, ts_diff
from hark.transports.sip import rtcp
from hark.transports.sip.dtmf import TelephoneEvent
from hark.transports.sip.media import RtpSession
from hark.transports.sip.sdp import SdpError
from hark.transports.ticker import Pacer, PlayoutTicker
from tests.transports.conftest import Listener, until

HOST = "127.0.0.1"
SESSION_RATE = 24000
FRAME = 160
ULAW_SILENCE = b"\xff" * FRAME


class Phone(asyncio.DatagramProtocol):
    """One RTP port of a test phone: what it received, and a sender numbering its packets."""

    def __init__(self) -> None:
        self.rtp: list[tuple[RtpPacket, tuple[str, int]]] = []
        self.rtcp: list[list[rtcp.RtcpPacket]] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.sequence = itertools.count(1000)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if is_rtcp(data):
            self.rtcp.append(rtcp.parse_compound(data))
        else:
            self.rtp.append((RtpPacket.parse(data), addr))

    @property
    def port(self) -> int:
        assert self.transport is not None
        port: int = self.transport.get_extra_info("sockname")[1]
        return port

    def offer(self, *lines: str, formats: str = "0 8 101", address: str = HOST) -> str:
        """An offer for audio to this port."""
        return (
            "\r\n".join(
                [
                    "v=0",
                    f"o=phone 1 1 IN IP4 {address}",
                    "s=-",
                    f"c=IN IP4 {address}",
                    "t=0 0",
                    f"m=audio {self.port} RTP/AVP {formats}",
                    "a=rtpmap:101 telephone-event/8000",
                    "a=fmtp:101 0-16",
                    *lines,
                ]
            )
            + "\r\n"
        )

    ssrc = 0x5EED

    def send(
        self, media: RtpSession, payload: bytes, timestamp: int, payload_type: int = 0
    ) -> None:
        assert self.transport is not None
        sequence = next(self.sequence) % 65536
        packet = RtpPacket(payload_type, sequence, timestamp, self.ssrc, payload)
        self.transport.sendto(packet.pack(), (HOST, media.local_port))

    def payloads(self, after: int = 0) -> list[RtpPacket]:
        return [p for p, _ in self.rtp[after:]]


@pytest.fixture
async def phones() -> AsyncIterator[Callable[..., asyncio.Future[Phone]]]:
    """Makes test phones, on ``HOST`` or on another loopback address."""
    made: list[Phone] = []

    async def make(host: str = HOST) -> Phone:
        loop = asyncio.get_running_loop()
        transport, phone = await loop.create_datagram_endpoint(Phone, local_addr=(host, 0))
        phone.transport = transport
        made.append(phone)
        return phone

    yield make  # type: ignore[misc]
    for phone in made:
        if phone.transport is not None:
            phone.transport.close()


@pytest.fixture
async def media() -> AsyncIterator[RtpSession]:
    session = await RtpSession.open(bind_host=HOST, trusted=True)
    yield session
    await session.close()


@pytest.fixture
async def strict() -> AsyncIterator[RtpSession]:
    """An untrusted call's session whose SIP peer is ``HOST``."""
    session = await RtpSession.open(bind_host=HOST, peer_ip=HOST)
    yield session
    await session.close()


class Caller:
    """What the session passes on: audio at the session rate, and digits."""

    def __init__(self) -> None:
        self.audio: list[npt.NDArray[np.int16]] = []
        self.digits: list[str] = []
        self.listener = Listener()

    def start(self, media: RtpSession) -> None:
        media.start(
            input_rate=lambda: SESSION_RATE,
            on_audio=self.audio.append,
            on_dtmf=self.digits.append,
            listener=self.listener,
        )

    @property
    def samples(self) -> int:
        return sum(len(a) for a in self.audio)


def tone(rate: int, seconds: float, hz: float = 440.0) -> npt.NDArray[np.int16]:
    t = np.arange(int(rate * seconds)) / rate
    return (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def dominant_hz(pcm: npt.NDArray[np.int16], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    return float(np.argmax(spectrum) * rate / len(pcm))


async def talk(
    phone: Phone, media: RtpSession, pcm: npt.NDArray[np.int16], start_ts: int = 0
) -> None:
    """Send ``pcm`` as μ-law RTP, a packet every 20 ms of the loop's clock as a phone does."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for n in range(len(pcm) // FRAME):
        phone.send(media, ulaw_encode(pcm[n * FRAME : (n + 1) * FRAME]), start_ts + n * FRAME)
        await asyncio.sleep(start + (n + 1) * 0.02 - loop.time())


async def started(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> tuple[Phone, Caller]:
    phone = await phones()
    media.negotiate(phone.offer(), HOST)
    caller = Caller()
    caller.start(media)
    return phone, caller


async def test_the_callers_audio_reaches_the_session_at_its_rate(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, caller = await started(phones, media)
    await talk(phone, media, tone(8000, 1.0))
    # Every packet sent is received, though the last may still wait in the socket when a
    # busy loop had the phone send it late.
    await until(lambda: media.stats.packets_received == 50)
    await until(lambda: caller.samples >= SESSION_RATE * 0.8)
    heard = np.concatenate(caller.audio)
    assert abs(dominant_hz(heard[: int(SESSION_RATE * 0.8)], SESSION_RATE) - 440) < 5
    stats = media.stats
    assert stats.packets_received == 50
    assert stats.lost == stats.ignored == 0


async def test_a_key_press_is_one_digit_and_never_audio(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, caller = await started(phones, media)
    for duration in (160, 320, 480, 480, 480):
        end = duration == 480
        phone.send(media, TelephoneEvent(5, end, 10, duration).pack(), 8000, payload_type=101)
        await asyncio.sleep(0.02)
    phone.send(media, TelephoneEvent(9, True, 10, 480).pack(), 16000, payload_type=101)
    await until(lambda: len(caller.digits) == 2)
    assert caller.digits == ["5", "9"]
    assert caller.audio == []
    assert media.stats.dtmf_events == 2


async def test_played_audio_leaves_as_numbered_packets_that_decode_back_to_it(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, caller = await started(phones, media)
    await until(lambda: len(phone.rtp) >= 3)
    assert phone.rtp[0][0].payload == ULAW_SILENCE and phone.rtp[0][0].marker
    speech = tone(8000, 0.5)
    media.play("resp_1", "item_1", speech, 8000)
    media.finish("resp_1")
    await until(lambda: ("stopped", "resp_1") in caller.listener.log)
    await until(lambda: phone.rtp[-1][0].payload == ULAW_SILENCE)
    packets = phone.payloads()
    assert all(p.payload_type == 0 and len(p.payload) == FRAME for p in packets)
    assert all(seq_diff(b.sequence, a.sequence) == 1 for a, b in itertools.pairwise(packets))
    # One frame apart on the sampling clock, but where a stalled loop (a busy machine) made
    # the pacer restart its grid: there the timestamp jumps over the gap, in whole frames.
    gaps = [ts_diff(b.timestamp, a.timestamp) for a, b in itertools.pairwise(packets)]
    assert all(gap >= FRAME and gap % FRAME == 0 for gap in gaps), gaps
    assert sum(gap > FRAME for gap in gaps) <= media.stats.late_restarts
    assert not any(p.marker for p in packets[1:])
    voiced = [p.payload for p in packets if p.payload != ULAW_SILENCE]
    assert len(voiced) == 25
    decoded = ulaw_decode(b"".join(voiced))
    assert np.array_equal(decoded, ulaw_decode(ulaw_encode(speech)))
    assert caller.listener.log == [("started", "resp_1"), ("stopped", "resp_1")]


async def test_audio_at_the_session_rate_is_resampled_once_to_8_khz(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, caller = await started(phones, media)
    media.play("resp_1", "item_1", tone(SESSION_RATE, 0.5, hz=1000), SESSION_RATE)
    media.finish("resp_1")
    await until(lambda: ("stopped", "resp_1") in caller.listener.log)
    # The last voiced packets may still be on their way when the playout reports its end: a
    # silent packet after them says they have all come.
    await until(lambda: phone.rtp[-1][0].payload == ULAW_SILENCE)
    voiced = b"".join(p.payload for p in phone.payloads() if p.payload != ULAW_SILENCE)
    decoded = ulaw_decode(voiced)
    assert abs(len(decoded) - 4000) <= FRAME
    assert abs(dominant_hz(decoded, 8000) - 1000) < 5


async def test_clear_stops_the_audio_at_once_and_reports_what_was_sent(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, caller = await started(phones, media)
    media.play("resp_1", "item_1", tone(8000, 5.0), 8000)
    await until(lambda: sum(p.payload != ULAW_SILENCE for p in phone.payloads()) >= 10)
    media.clear("resp_1")
    sent_at_clear = media.stats.packets_sent
    await until(lambda: len(phone.rtp) >= sent_at_clear + 5)
    packets = phone.payloads()
    voiced = [n for n, p in enumerate(packets) if p.payload != ULAW_SILENCE]
    assert voiced[-1] < sent_at_clear
    await until(lambda: any(e[0] == "cleared" for e in caller.listener.log))
    assert caller.listener.log == [("started", "resp_1"), ("cleared", "resp_1", 20 * len(voiced))]


async def test_hold_and_resume_by_reoffer(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, caller = await started(phones, media)
    media.play("resp_1", "item_1", tone(8000, 5.0), 8000)
    await until(lambda: len(phone.rtp) >= 5)
    answer = media.negotiate(phone.offer("a=sendonly"), HOST)
    assert "a=recvonly\r\n" in answer
    held_at = media.stats.packets_sent
    ticks = len(media.stats.send_lateness_ms)
    # The phone plays music on hold: not for the session.
    await talk(phone, media, tone(8000, 0.4))
    await until(lambda: len(media.stats.send_lateness_ms) >= ticks + 20)
    assert media.stats.packets_sent == held_at
    assert caller.audio == []
    answer = media.negotiate(phone.offer("a=sendrecv"), HOST)
    assert "a=sendrecv\r\n" in answer
    await until(lambda: len(phone.rtp) >= held_at + 3)
    before, after = phone.rtp[held_at - 1][0], phone.rtp[held_at][0]
    assert after.marker and seq_diff(after.sequence, before.sequence) == 1
    # The sampling clock ran on through the 20 held ticks: a frame each, less those a tick
    # before the hold, running late, had already sent (up to MAX_LAG_SECONDS, 5 frames, and one
    # for the rounding; later than that the grid restarts and the timestamp jumps).
    assert ts_diff(after.timestamp, before.timestamp) >= (1 + 20 - 6) * FRAME
    # The reply was paused, not lost: it goes on where it stopped.
    assert after.payload != ULAW_SILENCE
    assert ("cleared", "resp_1") not in [e[:2] for e in caller.listener.log]


async def test_the_answer_follows_a_codec_change(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, _ = await started(phones, media)
    await until(lambda: len(phone.rtp) >= 2)
    answer = media.negotiate(phone.offer(formats="8 101"), HOST)
    assert "m=audio" in answer and "a=rtpmap:8 PCMA/8000" in answer
    count = len(phone.rtp)
    await until(lambda: len(phone.rtp) >= count + 3)
    last = phone.rtp[-1][0]
    assert last.payload_type == 8
    assert last.payload == b"\xd5" * FRAME


async def test_an_offer_without_g711_is_refused(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone = await phones()
    with pytest.raises(SdpError, match="no common codec"):
        media.negotiate(phone.offer(formats="9 101"), HOST)


async def test_nothing_goes_to_the_sdp_address_before_the_callers_rtp(
    phones: Callable[..., asyncio.Future[Phone]], strict: RtpSession
) -> None:
    # The SDP names a third party; the caller's RTP comes from the SIP peer's address.
    third, caller_phone = await phones("127.0.0.3"), await phones()
    strict.negotiate(third.offer(address="127.0.0.3"), HOST)
    caller = Caller()
    caller.start(strict)
    ticks = len(strict.stats.send_lateness_ms)
    await until(lambda: len(strict.stats.send_lateness_ms) >= ticks + 25)
    assert third.rtp == [] and caller_phone.rtp == []
    assert strict.stats.packets_sent == 0
    caller_phone.send(strict, ULAW_SILENCE, 0)
    assert caller_phone.transport is not None
    report = rtcp.pack_compound(rtcp.ReceiverReport(ssrc=0x5EED, blocks=()))
    caller_phone.transport.sendto(report, (HOST, strict.local_port))
    await until(lambda: len(caller_phone.rtp) >= 3)
    assert third.rtp == [] and third.rtcp == []
    await strict.close()
    # Even the RTCP BYE goes only to the caller (where its own RTCP came from).
    await until(lambda: bool(caller_phone.rtcp))
    assert third.rtcp == []


async def test_a_stranger_mid_call_is_neither_answered_nor_heard(
    phones: Callable[..., asyncio.Future[Phone]], strict: RtpSession
) -> None:
    phone, caller = await phones(), Caller()
    stranger = await phones("127.0.0.2")
    stranger.ssrc = 0xBAD
    strict.negotiate(phone.offer(), HOST)
    caller.start(strict)
    talking = asyncio.create_task(talk(phone, strict, tone(8000, 1.5)))
    try:
        await until(lambda: len(phone.rtp) >= 5)
        ignored = strict.stats.ignored
        # Three packets in a row (the old rule for a move), then a key press and speech.
        for n in range(3):
            stranger.send(strict, ulaw_encode(tone(8000, 0.02, hz=2000)), 160 * n)
        for duration in (160, 320, 480):
            event = TelephoneEvent(7, duration == 480, 10, duration).pack()
            stranger.send(strict, event, 8000, payload_type=101)
        await talk(stranger, strict, tone(8000, 0.3, hz=2000), start_ts=16000)
        await talking
    finally:
        talking.cancel()
    await until(lambda: caller.samples >= SESSION_RATE * 1.2)
    assert stranger.rtp == [] and stranger.rtcp == []
    assert caller.digits == []
    assert strict.stats.ignored >= ignored + 3 + 3 + 15
    # What the session heard is the caller's 440 Hz, not the stranger's 2 kHz.
    heard = np.concatenate(caller.audio)
    assert abs(dominant_hz(heard, SESSION_RATE) - 440) < 5
    spectrum = np.abs(np.fft.rfft(heard.astype(np.float64)))
    hz = np.fft.rfftfreq(len(heard), 1 / SESSION_RATE)
    assert spectrum[np.abs(hz - 2000) < 20].max() < spectrum.max() / 30


async def test_the_latch_follows_the_callers_own_stream_to_a_new_port(
    phones: Callable[..., asyncio.Future[Phone]], strict: RtpSession
) -> None:
    old, new = await phones(), await phones("127.0.0.2")
    strict.negotiate(old.offer(), HOST)
    Caller().start(strict)
    old.send(strict, ULAW_SILENCE, 0)
    await until(lambda: len(old.rtp) >= 2)
    # The caller's NAT binding changes: its stream goes on (same SSRC, next sequence
    # number) from another address, which takes the packets at once.
    new.sequence = old.sequence
    new.send(strict, ULAW_SILENCE, 160)
    await until(lambda: len(new.rtp) >= 2)
    count = len(old.rtp)
    await until(lambda: len(new.rtp) >= 6)
    assert len(old.rtp) <= count + 1


async def test_a_new_source_takes_over_only_once_the_caller_fell_silent(
    phones: Callable[..., asyncio.Future[Phone]],
    strict: RtpSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hark.transports.sip.media.RELATCH_SILENCE_S", 0.3)
    caller_phone, other = await phones(), await phones("127.0.0.2")
    other.ssrc = 0x0DD
    strict.negotiate(caller_phone.offer(), HOST)
    Caller().start(strict)
    caller_phone.send(strict, ULAW_SILENCE, 0)
    await until(lambda: len(caller_phone.rtp) >= 2)
    # The caller stops; once it has been silent long enough, a stream that passes the
    # first-packets test (three in a row of one SSRC) takes over.
    ticks = len(strict.stats.send_lateness_ms)
    await until(lambda: len(strict.stats.send_lateness_ms) >= ticks + 25)
    await talk(other, strict, tone(8000, 0.1))
    await until(lambda: len(other.rtp) >= 2)


async def test_a_first_source_elsewhere_must_send_a_run_of_one_stream(
    phones: Callable[..., asyncio.Future[Phone]], strict: RtpSession
) -> None:
    # The SDP and SIP say 127.0.0.1; the RTP comes from another address (a NAT that maps
    # media elsewhere): it latches, but only after three in a row of one stream.
    announced, elsewhere = await phones(), await phones("127.0.0.2")
    strict.negotiate(announced.offer(), HOST)
    Caller().start(strict)
    for ssrc in (1, 2):
        elsewhere.ssrc = ssrc
        elsewhere.send(strict, ULAW_SILENCE, 0)
    ticks = len(strict.stats.send_lateness_ms)
    await until(lambda: len(strict.stats.send_lateness_ms) >= ticks + 10)
    assert elsewhere.rtp == [] and strict.stats.ignored == 2
    await talk(elsewhere, strict, tone(8000, 0.06))
    await until(lambda: len(elsewhere.rtp) >= 2)
    assert announced.rtp == []


async def test_silence_from_the_caller_ends_the_call_but_a_hold_does_not(
    phones: Callable[..., asyncio.Future[Phone]], strict: RtpSession
) -> None:
    phone = await phones()
    strict.negotiate(phone.offer(), HOST)
    inactive: list[float] = []
    loop = asyncio.get_running_loop()
    strict.start(
        input_rate=lambda: SESSION_RATE,
        on_audio=lambda _: None,
        on_dtmf=lambda _: None,
        listener=Listener(),
        rtp_timeout=0.3,
        on_inactive=lambda: inactive.append(loop.time()),
    )
    # On hold (the caller sends nothing, by design), the timeout does not run out.
    strict.negotiate(phone.offer("a=inactive"), HOST)
    ticks = len(strict.stats.send_lateness_ms)
    await until(lambda: len(strict.stats.send_lateness_ms) >= ticks + 30)
    assert inactive == []
    strict.negotiate(phone.offer(), HOST)
    await talk(phone, strict, tone(8000, 0.1))
    await until(lambda: bool(inactive))
    # Once: the call is ending.
    ticks = len(strict.stats.send_lateness_ms)
    await until(lambda: len(strict.stats.send_lateness_ms) >= ticks + 25)
    assert len(inactive) == 1


async def test_close_says_bye_in_rtcp_with_a_report_of_what_was_received(
    phones: Callable[[], asyncio.Future[Phone]],
) -> None:
    media = await RtpSession.open(bind_host=HOST)
    phone, rtcp_port = await phones(), await phones()
    offer = phone.offer(f"a=rtcp:{rtcp_port.port}")
    media.negotiate(offer, HOST)
    Caller().start(media)
    await talk(phone, media, tone(8000, 0.2))
    assert phone.transport is not None
    ntp = rtcp.ntp_time(1_700_000_000.0)
    report = rtcp.SenderReport(0x5EED, ntp, 0, 10, 1600)
    phone.transport.sendto(rtcp.pack_compound(report), (HOST, media.local_port))
    await until(lambda: media.stats.packets_received >= 10)
    await asyncio.sleep(0.05)
    await media.close()
    # The report goes where the phone's own RTCP came from (its RTP port here).
    await until(lambda: bool(phone.rtcp))
    sender_report, description, bye = phone.rtcp[-1]
    assert isinstance(sender_report, rtcp.SenderReport)
    assert sender_report.packets == media.stats.packets_sent
    (block,) = sender_report.blocks
    assert block.ssrc == 0x5EED and block.cumulative_lost == 0
    assert block.last_sr == rtcp.middle_ntp(ntp)
    assert isinstance(description, rtcp.SourceDescription)
    assert isinstance(bye, rtcp.Bye) and bye.sources == (sender_report.ssrc,)


async def test_rtcp_goes_to_the_offered_rtcp_port_before_the_phone_sends_any(
    phones: Callable[[], asyncio.Future[Phone]],
) -> None:
    # A trusted trunk's: an untrusted call sends nothing before the phone does.
    media = await RtpSession.open(bind_host=HOST, trusted=True)
    phone, rtcp_port = await phones(), await phones()
    media.negotiate(phone.offer(f"a=rtcp:{rtcp_port.port}"), HOST)
    await media.close()
    await until(lambda: bool(rtcp_port.rtcp))
    assert isinstance(rtcp_port.rtcp[0][0], rtcp.ReceiverReport)
    assert isinstance(rtcp_port.rtcp[0][-1], rtcp.Bye)


async def test_ports_come_from_the_range_until_it_is_used_up() -> None:
    base = random.randrange(41000, 49000, 4)
    ports = range(base, base + 4)
    first = await RtpSession.open(bind_host=HOST, ports=ports)
    second = await RtpSession.open(bind_host=HOST, ports=ports)
    try:
        assert {first.local_port, second.local_port} == {base, base + 2}
        with pytest.raises(OSError, match="no free RTP port"):
            await RtpSession.open(bind_host=HOST, ports=ports)
    finally:
        await first.close()
        await second.close()


async def test_a_stalled_loop_restarts_the_grid_instead_of_bursting(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, _ = await started(phones, media)
    await until(lambda: len(phone.rtp) >= 3)
    # Block the loop, as a stalled worker would.
    time.sleep(0.3)  # noqa: ASYNC251
    count = len(phone.rtp)
    await until(lambda: len(phone.rtp) >= count + 3)
    stats = media.stats
    # The stall restarted the grid; a busy machine may stall the loop past the limit again.
    assert stats.late_restarts >= 1 and stats.late_frames >= stats.late_restarts
    packets = phone.payloads()
    gaps = [ts_diff(b.timestamp, a.timestamp) for a, b in itertools.pairwise(packets)]
    # A jump on the sampling clock over the stall, in whole frames; the frames between the
    # restarts are one frame apart: a jump is a restart, never a burst of late frames. The
    # 300 ms stall (15 frames) may start up to a frame before the next frame is due, and the
    # frames skipped are counted whole: 13 at the least, however late the loop wakes.
    assert max(gaps) >= 13 * FRAME
    assert all(gap >= FRAME and gap % FRAME == 0 for gap in gaps), gaps
    assert sum(gap > FRAME for gap in gaps) <= stats.late_restarts
    assert all(seq_diff(b.sequence, a.sequence) == 1 for a, b in itertools.pairwise(packets))


async def test_an_old_style_hold_keeps_the_latch_for_the_resume(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    announced, behind_nat = await phones(), await phones()
    offer = announced.offer()
    media.negotiate(offer, HOST)
    Caller().start(media)
    behind_nat.send(media, ULAW_SILENCE, 0)
    await until(lambda: len(behind_nat.rtp) >= 2)
    announced_before = len(announced.rtp)
    media.negotiate(offer.replace(f"c=IN IP4 {HOST}", "c=IN IP4 0.0.0.0"), HOST)
    held = len(behind_nat.rtp)
    ticks = len(media.stats.send_lateness_ms)
    await until(lambda: len(media.stats.send_lateness_ms) >= ticks + 5)
    assert len(behind_nat.rtp) <= held + 1
    media.negotiate(offer, HOST)
    count = len(behind_nat.rtp)
    await until(lambda: len(behind_nat.rtp) >= count + 3)
    assert len(announced.rtp) == announced_before


async def test_calls_on_one_pacer_share_its_ticker_and_leave_it_when_closed(
    phones: Callable[[], asyncio.Future[Phone]],
) -> None:
    ticker = PlayoutTicker(0.02)
    pacer = Pacer(ticker)
    calls = [await RtpSession.open(bind_host=HOST, pacer=pacer, trusted=True) for _ in range(3)]
    try:
        callers = [await started(phones, media) for media in calls]
        assert len(pacer) == 3 and len(ticker) == 1
        before = [len(phone.rtp) for phone, _ in callers]
        ticks = ticker.ticks
        await until(lambda: ticker.ticks >= ticks + 10)
        for (phone, _), count in zip(callers, before, strict=True):
            packets = phone.payloads()
            assert len(packets) >= count + 10
            steps = {ts_diff(b.timestamp, a.timestamp) for a, b in itertools.pairwise(packets)}
            assert steps == {FRAME}
        await calls[0].close()
        assert len(pacer) == 2
    finally:
        for media in calls:
            await media.close()
    assert len(pacer) == 0 and len(ticker) == 0


async def test_mutated_rtp_and_rtcp_are_counted_and_never_raise(
    phones: Callable[[], asyncio.Future[Phone]], media: RtpSession
) -> None:
    phone, caller = await started(phones, media)
    event = TelephoneEvent(5, False, 10, 160).pack()
    report = rtcp.ReceiverReport(ssrc=0x5EED, blocks=())
    seeds = [
        RtpPacket(0, 1, 160, 0x5EED, ULAW_SILENCE).pack(),
        RtpPacket(101, 2, 320, 0x5EED, event).pack(),
        rtcp.pack_compound(report, rtcp.SourceDescription(((0x5EED, "phone"),))),
    ]
    rng = random.Random(4733)
    for _ in range(20000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.6 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            else:
                del data[rng.randrange(len(data) + 1) :]
        # What the socket hands the session, as the protocol does: an exception here would
        # be the loop's, and end the call's media.
        media._receive(bytes(data), (HOST, phone.port))
    stats = media.stats
    assert stats.ignored > 0 and stats.packets_received > 0
    # The session still sends and still hears the phone.
    count, samples = len(phone.rtp), caller.samples
    await talk(phone, media, tone(8000, 0.2), start_ts=10**6)
    await until(lambda: len(phone.rtp) >= count + 5 and caller.samples > samples)


@pytest.mark.parametrize(
    ("suite", "profile", "tag_bytes"),
    [
        ("AES_CM_128_HMAC_SHA1_80", pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80, 10),
        # Trunks offer the short tag too (Twilio takes both); baresip offers only _80.
        ("AES_CM_128_HMAC_SHA1_32", pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32, 4),
    ],
)
async def test_sdes_srtp_over_tls_both_ways_and_nothing_in_clear(
    phones: Callable[..., asyncio.Future[Phone]],
    strict: RtpSession,
    suite: str,
    profile: int,
    tag_bytes: int,
) -> None:
    phone = await phones()
    phone_key = bytes(range(30))
    inline = base64.b64encode(phone_key).decode()
    # A suite hark does not take, listed first, is passed over for the next line.
    offered = (
        f"a=crypto:1 AEAD_AES_256_GCM inline:{inline}",
        f"a=crypto:2 {suite} inline:{inline}",
    )
    offer = phone.offer(*offered).replace("RTP/AVP", "RTP/SAVP")
    # Keys in clear SIP are no secret: refused unless the INVITE came over TLS.
    with pytest.raises(SdpError, match="only over SIP over TLS"):
        strict.negotiate(offer, HOST)
    answer = strict.negotiate(offer, HOST, secure=True)
    assert "m=audio" in answer and "RTP/SAVP" in answer
    (line,) = [x for x in answer.splitlines() if x.startswith("a=crypto:")]
    tag, chosen, answered = line.removeprefix("a=crypto:").split()
    assert (tag, chosen) == ("2", suite)
    hark_key = base64.b64decode(answered.removeprefix("inline:"))
    assert len(hark_key) == 30 and hark_key != phone_key
    outbound = pylibsrtp.Policy(
        key=phone_key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile
    )
    inbound = pylibsrtp.Policy(
        key=hark_key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND, srtp_profile=profile
    )
    to_hark, from_hark = pylibsrtp.Session(outbound), pylibsrtp.Session(inbound)
    caller = Caller()
    caller.start(strict)
    assert phone.transport is not None
    # A packet in clear is not the caller's: dropped, nothing latches.
    phone.transport.sendto(
        RtpPacket(0, 1, 0, 0x5EED, ULAW_SILENCE).pack(), (HOST, strict.local_port)
    )
    await until(lambda: strict.stats.ignored == 1)
    assert strict.stats.packets_sent == 0
    pcm = tone(8000, 0.4)
    for n in range(20):
        packet = RtpPacket(
            0, 2 + n, n * FRAME, 0x5EED, ulaw_encode(pcm[n * FRAME : (n + 1) * FRAME])
        )
        phone.transport.sendto(to_hark.protect(packet.pack()), (HOST, strict.local_port))
        await asyncio.sleep(0.02)
    await until(lambda: caller.samples >= SESSION_RATE * 0.3)
    assert abs(dominant_hz(np.concatenate(caller.audio), SESSION_RATE) - 440) < 5
    # What hark sends is SRTP: it does not parse as our silence, it decrypts to it.
    await until(lambda: len(phone.rtp) >= 3)
    sealed = [p for p, _ in phone.rtp]
    assert all(p.payload != ULAW_SILENCE for p in sealed)
    clear = RtpPacket.parse(from_hark.unprotect(sealed[-1].pack()))
    assert clear.payload == ULAW_SILENCE
    # The suite's authentication tag: 80 bits or 32.
    assert len(sealed[-1].pack()) == len(clear.pack()) + tag_bytes
    # A re-offer may not drop to plain RTP.
    with pytest.raises(SdpError, match="fall back"):
        strict.negotiate(phone.offer(), HOST, secure=True)

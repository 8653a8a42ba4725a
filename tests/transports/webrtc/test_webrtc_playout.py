"""The WebRTC adapter of playout: Opus packets at 48 kHz, timestamped, silence cached."""

from __future__ import annotations

import asyncio
import itertools
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from aiortc.mediastreams import MediaStreamError
from av import CodecContext, Packet

from hark.transports.webrtc.playout import FRAME_SAMPLES, PLAYOUT_RATE, PlayoutTrack
from tests.transports.conftest import Listener


def tone(seconds: float, rate: int = PLAYOUT_RATE) -> npt.NDArray[np.int16]:
    t = np.arange(int(rate * seconds)) / rate
    return (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


def decode(packets: list[Packet]) -> npt.NDArray[np.int16]:
    """The first channel of what a libopus decoder makes of ``packets``."""
    decoder = CodecContext.create("libopus", "r")
    decoded = np.concatenate(
        [frame.to_ndarray()[0] for p in packets for frame in decoder.decode(Packet(bytes(p)))]
    )
    mono: npt.NDArray[np.int16] = decoded.reshape(
        -1, len(decoded) // (len(packets) * FRAME_SAMPLES)
    )[:, 0]
    return mono


@pytest.fixture
def track() -> PlayoutTrack:
    # Every reading of the clock is one frame later: each frame is due when asked for.
    return PlayoutTrack(clock=itertools.count(0.0, FRAME_SAMPLES / PLAYOUT_RATE).__next__)


async def test_recv_gives_timestamped_opus_packets(track: PlayoutTrack) -> None:
    listener = Listener()
    track.attach(listener)
    track.play("resp_1", "item_1", tone(0.5), PLAYOUT_RATE)
    track.finish("resp_1")
    packets = [await track.recv() for _ in range(40)]
    track.stop()
    assert [p.pts for p in packets] == [n * FRAME_SAMPLES for n in range(40)]
    assert all(p.time_base == Fraction(1, PLAYOUT_RATE) for p in packets)
    assert listener.log == [("started", "resp_1"), ("stopped", "resp_1")]
    mono = decode(packets)
    loud = np.flatnonzero(np.abs(mono) > 1000)
    # Half a second of tone (behind the codec's few ms of look-ahead), then silence.
    assert abs(PLAYOUT_RATE // 2 - (loud[-1] - loud[0])) < 2 * FRAME_SAMPLES
    spectrum = np.abs(np.fft.rfft(mono[loud[0] : loud[0] + PLAYOUT_RATE // 4].astype(float)))
    assert abs(np.argmax(spectrum) * 4 - 440) <= 4
    silent = {bytes(p) for p in packets[30:]}
    assert len(silent) == 1, "idle frames are the one cached silence packet"


async def test_reply_audio_is_resampled_to_48_khz(track: PlayoutTrack) -> None:
    track.play("resp_1", "item_1", tone(0.5, rate=24000), 24000)
    track.finish("resp_1")
    mono = decode([await track.recv() for _ in range(40)])
    loud = np.flatnonzero(np.abs(mono) > 1000)
    assert abs(PLAYOUT_RATE // 2 - (loud[-1] - loud[0])) < 2 * FRAME_SAMPLES
    spectrum = np.abs(np.fft.rfft(mono[loud[0] : loud[0] + PLAYOUT_RATE // 4].astype(float)))
    assert abs(np.argmax(spectrum) * 4 - 440) <= 4


async def test_clear_cuts_the_track_within_a_frame(track: PlayoutTrack) -> None:
    listener = Listener()
    track.attach(listener)
    track.play("resp_1", "item_1", tone(1.0), PLAYOUT_RATE)
    for _ in range(5):
        await track.recv()
    track.clear("resp_1")
    # The encoder's tail flushes its look-ahead; after that, the cached silence packet.
    after = [bytes(await track.recv()) for _ in range(4)]
    assert len(set(after[2:])) == 1
    await asyncio.sleep(0)
    assert listener.log == [("started", "resp_1"), ("cleared", "resp_1", 100)]


async def test_a_stopped_track_ends(track: PlayoutTrack) -> None:
    track.play("resp_1", "item_1", tone(1.0), PLAYOUT_RATE)
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()


async def test_a_driven_track_gives_its_payloads_to_the_driver_only(track: PlayoutTrack) -> None:
    track.drive()
    pending = asyncio.ensure_future(track.recv())
    track.play("resp_1", "item_1", tone(0.1), PLAYOUT_RATE)
    track.finish("resp_1")
    payloads = [track.next_payload() for _ in range(10)]
    await asyncio.sleep(0)
    assert not pending.done()
    assert track.playout.frames_sent == 10
    assert len(set(payloads[:5])) == 5 and len(set(payloads[-3:])) == 1
    track.stop()
    with pytest.raises(MediaStreamError):
        await pending

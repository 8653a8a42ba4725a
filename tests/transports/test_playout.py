"""Server-side playout: frames cut from queued responses, exact played counts, clear."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from av import CodecContext, Packet

from hark.transports.webrtc.playout import FRAME_SAMPLES, PLAYOUT_RATE, PlayoutTrack


class Listener:
    """Records playout progress."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str] | tuple[str, str, int]] = []

    def playout_started(self, response_id: str) -> None:
        self.log.append(("started", response_id))

    def playout_stopped(self, response_id: str) -> None:
        self.log.append(("stopped", response_id))

    def playout_cleared(self, response_id: str, played_ms: int) -> None:
        self.log.append(("cleared", response_id, played_ms))


def ramp(n: int, start: int = 1) -> np.ndarray:
    return (np.arange(start, start + n) % 30000).astype(np.int16)


@pytest.fixture
def track() -> PlayoutTrack:
    return PlayoutTrack()


@pytest.fixture
def listener(track: PlayoutTrack) -> Listener:
    listener = Listener()
    track.attach(listener)
    return listener


def test_silence_when_nothing_is_queued(track: PlayoutTrack, listener: Listener) -> None:
    frame = track.next_frame()
    assert len(frame) == FRAME_SAMPLES and not frame.any()
    assert listener.log == []


def test_audio_at_the_playout_rate_passes_unchanged(
    track: PlayoutTrack, listener: Listener
) -> None:
    pcm = ramp(FRAME_SAMPLES * 2 + 100)
    track.play("resp_1", "item_1", pcm, PLAYOUT_RATE)
    track.finish("resp_1")
    frames = [track.next_frame() for _ in range(4)]
    assert np.array_equal(np.concatenate(frames)[: len(pcm)], pcm)
    assert not np.concatenate(frames)[len(pcm) :].any()
    assert listener.log == [("started", "resp_1"), ("stopped", "resp_1")]


def test_responses_follow_each_other_within_a_frame(
    track: PlayoutTrack, listener: Listener
) -> None:
    track.play("resp_1", "item_1", ramp(500), PLAYOUT_RATE)
    track.play("resp_2", "item_2", ramp(500, 1000), PLAYOUT_RATE)
    track.finish("resp_1")
    track.finish("resp_2")
    frame = track.next_frame()
    assert np.array_equal(frame[:500], ramp(500))
    assert np.array_equal(frame[500:], ramp(460, 1000))
    assert listener.log == [("started", "resp_1"), ("started", "resp_2"), ("stopped", "resp_1")]
    track.next_frame()
    assert listener.log[-1] == ("stopped", "resp_2")


def test_late_audio_waits_with_silence_until_the_response_is_finished(
    track: PlayoutTrack, listener: Listener
) -> None:
    track.play("resp_1", "item_1", ramp(FRAME_SAMPLES // 2), PLAYOUT_RATE)
    track.play("resp_2", "item_2", ramp(FRAME_SAMPLES), PLAYOUT_RATE)
    first = track.next_frame()
    assert not first[FRAME_SAMPLES // 2 :].any(), "resp_2 must wait for resp_1 to finish"
    assert listener.log == [("started", "resp_1")]
    track.play("resp_1", "item_1", ramp(FRAME_SAMPLES // 2, 5000), PLAYOUT_RATE)
    track.finish("resp_1")
    second = track.next_frame()
    assert np.array_equal(second[: FRAME_SAMPLES // 2], ramp(FRAME_SAMPLES // 2, 5000))
    assert ("stopped", "resp_1") in listener.log


def test_audio_is_resampled_to_the_playout_rate(track: PlayoutTrack) -> None:
    t = np.arange(24000) / 24000
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    track.play("resp_1", "item_1", tone, 24000)
    track.finish("resp_1")
    out = np.concatenate([track.next_frame() for _ in range(60)])
    audible = np.flatnonzero(np.abs(out) > 100)
    assert abs((audible[-1] + 1) - PLAYOUT_RATE) < 200
    spectrum = np.abs(np.fft.rfft(out[:PLAYOUT_RATE].astype(np.float64)))
    assert abs(np.argmax(spectrum) - 440) <= 1


async def test_clear_stops_before_the_next_frame_and_reports_what_was_sent(
    track: PlayoutTrack, listener: Listener
) -> None:
    track.play("resp_1", "item_1", ramp(PLAYOUT_RATE), PLAYOUT_RATE)
    for _ in range(7):
        track.next_frame()
    track.clear("resp_1")
    assert not track.next_frame().any()
    await asyncio.sleep(0)
    assert listener.log == [("started", "resp_1"), ("cleared", "resp_1", 140)]
    track.play("resp_1", "item_1", ramp(100), PLAYOUT_RATE)
    assert not track.next_frame().any(), "audio of a cleared response must not play"


async def test_clearing_one_response_keeps_the_next(
    track: PlayoutTrack, listener: Listener
) -> None:
    track.play("resp_1", "item_1", ramp(PLAYOUT_RATE), PLAYOUT_RATE)
    track.play("resp_2", "item_2", ramp(FRAME_SAMPLES, 7), PLAYOUT_RATE)
    track.next_frame()
    track.clear("resp_1")
    track.clear("resp_unknown")
    assert np.array_equal(track.next_frame(), ramp(FRAME_SAMPLES, 7))
    await asyncio.sleep(0)
    assert ("cleared", "resp_1", 20) in listener.log
    assert not any(entry[1] == "resp_unknown" for entry in listener.log)


async def test_a_queued_response_cleared_before_it_started_played_nothing(
    track: PlayoutTrack, listener: Listener
) -> None:
    track.play("resp_1", "item_1", ramp(100), PLAYOUT_RATE)
    track.clear("resp_1")
    await asyncio.sleep(0)
    assert listener.log == [("cleared", "resp_1", 0)]


async def test_recv_gives_timestamped_opus_packets(track: PlayoutTrack) -> None:
    t = np.arange(PLAYOUT_RATE // 2) / PLAYOUT_RATE
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    track.play("resp_1", "item_1", tone, PLAYOUT_RATE)
    track.finish("resp_1")
    packets = [await track.recv() for _ in range(40)]
    track.stop()
    assert [p.pts for p in packets] == [n * FRAME_SAMPLES for n in range(40)]
    decoder = CodecContext.create("libopus", "r")
    decoded = np.concatenate(
        [frame.to_ndarray()[0] for p in packets for frame in decoder.decode(Packet(bytes(p)))]
    )
    mono = decoded.reshape(-1, len(decoded) // (40 * FRAME_SAMPLES))[:, 0]
    loud = np.flatnonzero(np.abs(mono) > 1000)
    # Half a second of tone (behind the codec's few ms of look-ahead), then silence.
    assert abs(len(tone) - (loud[-1] - loud[0])) < 2 * FRAME_SAMPLES
    spectrum = np.abs(np.fft.rfft(mono[loud[0] : loud[0] + PLAYOUT_RATE // 4].astype(float)))
    assert abs(np.argmax(spectrum) * 4 - 440) <= 4
    silent = {bytes(p) for p in packets[30:]}
    assert len(silent) == 1, "idle frames are the one cached silence packet"

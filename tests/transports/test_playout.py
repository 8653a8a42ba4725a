"""Transport-neutral playout on a fake clock: pacing, order, what was heard, finish, bounds.

Every behaviour runs at 48 kHz (WebRTC/Opus) and at 8 kHz (SIP/G.711); the last test makes
G.711 frames from the playout as a SIP adapter will.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.codecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from hark.transports.playout import MAX_LAG_SECONDS, MAX_RESPONSES, Playout

from .conftest import Listener


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ramp(n: int, start: int = 1) -> npt.NDArray[np.int16]:
    return (np.arange(start, start + n) % 30000).astype(np.int16)


def tone(rate: int, seconds: float, hz: float = 440.0) -> npt.NDArray[np.int16]:
    t = np.arange(int(rate * seconds)) / rate
    return (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def paced(playout: Playout, clock: Clock, frames: int) -> list[float]:
    """Drive ``playout`` as a transport does, waiting on the fake clock; release times."""
    released = []
    for _ in range(frames):
        delay = playout.due_in()
        if delay > 0:
            clock.now += delay
        released.append(clock.now)
        playout.next_frame()
    return released


def until_stopped(
    playout: Playout, listener: Listener, response_id: str
) -> list[npt.NDArray[np.int16]]:
    """The frames up to the one that reports ``response_id`` stopped (within a minute)."""
    frames = []
    for _ in range(3000):
        frames.append(playout.next_frame())
        if ("stopped", response_id) in listener.log:
            return frames
    raise AssertionError(f"{response_id} never stopped")


@pytest.fixture(params=[48000, 8000], ids=["48k", "8k"])
def rate(request: pytest.FixtureRequest) -> int:
    rate: int = request.param
    return rate


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def playout(rate: int, clock: Clock) -> Playout:
    return Playout(rate, clock=clock)


@pytest.fixture
def listener(playout: Playout) -> Listener:
    listener = Listener()
    playout.attach(listener)
    return listener


def test_frames_are_20_ms_at_the_playout_rate(playout: Playout, rate: int) -> None:
    assert playout.frame_samples == rate // 50
    frame = playout.next_frame()
    assert frame is playout.silence and len(frame) == rate // 50 and not frame.any()


def test_odd_frame_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="whole samples"):
        Playout(11025, frame_ms=20, clock=Clock())


def test_frame_n_is_released_at_start_plus_n_frames(playout: Playout, clock: Clock) -> None:
    start = clock.now
    released = paced(playout, clock, 50)
    assert released == pytest.approx([start + n * 0.02 for n in range(50)])


def test_a_short_stall_is_caught_up_without_restarting(playout: Playout, clock: Clock) -> None:
    start = clock.now
    paced(playout, clock, 10)
    clock.now += 0.06
    assert playout.due_in() == pytest.approx(-0.04)
    released = paced(playout, clock, 5)
    assert released[:3] == pytest.approx([start + 0.24] * 3), "missed frames go out at once"
    assert released[3:] == pytest.approx([start + 0.26, start + 0.28])
    assert playout.late_restarts == 0


def test_a_long_stall_restarts_the_schedule(playout: Playout, clock: Clock) -> None:
    paced(playout, clock, 10)
    clock.now += MAX_LAG_SECONDS + 0.5
    stalled_at = clock.now
    released = paced(playout, clock, 3)
    assert released == pytest.approx([stalled_at, stalled_at + 0.02, stalled_at + 0.04])
    assert playout.late_restarts == 1


def test_the_schedule_read_at_a_given_time_ignores_the_clock(
    playout: Playout, clock: Clock
) -> None:
    # A pacer reads every call's schedule at its tick's grid time, not the clock's.
    assert playout.due_in(5.0) == 0.0
    playout.next_frame()
    assert playout.due_in(5.0) == pytest.approx(0.02)
    assert playout.due_in(5.03) == pytest.approx(-0.01)
    clock.now = 1000.0
    assert playout.due_in(5.03) == pytest.approx(-0.01)
    assert playout.late_restarts == 0


def test_a_passed_frame_keeps_the_schedule_and_the_audio(
    playout: Playout, listener: Listener, rate: int, clock: Clock
) -> None:
    frame = rate // 50
    pcm = ramp(frame * 3)
    playout.play("resp_1", "item_1", pcm, rate)
    start = clock.now
    assert playout.due_in() == 0.0
    # Held: the frame's time passes, nothing is cut, nothing is reported played.
    playout.pass_frame()
    playout.pass_frame()
    assert playout.due_in() == pytest.approx(start + 0.04 - clock.now)
    assert listener.log == []
    clock.now += 0.04
    # Resumed: the audio goes on from where it was, on the same schedule.
    assert np.array_equal(playout.next_frame(), pcm[:frame])
    assert playout.due_in() == pytest.approx(0.02)
    assert (playout.frames_sent, playout.frames_passed) == (1, 2)


def test_audio_at_the_playout_rate_passes_unchanged(
    playout: Playout, listener: Listener, rate: int
) -> None:
    frame = rate // 50
    pcm = ramp(frame * 2 + 100)
    playout.play("resp_1", "item_1", pcm, rate)
    playout.finish("resp_1")
    frames = [playout.next_frame() for _ in range(4)]
    assert np.array_equal(np.concatenate(frames)[: len(pcm)], pcm)
    assert not np.concatenate(frames)[len(pcm) :].any()
    assert listener.log == [("started", "resp_1"), ("stopped", "resp_1")]


def test_responses_play_in_order_and_follow_each_other_within_a_frame(
    playout: Playout, listener: Listener, rate: int
) -> None:
    frame = rate // 50
    playout.play("resp_1", "item_1", ramp(frame // 4), rate)
    playout.play("resp_2", "item_2", ramp(frame, 1000), rate)
    playout.play("resp_1", "item_1", ramp(frame // 4, 5000), rate)
    playout.finish("resp_1")
    playout.finish("resp_2")
    first = playout.next_frame()
    assert np.array_equal(first[: frame // 4], ramp(frame // 4))
    assert np.array_equal(first[frame // 4 : frame // 2], ramp(frame // 4, 5000))
    assert np.array_equal(first[frame // 2 :], ramp(frame - frame // 2, 1000))
    assert listener.log == [("started", "resp_1"), ("started", "resp_2"), ("stopped", "resp_1")]
    playout.next_frame()
    assert listener.log[-1] == ("stopped", "resp_2")


def test_a_response_that_runs_dry_waits_with_silence_until_finished(
    playout: Playout, listener: Listener, rate: int
) -> None:
    frame = rate // 50
    playout.play("resp_1", "item_1", ramp(frame // 2), rate)
    playout.play("resp_2", "item_2", ramp(frame), rate)
    first = playout.next_frame()
    assert not first[frame // 2 :].any(), "resp_2 must wait for resp_1 to finish"
    assert playout.next_frame() is playout.silence
    assert listener.log == [("started", "resp_1")]
    playout.play("resp_1", "item_1", ramp(frame // 2, 5000), rate)
    playout.finish("resp_1")
    third = playout.next_frame()
    assert np.array_equal(third[: frame // 2], ramp(frame // 2, 5000))
    assert np.array_equal(third[frame // 2 :], ramp(frame - frame // 2))
    assert listener.log == [("started", "resp_1"), ("started", "resp_2"), ("stopped", "resp_1")]


def test_finish_flushes_the_resampler_and_the_response_stops_after_its_last_sample(
    playout: Playout, listener: Listener, rate: int
) -> None:
    pcm = tone(24000, 0.5)
    playout.play("resp_1", "item_1", pcm, 24000)
    playout.finish("resp_1")
    out = until_stopped(playout, listener, "resp_1")
    played = np.concatenate(out)
    audible = np.flatnonzero(np.abs(played) > 100)
    assert abs((audible[-1] + 1) - rate // 2) <= rate // 200, "half a second, tail included"
    spectrum = np.abs(np.fft.rfft(played[: rate // 2].astype(np.float64)))
    assert abs(np.argmax(spectrum) * 2 - 440) <= 2


def test_a_finished_response_without_audio_reports_nothing(
    playout: Playout, listener: Listener
) -> None:
    playout.play("resp_1", "item_1", np.zeros(0, np.int16), 24000)
    playout.finish("resp_1")
    assert playout.next_frame() is playout.silence
    assert listener.log == []


async def test_clear_stops_before_the_next_frame_and_reports_what_was_heard(
    playout: Playout, listener: Listener, rate: int
) -> None:
    playout.play("resp_1", "item_1", ramp(rate), rate)
    for _ in range(7):
        playout.next_frame()
    playout.clear("resp_1")
    assert playout.next_frame() is playout.silence
    assert listener.log == [("started", "resp_1")], "reported on the next loop turn"
    await asyncio.sleep(0)
    assert listener.log == [("started", "resp_1"), ("cleared", "resp_1", 140)]


async def test_heard_ms_counts_resampled_audio_at_the_playout_rate(
    playout: Playout, listener: Listener
) -> None:
    playout.play("resp_1", "item_1", tone(24000, 1.0), 24000)
    for _ in range(10):
        playout.next_frame()
    playout.clear("resp_1")
    await asyncio.sleep(0)
    assert listener.log[-1] == ("cleared", "resp_1", 200)


async def test_clearing_one_response_keeps_the_next(
    playout: Playout, listener: Listener, rate: int
) -> None:
    frame = rate // 50
    playout.play("resp_1", "item_1", ramp(rate), rate)
    playout.play("resp_2", "item_2", ramp(frame, 7), rate)
    playout.next_frame()
    playout.clear("resp_1")
    playout.clear("resp_unknown")
    assert np.array_equal(playout.next_frame(), ramp(frame, 7))
    await asyncio.sleep(0)
    assert ("cleared", "resp_1", 20) in listener.log
    assert not any(entry[1] == "resp_unknown" for entry in listener.log)


async def test_a_queued_response_cleared_before_it_started_played_nothing(
    playout: Playout, listener: Listener, rate: int
) -> None:
    playout.play("resp_1", "item_1", ramp(100), rate)
    playout.clear("resp_1")
    await asyncio.sleep(0)
    assert listener.log == [("cleared", "resp_1", 0)]
    assert playout.next_frame() is playout.silence


async def test_late_audio_of_a_cleared_response_is_dropped(
    playout: Playout, listener: Listener, rate: int
) -> None:
    playout.play("resp_1", "item_1", ramp(rate), rate)
    playout.next_frame()
    playout.clear("resp_1")
    playout.play("resp_1", "item_1", ramp(rate), rate)
    playout.finish("resp_1")
    assert playout.next_frame() is playout.silence
    await asyncio.sleep(0)
    assert listener.log == [("started", "resp_1"), ("cleared", "resp_1", 20)]


def test_late_audio_of_a_finished_response_is_dropped(
    playout: Playout, listener: Listener, rate: int
) -> None:
    frame = rate // 50
    playout.play("resp_1", "item_1", ramp(frame), rate)
    playout.finish("resp_1")
    playout.play("resp_1", "item_1", ramp(frame, 9), rate)
    assert np.array_equal(playout.next_frame(), ramp(frame))
    playout.play("resp_1", "item_1", ramp(frame, 9), rate)
    assert playout.next_frame() is playout.silence, "played out: it has ended"
    assert listener.log == [("started", "resp_1"), ("stopped", "resp_1")]


def test_queued_audio_is_bounded(clock: Clock, rate: int) -> None:
    playout = Playout(rate, clock=clock, max_queued_s=0.1)
    frame = rate // 50
    playout.play("resp_1", "item_1", ramp(rate), rate)
    playout.finish("resp_1")
    frames = [playout.next_frame() for _ in range(6)]
    assert all(f is not playout.silence for f in frames[:5])
    assert frames[5] is playout.silence, "only 100 ms were kept"
    playout.play("resp_2", "item_2", ramp(frame), rate)
    assert playout.next_frame() is not playout.silence, "room again once it played"


async def test_queued_responses_are_bounded(playout: Playout, listener: Listener) -> None:
    for n in range(MAX_RESPONSES + 1):
        playout.play(f"resp_{n}", "item", ramp(10), playout.rate)
    await asyncio.sleep(0)
    assert listener.log == [("cleared", f"resp_{MAX_RESPONSES}", 0)]


def test_stop_drops_everything_and_reports_nothing(playout: Playout, listener: Listener) -> None:
    playout.play("resp_1", "item_1", ramp(1000), playout.rate)
    playout.stop()
    assert playout.next_frame() is playout.silence
    assert listener.log == []


@pytest.mark.parametrize(
    ("encode", "decode"), [(ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)]
)
def test_8_khz_frames_make_g711_packets(
    clock: Clock,
    encode: Callable[[npt.NDArray[np.int16]], bytes],
    decode: Callable[[bytes], npt.NDArray[np.int16]],
) -> None:
    playout = Playout(8000, clock=clock)
    listener = Listener()
    playout.attach(listener)
    playout.play("resp_1", "item_1", tone(24000, 0.5, hz=400.0), 24000)
    playout.finish("resp_1")
    packets = [encode(frame) for frame in until_stopped(playout, listener, "resp_1")]
    assert {len(p) for p in packets} == {160}, "20 ms of PCMU/PCMA is 160 bytes"
    heard = np.concatenate([decode(p) for p in packets]).astype(np.float64)
    assert len(heard) == 160 * 25
    spectrum = np.abs(np.fft.rfft(heard[:4000]))
    assert abs(np.argmax(spectrum) * 2 - 400) <= 2
    assert np.sqrt(np.mean(heard[:3900] ** 2)) == pytest.approx(8000 / np.sqrt(2), rel=0.05)

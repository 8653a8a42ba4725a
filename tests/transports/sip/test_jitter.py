"""The adaptive jitter buffer on a made-up network: packets with arrival times, 20 ms ticks."""

from __future__ import annotations

import random

import numpy as np
import numpy.typing as npt
import pytest

from hark.transports.sip.jitter import FADE_FRAMES, MAX_PACKETS, JitterBuffer

FRAME = 160
TICK = 0.02


def speech(samples: int, start: int = 0) -> npt.NDArray[np.int16]:
    """Loud, never quiet, and different in every frame: where each sample came from shows."""
    n = np.arange(start, start + samples)
    return (5000 + (n * 37) % 20000).astype(np.int16)


def run(
    buffer: JitterBuffer,
    arrivals: list[tuple[float, int, npt.NDArray[np.int16]]],
    until: float,
    first_tick: float = 0.005,
) -> list[npt.NDArray[np.int16] | None]:
    """Deliver (arrival, timestamp, samples) in arrival order and tick every 20 ms."""
    pending = sorted(arrivals, key=lambda a: a[0])
    frames: list[npt.NDArray[np.int16] | None] = []
    tick = first_tick
    while tick < until:
        while pending and pending[0][0] <= tick:
            arrival, timestamp, pcm = pending.pop(0)
            buffer.put(timestamp, pcm, arrival)
        frames.append(buffer.get(tick))
        tick += TICK
    return frames


def sent(
    count: int, *, base_ts: int = 1000, delay: float = 0.01
) -> list[tuple[float, int, npt.NDArray[np.int16]]]:
    """``count`` 20 ms packets, each arriving ``delay`` after it was sent."""
    return [
        (n * TICK + delay, (base_ts + n * FRAME) % 2**32, speech(FRAME, n * FRAME))
        for n in range(count)
    ]


def audio(frames: list[npt.NDArray[np.int16] | None]) -> npt.NDArray[np.int16]:
    return np.concatenate([f for f in frames if f is not None])


def plays(frames: list[npt.NDArray[np.int16] | None], expected: npt.NDArray[np.int16]) -> bool:
    """Whether ``expected`` comes out whole, sample for sample, somewhere in ``frames``."""
    at = audio(frames).tobytes().find(expected.tobytes())
    return at >= 0 and at % 2 == 0


def test_nothing_comes_out_before_a_packet_and_then_after_the_starting_delay() -> None:
    buffer = JitterBuffer()
    frames = run(buffer, sent(50), until=1.0)
    first = next(i for i, f in enumerate(frames) if f is not None)
    # Sent at 0, arrived at 10 ms, due 40 ms later: the tick at 65 ms is the first after it.
    assert first == 3
    assert all(f is not None for f in frames[first:])
    assert np.array_equal(audio(frames)[: 45 * FRAME], speech(45 * FRAME))
    assert buffer.stats.concealed == buffer.stats.late == 0
    assert buffer.target_delay == pytest.approx(0.04)


def test_reordered_and_duplicated_packets_come_out_in_order_once() -> None:
    packets = sent(50)
    a, b = packets[10], packets[11]
    packets[10], packets[11] = (b[0] + 0.005, a[1], a[2]), (a[0], b[1], b[2])
    packets.append((packets[20][0] + 0.001, packets[20][1], packets[20][2]))
    buffer = JitterBuffer()
    frames = run(buffer, packets, until=1.0)
    assert np.array_equal(audio(frames)[: 45 * FRAME], speech(45 * FRAME))
    assert buffer.stats.duplicates == 1
    assert buffer.stats.concealed == 0


def test_a_lost_frame_is_the_last_one_repeated_and_faded_then_silence() -> None:
    packets = [p for n, p in enumerate(sent(60)) if not 20 <= n < 25]
    buffer = JitterBuffer()
    frames = [f for f in run(buffer, packets, until=1.2) if f is not None]
    last_good = speech(FRAME, 19 * FRAME)
    assert np.array_equal(frames[19], last_good)
    for k in range(FADE_FRAMES):
        concealed = frames[20 + k].astype(np.int32)
        ramp = np.linspace(1 - k / FADE_FRAMES, 1 - (k + 1) / FADE_FRAMES, FRAME, endpoint=False)
        assert np.abs(concealed - last_good * ramp).max() <= 1
    assert not frames[20 + FADE_FRAMES].any() and not frames[24].any()
    assert np.array_equal(frames[25], speech(FRAME, 25 * FRAME))
    assert buffer.stats.concealed == FADE_FRAMES


def test_a_packet_that_comes_after_its_time_is_dropped_and_its_frame_concealed() -> None:
    packets = sent(50)
    arrival, timestamp, pcm = packets[20]
    packets[20] = (arrival + 0.2, timestamp, pcm)
    buffer = JitterBuffer(max_delay=0.06)
    frames = [f for f in run(buffer, packets, until=1.0) if f is not None]
    assert buffer.stats.late == 1
    assert buffer.stats.concealed == 1
    assert not np.array_equal(frames[20], pcm)
    assert np.array_equal(frames[21], speech(FRAME, 21 * FRAME))


def test_the_delay_grows_with_jitter_within_its_bound_and_shrinks_after() -> None:
    rng = random.Random(7)
    packets = [
        (arrival + (rng.uniform(0, 0.08) if n < 250 else 0.0), ts, pcm if n % 10 else pcm // 100)
        for n, (arrival, ts, pcm) in enumerate(sent(1000))
    ]
    buffer = JitterBuffer(min_delay=0.04, max_delay=0.2)
    targets = []
    late_by_half = []
    for half in (5.0, 20.0):
        run(
            buffer,
            [p for p in packets if (p[0] < 5.0) == (half == 5.0)],
            until=half,
            first_tick=0.005 if half == 5.0 else 5.005,
        )
        targets.append(buffer.target_delay)
        late_by_half.append(buffer.stats.late)
    # Up to 80 ms of jitter: the delay covers it (plus a frame) and packets stop being late.
    assert 0.08 <= targets[0] <= 0.2
    assert buffer.stats.inserted >= 1
    # Steady again for 15 s: back to the smallest delay, frames dropped where it is quiet.
    assert targets[1] == pytest.approx(0.04)
    assert buffer.stats.dropped >= 1
    assert late_by_half[1] == late_by_half[0]


def test_the_delay_never_exceeds_its_bound() -> None:
    rng = random.Random(3)
    packets = [(a + rng.uniform(0, 0.5), ts, pcm) for a, ts, pcm in sent(300)]
    buffer = JitterBuffer(min_delay=0.04, max_delay=0.2)
    run(buffer, packets, until=7.0)
    assert buffer.target_delay == pytest.approx(0.2)
    assert buffer.stats.late > 0


def test_timestamps_wrap_around_without_a_glitch() -> None:
    buffer = JitterBuffer()
    frames = run(buffer, sent(50, base_ts=2**32 - 10 * FRAME), until=1.0)
    assert np.array_equal(audio(frames)[: 45 * FRAME], speech(45 * FRAME))
    assert buffer.stats.restarts == 0


def test_30_ms_packets_come_out_as_20_ms_frames() -> None:
    packets = [(n * 0.03 + 0.01, n * 240, speech(240, n * 240)) for n in range(40)]
    buffer = JitterBuffer()
    frames = run(buffer, packets, until=1.2)
    assert all(len(f) == FRAME for f in frames if f is not None)
    assert np.array_equal(audio(frames)[: 50 * FRAME], speech(50 * FRAME))
    assert buffer.stats.concealed == 0


def test_a_jump_in_timestamps_restarts_the_stream() -> None:
    first = sent(25)
    second = [(a + 0.5, (ts + 5_000_000) % 2**32, pcm // 2) for a, ts, pcm in sent(25)]
    buffer = JitterBuffer()
    frames = run(buffer, first + second, until=1.5)
    assert buffer.stats.restarts == 1
    assert buffer.stats.late == 0
    assert plays(frames, speech(25 * FRAME) // 2)


def test_a_sender_that_resets_its_clock_after_a_silence_is_followed() -> None:
    first = sent(25)
    again = [(a + 1.0, ts, pcm // 2) for a, ts, pcm in sent(25)]
    buffer = JitterBuffer()
    frames = run(buffer, first + again, until=2.0)
    assert buffer.stats.restarts == 1
    assert plays(frames, speech(25 * FRAME) // 2)


def test_reset_stops_the_frames_until_packets_come_again() -> None:
    buffer = JitterBuffer()
    run(buffer, sent(10), until=0.3)
    buffer.reset()
    assert not buffer.started
    assert buffer.get(0.31) is None


def test_what_it_holds_is_bounded() -> None:
    buffer = JitterBuffer()
    for n in range(MAX_PACKETS + 50):
        buffer.put(n * 20, speech(20, n * 20), 0.0)
    assert buffer.stats.received == MAX_PACKETS
    assert buffer.stats.overflow == 50

"""The caller's Opus packets to mono PCM at the session's input rate."""

from __future__ import annotations

import numpy as np

from hark.audio.codecs.opus import OpusEncoder
from hark.transports.webrtc.input_audio import InputAudio


def opus_packets(seconds: float, hz: float = 300.0) -> list[bytes]:
    """A tone as the 20 ms Opus packets of a caller's microphone."""
    t = np.arange(int(48000 * seconds)) / 48000
    tone = (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)
    encoder = OpusEncoder(48000, bitrate=32000, complexity=3)
    return [encoder.encode(tone[i : i + 960]) for i in range(0, len(tone), 960)]


def test_audio_follows_the_input_rate_packet_by_packet() -> None:
    packets = opus_packets(3.0)
    rates = iter([24000] * 50 + [8000] * 50 + [44100] * 50)
    got: list[tuple[int, int]] = []
    current = 24000

    def rate() -> int:
        nonlocal current
        current = next(rates)
        return current

    audio = InputAudio(rate, lambda pcm: got.append((current, len(pcm))))
    for n, payload in enumerate(packets):
        audio.packet(1, n, n * 960, payload)
    # Opus decodes at 24 and 8 kHz itself: every packet is 20 ms, nothing held back.
    assert {n for r, n in got if r == 24000} == {480}
    assert {n for r, n in got if r == 8000} == {160}
    # 44.1 kHz is not an Opus rate: decoded at 48 kHz, resampled (soxr holds some back).
    at_44k = sum(n for r, n in got if r == 44100)
    assert 44100 * 0.9 <= at_44k <= 44100
    assert audio.dropped == 0


def test_a_lost_packet_is_concealed_and_a_late_one_dropped() -> None:
    packets = opus_packets(1.0)
    got: list[np.ndarray] = []
    audio = InputAudio(lambda: 16000, got.append)
    order = [*range(10), *range(12, 50), 11]
    for n in order:
        audio.packet(7, n, 1000 + n * 960, packets[n])
    # Packets 10 and 11 are missing when 12 comes: 40 ms of concealment keep the clock;
    # 11 arrives after 12 and is dropped rather than played out of order.
    assert sum(len(pcm) for pcm in got) == 50 * 320
    assert audio.concealed_samples == 2 * 960
    assert audio.dropped == 1
    decoded = np.concatenate(got)
    spectrum = np.abs(np.fft.rfft(decoded[8000:16000].astype(float)))
    assert abs(np.argmax(spectrum) * 2 - 300) <= 4


def test_silence_not_sent_with_dtx_is_filled_and_a_long_gap_is_not() -> None:
    packets = opus_packets(0.2)
    got: list[np.ndarray] = []
    audio = InputAudio(lambda: 24000, got.append)
    audio.packet(7, 100, 0, packets[0])
    # The next packet 400 ms later in RTP time but next in sequence: DTX, not loss.
    audio.packet(7, 101, 960 + 48000 * 2 // 5, packets[1])
    assert sum(len(pcm) for pcm in got) == 2 * 480 + 24000 * 2 // 5
    # A caller back from minutes on hold: the stream goes on without inventing them.
    audio.packet(7, 102, 960 * 2 + 48000 * 2 // 5 + 48000 * 120, packets[2])
    assert sum(len(pcm) for pcm in got) == 3 * 480 + 24000 * 2 // 5


def test_a_second_stream_and_a_repeated_packet_are_not_mixed_in() -> None:
    packets = opus_packets(0.2)
    got: list[np.ndarray] = []
    audio = InputAudio(lambda: 24000, got.append)
    audio.packet(7, 1, 0, packets[0])
    audio.packet(8, 2, 960, packets[1])
    audio.packet(7, 1, 0, packets[0])
    audio.packet(7, 2, 960, packets[1])
    assert [len(pcm) for pcm in got] == [480, 480]
    assert audio.dropped == 2


def test_a_first_packet_that_does_not_decode_leaves_the_stream_open() -> None:
    packets = opus_packets(0.2)
    got: list[np.ndarray] = []
    audio = InputAudio(lambda: 24000, got.append)
    # A payload with an invalid TOC/length layout: libopus refuses it.
    audio.packet(7, 40000, 0, b"\xff\xff")
    audio.packet(7, 40001, 960, packets[0])
    audio.packet(7, 40002, 1920, packets[1])
    assert [len(pcm) for pcm in got] == [480, 480]
    assert audio.dropped == 1

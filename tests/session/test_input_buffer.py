"""The input audio buffer against a plain array kept alongside it."""

from __future__ import annotations

import numpy as np

from hark.session.input_buffer import InputAudioBuffer

RATE = 24000


def test_the_buffer_holds_what_was_appended_through_growth_cuts_and_moves() -> None:
    rng = np.random.default_rng(5)
    buffer = InputAudioBuffer(RATE, start_ms=1000.0)
    reference = np.zeros(0, np.int16)
    start_ms = 1000.0
    for step in range(400):
        # Appends from a few samples to several seconds: the array fills, moves its samples
        # to the front and grows.
        size = int(rng.choice([1, 480, 768, 4800, RATE * 3]))
        pcm = rng.integers(-32768, 32767, size, dtype=np.int16)
        buffer.append(pcm)
        reference = np.concatenate((reference, pcm))
        if step % 7 == 3:
            end = start_ms + len(reference) * 1000 / RATE
            cut_ms = end - 300
            buffer.trim_before(cut_ms)
            cut = round((cut_ms - start_ms) * RATE / 1000)
            if cut_ms - start_ms > 500 and cut > RATE // 2:
                reference = reference[cut:]
                start_ms += cut * 1000 / RATE
        if step % 11 == 5:
            a_ms = start_ms + 10
            b_ms = start_ms + len(reference) * 1000 / RATE / 2
            a, b = round(10 * RATE / 1000), round((b_ms - start_ms) * RATE / 1000)
            peeked = buffer.peek(a_ms, b_ms)
            assert np.array_equal(peeked, reference[a:b])
            taken = buffer.take(a_ms, b_ms)
            assert np.array_equal(taken, reference[a:b])
            reference = reference[b:]
            start_ms += b * 1000 / RATE
        assert buffer.samples == len(reference)
        assert abs(buffer.start_ms - start_ms) < 1e-6
        assert np.array_equal(buffer.peek(start_ms, start_ms + 10**9), reference)
    everything = buffer.take_all()
    assert np.array_equal(everything, reference)
    assert buffer.samples == 0


def test_what_was_handed_out_is_never_written_again() -> None:
    buffer = InputAudioBuffer(RATE)
    buffer.append(np.full(RATE, 7, np.int16))
    peeked = buffer.peek(0, 500)
    taken = buffer.take(0, 500)
    # The array's freed front is reused once later appends move the samples forward.
    for _ in range(20):
        buffer.append(np.full(RATE // 2, -3, np.int16))
    assert (peeked == 7).all() and (taken == 7).all()

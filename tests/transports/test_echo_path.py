"""A call's echo path (``hark.transports.echo.CallEcho``): the 48 kHz playout is the reference
for audio heard at the session's rate, frames the playout skipped count as silence, audio
that waited for its reference is released when it is played, and a canceller that fails
lets the caller be heard as before."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.echo import EchoCanceller
from hark.transports.echo import CallEcho
from tests.audio.test_echo import echo_of, energy, pcm, reply

PLAYOUT_RATE = 48000
RATE = 24000


def test_a_webrtc_call_cancels_at_the_session_rate() -> None:
    far = reply(PLAYOUT_RATE)
    near = pcm(echo_of(reply(RATE), RATE, 150, -6))
    released: list[npt.NDArray[np.int16]] = []
    echo = CallEcho(PLAYOUT_RATE, released.append, lambda: 0)
    out = []
    step, far_step = RATE // 50, PLAYOUT_RATE // 50
    for k in range(len(near) // step):
        out.append(echo.heard(near[k * step : (k + 1) * step], RATE))
        echo.played(far[k * far_step : (k + 1) * far_step], False)
    heard = np.concatenate(out + released)
    assert echo.canceller is not None and echo.canceller.rate == RATE
    tail = slice(len(heard) - 3 * RATE, len(heard))
    erle_db = 10 * np.log10(energy(near[tail]) / energy(heard[tail]))
    assert erle_db >= 20, erle_db


def test_skipped_frames_reach_the_reference_as_silence() -> None:
    skipped = [0]
    echo = CallEcho(PLAYOUT_RATE, lambda pcm: None, lambda: skipped[0])
    echo.heard(np.zeros(RATE // 50, np.int16), RATE)
    canceller = echo.canceller
    assert canceller is not None
    before = canceller._played
    skipped[0] = 5
    echo.played(np.zeros(PLAYOUT_RATE // 50, np.int16), True)
    assert canceller._played - before == 6 * RATE // 50


def test_a_failing_canceller_lets_the_caller_through(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: EchoCanceller, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        raise RuntimeError("broken")

    monkeypatch.setattr(EchoCanceller, "heard", broken)
    echo = CallEcho(PLAYOUT_RATE, lambda pcm: None, lambda: 0)
    voice = np.arange(RATE // 50, dtype=np.int16)
    assert np.array_equal(echo.heard(voice, RATE), voice)
    assert echo.failed
    echo.played(np.ones(PLAYOUT_RATE // 50, np.int16), False)
    assert np.array_equal(echo.heard(voice, RATE), voice)

"""``hark bench echo``'s room: the reply comes out on the microphone's clock ``delay_ms``
after it was played, through the room's response, ``gain_db`` quieter, and the figures are
summed as the bench prints them."""

from __future__ import annotations

import numpy as np

from hark.bench.echo import EchoReport, Room, Trial, room_response
from hark.transports.webrtc.playout import FRAME_SAMPLES, PLAYOUT_RATE


def test_the_echo_comes_out_late_quieter_and_through_the_room() -> None:
    room = Room(100, -6.0)
    delay = PLAYOUT_RATE // 10
    click = np.zeros(FRAME_SAMPLES, np.int16)
    click[0] = 10000
    mic = []
    for k in range(40):
        if k == 0:
            room.heard(click, pts=123456)
        elif k < 20:
            room.heard(np.zeros(FRAME_SAMPLES, np.int16), pts=123456 + k * FRAME_SAMPLES)
        mic.append(room.echo(k * FRAME_SAMPLES, FRAME_SAMPLES))
    heard = np.concatenate(mic)
    assert not heard[:delay].any()
    expected = 10000 * 10 ** (-6 / 20) * room_response(PLAYOUT_RATE)
    tail = len(expected)
    assert np.allclose(heard[delay : delay + tail], expected, atol=1e-6)
    assert np.allclose(heard[delay + tail :], 0.0, atol=1e-6)


def test_a_gap_in_the_reply_stays_a_gap() -> None:
    """A server that skipped frames (a stall): the frames after the gap keep their place."""
    room = Room(0, 0.0)
    tone = np.full(FRAME_SAMPLES, 1000, np.int16)
    room.heard(tone, pts=0)
    room.heard(tone, pts=5 * FRAME_SAMPLES)
    mic = np.concatenate([room.echo(k * FRAME_SAMPLES, FRAME_SAMPLES) for k in range(8)])
    energy = [
        float(np.sum(mic[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES] ** 2)) for k in range(8)
    ]
    assert energy[0] > 0 and energy[5] > 0
    assert energy[5] > 10 * energy[4]


def test_the_summary_counts_self_interruptions_and_barge_ins() -> None:
    report = EchoReport("on")
    report.trials = [
        Trial(50, -6.0, barge_in=False, status="completed", self_interrupted=False),
        Trial(50, -6.0, barge_in=False, status="cancelled", self_interrupted=True),
        Trial(50, -6.0, barge_in=True, status="cancelled", self_interrupted=False, detected_ms=200),
        Trial(50, -6.0, barge_in=True, status="completed", self_interrupted=False),
    ]
    summary = report.summary()
    assert summary["self_interruptions"] == 1
    assert summary["echo_replies"] == 2
    assert summary["barge_ins_heard"] == 1
    assert summary["detected_p50_ms"] == 200

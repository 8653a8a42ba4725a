"""``hark bench turns --backchannels``: its scoring, on hand-made outcomes."""

from __future__ import annotations

import numpy as np

from hark.bench.backchannels import (
    BACKCHANNELS,
    INTERRUPTIONS,
    QUIET_FRAMES,
    Outcome,
    _Phone,
    _quiet_after,
    figures,
    session,
    summary,
)
from hark.bench.echo import heard_as
from hark.bench.spoken_questions import RATE
from hark.session.backchannel import judge_words


def outcome(backchannel: bool, heard_ms: float | None, status: str = "completed") -> Outcome:
    return Outcome("webrtc", "x", "v", backchannel, heard_ms, status, heard_ms is not None)


def test_false_barge_ins_misses_and_stop_latency() -> None:
    found = figures(
        [
            outcome(True, None),
            outcome(True, None),
            outcome(True, 900.0),
            # A reply cancelled without speech_started is a barge-in too.
            outcome(True, None, "cancelled"),
            outcome(False, 100.0),
            outcome(False, 300.0),
            outcome(False, None),
        ]
    )
    assert found["backchannels"] == 4
    assert found["false_barge_ins"] == 2
    assert found["false_barge_in_rate"] == 0.5
    assert found["interruptions"] == 3
    assert found["missed"] == 1
    assert found["stop_p50_ms"] == 200.0
    assert found["stop_max_ms"] == 300.0
    report = {"backchannels_on": True, "figures": {"webrtc": found}}
    assert "false barge-ins 2/4" in summary(report)


def test_the_fixtures_are_what_the_policy_means_by_them() -> None:
    assert all(judge_words(text) == "backchannel" for text in BACKCHANNELS)
    assert all(judge_words(text) == "interruption" for text in INTERRUPTIONS)
    detection = session(True)["audio"]["input"]["turn_detection"]
    assert detection["type"] == "semantic_vad" and detection["hark_backchannels"] is True


def test_the_hold_is_the_first_run_of_quiet_frames_after_the_onset() -> None:
    # (arrival, audible) every 20 ms: audible until 1.0 s, quiet for 12 frames, audible again.
    frames = [(i * 0.02, not 50 <= i < 62) for i in range(80)]
    # Quiet frames before the onset do not count.
    frames[10] = (0.2, False)
    silenced, quiet = _quiet_after(frames, onset=0.9)
    assert silenced == 100.0
    assert quiet == 240.0
    # Fewer than QUIET_FRAMES quiet frames in a row are a pause in the reply, not a hold.
    short = [(i * 0.02, not 50 <= i < 50 + QUIET_FRAMES - 1) for i in range(80)]
    assert _quiet_after(short, onset=0.9) == (None, None)
    # Quiet to the end of the trial: held, and not resumed.
    assert _quiet_after([(i * 0.02, i < 50) for i in range(80)], onset=0.9) == (100.0, None)
    assert _quiet_after(frames, onset=None) == (None, None)


async def test_the_phone_says_a_fixture_at_8_khz_and_times_its_first_packet() -> None:
    phone = _Phone(("127.0.0.1", 9))
    await phone.open()
    try:
        pcm = (np.sin(np.arange(RATE) * 2 * np.pi * 440 / RATE) * 8000).astype(np.int16)
        phone.play("r", "", pcm, RATE)
        # One second at 24 kHz is fifty 20 ms frames at 8 kHz, queued for the microphone.
        assert phone.saying and len(phone._speech) == 50
        # No call yet: a tick sends nothing, so nothing has been said.
        phone.tick(0.0)
        assert phone.onset_at is None and len(phone._speech) == 50
        # In a call (its RTP peer known), the first packet sent is the onset.
        phone._rtp_remote = ("127.0.0.1", 9)
        phone.tick(0.0)
        assert phone.onset_at is not None and len(phone._speech) == 49
        onset = phone.onset_at
        phone.tick(0.02)
        assert phone.onset_at == onset
    finally:
        phone.close()


def test_what_the_server_heard_is_told_for_each_misjudged_trial() -> None:
    passed = [{"type": "hark.backchannel", "transcript": "Great."}]
    turned = [
        {"type": "input_audio_buffer.speech_started"},
        {"type": "conversation.item.input_audio_transcription.completed", "transcript": "and"},
    ]
    assert heard_as(passed) == "Great."
    assert heard_as(turned) == "and"
    assert heard_as([{"type": "response.done"}]) is None
    assert heard_as([*passed, {"type": "hark.backchannel", "transcript": ""}]) == "Great. | "
    missed = Outcome("sip", "Wait.", "gb", False, None, "completed", False, heard_as="Great.")
    false = Outcome("webrtc", "Mm-hmm.", "gb", True, 800.0, "cancelled", True, heard_as="and")
    right = Outcome("webrtc", "Yeah.", "gb", True, None, "completed", False, heard_as="Yeah.")
    outcomes = [missed, false, right]
    report = {
        "backchannels_on": True,
        "figures": {"webrtc": figures(outcomes)},
        "outcomes": [{**vars(o), "barged_in": o.barged_in} for o in outcomes],
    }
    text = summary(report)
    assert "misjudged interruption over sip: gb said 'Wait.', the server heard 'Great.'" in text
    assert "misjudged backchannel over webrtc: gb said 'Mm-hmm.', the server heard 'and'" in text
    assert "'Yeah.'" not in text
    assert session(True)["include"] == ["hark.backchannels"]

"""``hark bench turns --backchannels``: its scoring, on hand-made outcomes."""

from __future__ import annotations

from hark.bench.backchannels import BACKCHANNELS, INTERRUPTIONS, Outcome, figures, session, summary
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

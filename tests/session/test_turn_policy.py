"""Turn policy: server_vad and semantic_vad answer the core's questions, and semantic_vad's
silence curve."""

from __future__ import annotations

import itertools
import math

import pytest

from hark.engines.turn.evaluation import MID_SENTENCE_PAUSE_MS
from hark.protocol.session_config import SemanticVad, ServerVad
from hark.session.turn_policy import (
    CURVE_END_MS,
    END_FAST_PROBABILITY,
    MAX_SILENCE_MS,
    MIN_SILENCE_MS,
    SEMANTIC_SPECULATE_AFTER_MS,
    SILENCE_TIMER_MS,
    SPECULATE_AFTER_MS,
    SemanticVadPolicy,
    ServerVadPolicy,
    silence_for,
    turn_policy,
    unjudged_silence_ms,
)


def survives_mid_sentence_pause(probability: float) -> bool:
    """Whether eagerness auto waits out the issue's 1.2 s pause after this judgement."""
    return silence_for(probability, "auto") > MID_SENTENCE_PAUSE_MS


def test_server_vad_is_its_config_and_a_fixed_window() -> None:
    config = ServerVad(
        threshold=0.7, prefix_padding_ms=200, silence_duration_ms=650, idle_timeout_ms=5000
    )
    policy = turn_policy(config)
    assert isinstance(policy, ServerVadPolicy)
    assert (policy.threshold, policy.prefix_padding_ms, policy.silence_ms) == (0.7, 200, 650)
    assert policy.idle_timeout_ms == 5000
    assert not policy.scores_turns
    assert policy.speculate_after_ms == SPECULATE_AFTER_MS
    assert policy.silence_after(0.0) == policy.silence_after(1.0) == 650


def test_semantic_vad_waits_no_longer_than_the_silence_timer_until_judged() -> None:
    policy = turn_policy(SemanticVad(eagerness="high", interrupt_response=False))
    assert isinstance(policy, SemanticVadPolicy)
    assert policy.silence_ms == SILENCE_TIMER_MS == ServerVad().silence_duration_ms
    assert policy.scores_turns and not policy.interrupt_response
    assert policy.speculate_after_ms == SEMANTIC_SPECULATE_AFTER_MS
    assert policy.idle_timeout_ms is None
    assert policy.silence_after(0.9) == silence_for(0.9, "high") < policy.silence_ms
    assert policy.silence_after(0.2) > policy.silence_ms


def test_no_turn_detection_no_policy() -> None:
    assert turn_policy(None) is None


@pytest.mark.parametrize("eagerness", ["low", "medium", "high", "auto"])
def test_silence_falls_from_the_cap_to_the_floor(eagerness: str) -> None:
    waits = [silence_for(p / 100, eagerness) for p in range(101)]
    assert waits[0] == MAX_SILENCE_MS[eagerness]
    assert waits[-1] == MIN_SILENCE_MS[eagerness]
    assert all(a >= b for a, b in itertools.pairwise(waits))
    assert waits[0] > waits[50] > waits[-1]


def test_low_eagerness_never_ends_a_turn_fast() -> None:
    # However finished the words sound, low waits out a pause of 800 ms; the other
    # eagerness values end a clearly finished turn after the curve's end.
    assert silence_for(1.0, "low") == silence_for(END_FAST_PROBABILITY, "low") == 800
    assert silence_for(0.5, "low") == unjudged_silence_ms("low") > 800
    for eagerness in ("medium", "high", "auto"):
        assert silence_for(1.0, eagerness) == CURVE_END_MS


def test_silence_caps_by_eagerness() -> None:
    assert [silence_for(0.0, e) for e in ("low", "medium", "high", "auto")] == [
        8000,
        4000,
        2000,
        4000,
    ]


def test_silence_clamps_odd_probabilities() -> None:
    assert silence_for(-0.5, "auto") == MAX_SILENCE_MS["auto"]
    assert silence_for(1.7, "auto") == MIN_SILENCE_MS["auto"]
    assert silence_for(math.nan, "high") == MAX_SILENCE_MS["high"]


def test_silence_rejects_unknown_eagerness() -> None:
    with pytest.raises(ValueError, match="eagerness"):
        silence_for(0.5, "eager")


def test_likely_complete_ends_fast_and_unlikely_outlasts_a_long_pause() -> None:
    assert silence_for(END_FAST_PROBABILITY, "auto") <= 320
    assert survives_mid_sentence_pause(0.4)
    assert not survives_mid_sentence_pause(0.5)


def test_an_unjudged_pause_waits_the_timer_or_low_eagerness_a_neutral_verdict() -> None:
    for eagerness in ("high", "medium", "auto"):
        assert unjudged_silence_ms(eagerness) == SILENCE_TIMER_MS
    assert unjudged_silence_ms("low") == silence_for(0.5, "low") < MAX_SILENCE_MS["low"]
    with pytest.raises(ValueError, match="eagerness"):
        unjudged_silence_ms("eager")

"""Speculative recognition and replies while the end of a turn is waited out."""

from __future__ import annotations

import dataclasses

import pytest

from hark.engines.asr import Urgency
from hark.session.actions import (
    AdoptSpeculation,
    DiscardSpeculation,
    Generate,
    ScoreTurn,
    Speculate,
)
from hark.session.results import Recognised, TurnScored, TurnScoreFailed
from hark.session.turn_policy import SILENCE_TIMER_MS, silence_for, unjudged_silence_ms

from .conftest import Driver, silence, timed, voiced


def semantic(driver: Driver, eagerness: str = "auto") -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "semantic_vad", "eagerness": eagerness}}
                }
            },
        }
    )


def test_reply_is_speculated_during_the_pause_and_adopted_at_turn_end(driver: Driver) -> None:
    driver.asr_text = "What is the capital of France?"
    driver.append(silence(300))
    driver.append(voiced(800))
    # 200 ms into the pause: recognised and a reply speculated, nothing visible yet.
    new = driver.append(silence(200))
    assert driver.types(new) == []
    (speculate,) = driver.take(Speculate)
    assert speculate.generate.response_id == ""
    assert speculate.generate.request.messages[-1].content == "What is the capital of France?"
    driver.append(silence(400))
    assert "input_audio_buffer.speech_stopped" in driver.types()
    # The committed item's transcript was known already: one recognition in all.
    assert len(driver.steps(Urgency.SPECULATION, Urgency.ANSWER)) == 1
    (adopt,) = driver.take(AdoptSpeculation)
    assert adopt.key == speculate.key
    created = next(e for e in driver.events if e["type"] == "response.created")
    assert adopt.response_id == created["response"]["id"]
    assert not driver.take(DiscardSpeculation)


def test_a_turn_that_differs_from_the_speculation_gets_a_fresh_generation(
    driver: Driver,
) -> None:
    driver.asr_text = "What is the capital of France?"
    driver.append(voiced(800))
    driver.append(silence(200))
    (speculate,) = driver.take(Speculate)
    # The instructions change while the end of the turn is waited out: the speculated reply
    # answers under the old ones.
    driver.send({"type": "session.update", "session": {"instructions": "Answer in French."}})
    driver.append(silence(400))
    assert not driver.take(AdoptSpeculation)
    (discard,) = driver.take(DiscardSpeculation)
    assert discard.key == speculate.key
    (generate,) = driver.take(Generate)
    assert generate.response_id.startswith("resp_")
    assert generate.request.messages[0].content == "Answer in French."
    assert dataclasses.replace(generate, response_id="") != speculate.generate


def stopped_at(driver: Driver) -> list[int]:
    """Where the turns ended so far (``speech_stopped``'s ``audio_end_ms``)."""
    return [
        e["audio_end_ms"] for e in driver.events if e["type"] == "input_audio_buffer.speech_stopped"
    ]


def test_the_verdict_is_asked_before_the_reply_is_speculated(driver: Driver) -> None:
    semantic(driver)
    driver.asr_text = "What is the capital of France?"
    driver.append(voiced(800))
    driver.append(silence(64))
    # The verdict decides when the turn ends; the reply is only speculative until then: the
    # verdict goes out first, and is not held back for the reply to read its prompt.
    kinds = [type(a) for a in driver.actions if isinstance(a, ScoreTurn | Speculate)]
    assert kinds == [ScoreTurn, Speculate]
    (score,) = driver.take(ScoreTurn)
    (speculate,) = driver.take(Speculate)
    assert score.key == speculate.key
    # No timer waits on the reply.
    assert driver.session.next_deadline() == driver.session.expires_at


def test_the_pause_that_decides_goes_before_captions(driver: Driver) -> None:
    driver.asr_text = "What is the capital of France?"
    driver.append(voiced(800))
    driver.append(silence(200))
    # server_vad: the pause's recognition is only speculation, after everybody's captions.
    assert [s.request.urgency for s in driver.steps(Urgency.SPECULATION)] == [Urgency.SPECULATION]
    driver.append(silence(600))
    semantic(driver)
    driver.append(voiced(800))
    driver.append(silence(64))
    # semantic_vad: its words decide whether the turn ends; only a listener's words go first.
    assert len(driver.steps(Urgency.DECISION)) == 1
    assert Urgency.ANSWER < Urgency.DECISION < Urgency.CAPTION < Urgency.SPECULATION


def test_an_unjudged_pause_ends_no_later_than_the_silence_timer(driver: Driver) -> None:
    semantic(driver)
    driver.asr_text = "What is the capital of France?"
    # The end-of-turn model is too busy to answer: the verdict never comes.
    driver.append(voiced(800))
    driver.append(silence(SILENCE_TIMER_MS - 64))
    (score,) = driver.take(ScoreTurn)
    assert stopped_at(driver) == []
    driver.append(silence(160))
    # As server_vad's default would: 500 ms of silence after the voice (a VAD chunk's grain).
    (end,) = stopped_at(driver)
    assert 800 + SILENCE_TIMER_MS <= end < 800 + SILENCE_TIMER_MS + 64
    # The verdict that comes after the turn ended changes nothing.
    driver.session.handle(TurnScored(score.key, 0.01), now=driver.now)
    driver.pump()
    driver.append(silence(2000))
    assert len(stopped_at(driver)) == 1


@pytest.mark.parametrize(
    ("eagerness", "fallback_ms"), [("high", 500), ("auto", 500), ("medium", 500), ("low", 1265)]
)
def test_the_fallback_for_each_eagerness(driver: Driver, eagerness: str, fallback_ms: int) -> None:
    assert unjudged_silence_ms(eagerness) == fallback_ms
    semantic(driver, eagerness)
    driver.asr_text = "I would like to"
    driver.append(voiced(800))
    driver.append(silence(fallback_ms - 64))
    assert stopped_at(driver) == []
    driver.append(silence(96))
    assert len(stopped_at(driver)) == 1


def judged_after_200_ms(driver: Driver, eagerness: str, text: str, probability: float) -> None:
    """``text`` is judged complete with ``probability`` 200 ms into its pause: the turn ends
    on the silence that verdict asks for (``silence_for``), not a chunk sooner."""
    semantic(driver, eagerness)
    driver.asr_text = text
    driver.append(voiced(800))
    driver.append(silence(200))
    (score,) = driver.take(ScoreTurn)
    driver.session.handle(TurnScored(score.key, probability), now=driver.now)
    driver.pump()
    driver.append(silence(silence_for(probability, eagerness) - 200 - 64))
    assert stopped_at(driver) == []
    driver.append(silence(96))
    assert len(stopped_at(driver)) == 1


def test_a_verdict_before_the_timer_may_wait_longer(driver: Driver) -> None:
    # Judged unfinished while the timer still ran: the pause may last what the verdict says.
    judged_after_200_ms(driver, "auto", "My phone number is four one five", 0.1)


def test_a_failed_verdict_ends_the_pause_as_an_unjudged_one(driver: Driver) -> None:
    semantic(driver)
    driver.asr_text = "What is the capital of France?"
    driver.append(voiced(800))
    driver.append(silence(32))
    (score,) = driver.take(ScoreTurn)
    driver.session.handle(TurnScoreFailed(score.key), now=driver.now)
    driver.pump()
    driver.append(silence(SILENCE_TIMER_MS - 96))
    assert stopped_at(driver) == []
    driver.append(silence(96))
    assert len(stopped_at(driver)) == 1


def test_low_eagerness_waits_out_a_short_pause_however_finished_it_sounds(
    driver: Driver,
) -> None:
    # Certain it is finished: the turn still ends only on low's shortest silence, 800 ms.
    judged_after_200_ms(driver, "low", "I'd like a large pizza.", 1.0)


def test_a_verdict_asking_less_than_has_passed_ends_the_turn_at_once(driver: Driver) -> None:
    semantic(driver, "low")
    driver.asr_text = "What is the capital of France?"
    driver.append(voiced(800))
    driver.append(silence(1000))
    (score,) = driver.take(ScoreTurn)
    assert stopped_at(driver) == []
    # Low eagerness waits 1.3 s unjudged; a verdict of 0.9 (wait 800 ms, low's shortest)
    # has passed.
    driver.session.handle(TurnScored(score.key, 0.9), now=driver.now)
    driver.pump()
    assert len(stopped_at(driver)) == 1


def test_speculation_is_discarded_when_the_user_goes_on(driver: Driver) -> None:
    driver.asr_text = "My phone number is"
    driver.append(voiced(800))
    driver.append(silence(300))
    (speculate,) = driver.take(Speculate)
    new = driver.append(voiced(400))
    assert "input_audio_buffer.speech_started" not in driver.types(new)
    (discard,) = driver.take(DiscardSpeculation)
    assert discard.key == speculate.key
    driver.asr_text = "My phone number is four one five"
    driver.append(silence(600))
    (second,) = driver.take(Speculate)
    assert second.key != speculate.key
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].content == "My phone number is four one five"


def test_recognition_in_flight_at_turn_end_becomes_the_items(driver: Driver) -> None:
    driver.append(voiced(800))
    driver.append(silence(600))
    (pending,) = driver.steps(Urgency.SPECULATION)
    assert not driver.take(Speculate)
    assert "response.created" in driver.types()
    driver.session.handle(Recognised(pending.request_id, timed("Hello there", 0.8)), now=driver.now)
    driver.pump()
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].content == "Hello there"
    assert not driver.steps(Urgency.ANSWER)


def test_no_speculative_reply_without_create_response(driver: Driver) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "create_response": False}}
                }
            },
        }
    )
    driver.asr_text = "Hello"
    driver.append(voiced(600))
    driver.append(silence(700))
    assert not driver.take(Speculate)
    assert "input_audio_buffer.committed" in driver.types()


def test_semantic_vad_ends_a_complete_utterance_quickly(driver: Driver) -> None:
    semantic(driver)
    driver.asr_text = "What is the capital of France?"
    driver.turn_score = 0.95
    driver.append(voiced(800))
    driver.append(silence(400))
    (score,) = driver.take(ScoreTurn)
    assert score.transcript == "What is the capital of France?"
    stopped = [e for e in driver.events if e["type"] == "input_audio_buffer.speech_stopped"]
    assert len(stopped) == 1
    # Speech ended at 800 ms; the judgement came at the pause's recognition (~160 ms) and asks
    # for about 200 ms of silence.
    assert 990 <= stopped[0]["audio_end_ms"] <= 1100


def silence_until_recognition(driver: Driver) -> int:
    """Append silence 32 ms at a time until the pause is sent to recognition; how much."""
    waited = 0
    while not driver.steps(Urgency.SPECULATION, Urgency.DECISION):
        driver.append(silence(32))
        waited += 32
        assert waited < 2000
    return waited


def test_semantic_vad_recognises_a_pause_at_once(driver: Driver) -> None:
    driver.asr_text = "What is the capital of France?"
    driver.append(voiced(800))
    server = silence_until_recognition(driver)
    driver.append(silence(600))
    semantic(driver)
    driver.turn_score = 0.0
    driver.append(voiced(800))
    at_once = silence_until_recognition(driver)
    # server_vad lets a pause last SPECULATE_AFTER_MS (96) before transcribing it, since
    # most short gaps are between words; semantic_vad needs the words to end the turn at all.
    assert server - at_once == 64


def test_semantic_vad_waits_through_an_unfinished_utterance(driver: Driver) -> None:
    semantic(driver)
    driver.asr_text = "My phone number is four one five"
    driver.turn_score = 0.05
    driver.append(voiced(1500))
    driver.append(silence(1200))
    assert "input_audio_buffer.speech_stopped" not in driver.types()
    driver.take(DiscardSpeculation)
    driver.append(voiced(1500))
    assert driver.take(DiscardSpeculation)
    driver.asr_text = "My phone number is four one five, five five five, one two three four."
    driver.turn_score = 0.9
    driver.append(silence(700))
    assert driver.types().count("input_audio_buffer.speech_stopped") == 1
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].content.endswith("one two three four.")


def test_semantic_eagerness_caps_the_wait(driver: Driver) -> None:
    semantic(driver, "high")
    driver.asr_text = "so um"
    driver.turn_score = 0.0
    driver.append(voiced(600))
    driver.append(silence(1900))
    assert "input_audio_buffer.speech_stopped" not in driver.types()
    driver.append(silence(200))
    assert "input_audio_buffer.speech_stopped" in driver.types()


def test_the_llm_reads_the_conversation_ahead_of_the_next_turn(driver: Driver) -> None:
    from hark.session.actions import Prefill

    assert len(driver.take(Prefill)) == 1  # at session start
    driver.asr_text = "What is the capital of France?"
    driver.append(voiced(800))
    driver.append(silence(700))
    (generate,) = driver.take(Generate)
    driver.speak_reply(generate, ["Paris."])
    (prefill,) = driver.take(Prefill)
    # The next turn's prompt begins with exactly these messages.
    assert [m.content for m in prefill.request.messages[1:]] == [
        "What is the capital of France?",
        "Paris.",
    ]
    assert prefill.request.messages[0] == generate.request.messages[0]

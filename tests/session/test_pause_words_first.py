"""A pause that decides the turn's end (``semantic_vad``) is judged and replied to on its
words as soon as they are known, before their times; the times commit them after."""

from __future__ import annotations

import math

import pytest

from hark.engines.asr import Urgency
from hark.session.actions import (
    AdoptSpeculation,
    CancelRecognition,
    DiscardSpeculation,
    Recognise,
    ScoreTurn,
    Speculate,
)
from hark.session.recognition import LOGPROBS_INCLUDE
from hark.session.results import Recognised, RecognisedText, TranscriptionFailed, TurnScored

from .conftest import Driver, silence
from .test_recognition import COMPLETED, configure, say, speak

FAILED = "conversation.item.input_audio_transcription.failed"
# What ``say`` hears in the pause 1.5 s into the turn: the words said whole by then.
HEARD = "one two three four"


def paused(driver: Driver, *, semantic: bool = True) -> Recognise:
    """A turn of 1.2 s of speech after 0.3 s of silence, captioned, now in a pause: its
    pause step."""
    detection = {"type": "semantic_vad" if semantic else "server_vad"}
    configure(driver, include=[LOGPROBS_INCLUDE], audio={"input": {"turn_detection": detection}})
    driver.append(silence(300))
    speak(driver, 1200)
    driver.append(silence(200 if not semantic else 64))
    (step,) = driver.steps(Urgency.DECISION if semantic else Urgency.SPECULATION)
    return step


def words_first(driver: Driver, step: Recognise, text: str | None = None) -> None:
    words = tuple(word.word for word in say(step).words) if text is None else tuple(text.split())
    driver.session.handle(RecognisedText(step.request_id, words), now=driver.now)
    driver.pump()


def timed(driver: Driver, step: Recognise) -> None:
    driver.session.handle(Recognised(step.request_id, say(step)), now=driver.now)
    driver.pump()


def end_turn(driver: Driver, score: ScoreTurn) -> None:
    driver.session.handle(TurnScored(score.key, 0.95), now=driver.now)
    driver.append(silence(400))
    assert "input_audio_buffer.committed" in driver.types()


def completed(driver: Driver) -> dict[str, object]:
    (event,) = [e for e in driver.events if e["type"] == COMPLETED]
    return event


def test_the_verdict_and_the_reply_come_from_the_words_once(driver: Driver) -> None:
    step = paused(driver)
    assert step.text_first
    words_first(driver, step)
    (score,) = driver.take(ScoreTurn)
    assert score.transcript == HEARD
    (speculate,) = driver.take(Speculate)
    assert speculate.generate.request.messages[-1].content == HEARD
    assert COMPLETED not in driver.types()
    # Their times add nothing to judge: the same words are not judged or replied to again.
    timed(driver, step)
    assert not driver.take(ScoreTurn) and not driver.take(Speculate)
    end_turn(driver, score)
    # The times commit the words: the transcript and its logprobs are the timed words', and
    # no final step decodes the turn again.
    event = completed(driver)
    assert event["transcript"] == HEARD
    logprobs = event["logprobs"]
    assert isinstance(logprobs, list) and len(logprobs) == 4
    assert all(entry["logprob"] == pytest.approx(math.log(0.5)) for entry in logprobs)
    assert not driver.steps(Urgency.ANSWER)
    (adopt,) = driver.take(AdoptSpeculation)
    assert adopt.key == speculate.key


def test_a_turn_that_ends_before_the_times_is_answered_on_its_words(driver: Driver) -> None:
    step = paused(driver)
    words_first(driver, step)
    (score,) = driver.take(ScoreTurn)
    (speculate,) = driver.take(Speculate)
    end_turn(driver, score)
    # The words are the turn's: the reply speculated on them is the response at once, and
    # no final step decodes the turn again. Only the transcript waits for the times.
    (adopt,) = driver.take(AdoptSpeculation)
    assert adopt.key == speculate.key
    assert COMPLETED not in driver.types()
    assert not driver.steps(Urgency.ANSWER) and not driver.take(CancelRecognition)
    timed(driver, step)
    event = completed(driver)
    assert event["transcript"] == HEARD
    assert isinstance(event["logprobs"], list) and len(event["logprobs"]) == 4
    assert not driver.take(ScoreTurn) and not driver.take(AdoptSpeculation)
    assert driver.types().count(COMPLETED) == 1


def test_the_times_of_an_answered_turn_name_the_words_they_time(driver: Driver) -> None:
    step = paused(driver)
    words_first(driver, step, "one two three for")
    (score,) = driver.take(ScoreTurn)
    (speculate,) = driver.take(Speculate)
    assert speculate.generate.request.messages[-1].content == "one two three for"
    end_turn(driver, score)
    (adopt,) = driver.take(AdoptSpeculation)
    assert adopt.key == speculate.key
    timed(driver, step)
    # The reply read the words it was given; the transcript is what the times say, and the
    # turn is not judged or answered again.
    assert completed(driver)["transcript"] == HEARD
    assert not driver.take(ScoreTurn) and not driver.take(Speculate)
    assert not driver.take(AdoptSpeculation)


def test_a_speaker_who_goes_on_before_the_times_forgets_the_step(driver: Driver) -> None:
    step = paused(driver)
    words_first(driver, step)
    (speculate,) = driver.take(Speculate)
    speak(driver, 100, answer=False)
    (cancel,) = driver.take(CancelRecognition)
    assert cancel.request_id == step.request_id
    (discard,) = driver.take(DiscardSpeculation)
    assert discard.key == speculate.key
    # Their late times change nothing.
    driver.take(ScoreTurn)
    before = len(driver.events)
    timed(driver, step)
    assert len(driver.events) == before
    assert not driver.take(ScoreTurn) and not driver.take(Speculate)


def test_times_that_fail_in_the_pause_leave_the_turn_to_a_final_step(driver: Driver) -> None:
    step = paused(driver)
    words_first(driver, step)
    (score,) = driver.take(ScoreTurn)
    driver.session.handle(TranscriptionFailed(step.request_id, "engine down"), now=driver.now)
    driver.pump()
    end_turn(driver, score)
    (final,) = driver.steps(Urgency.ANSWER)
    driver.session.handle(Recognised(final.request_id, say(final)), now=driver.now)
    driver.pump()
    # ``say`` hears a word more in the longer window.
    assert completed(driver)["transcript"] == HEARD + " five"


def test_times_that_fail_after_the_turn_ended_leave_it_its_words(driver: Driver) -> None:
    step = paused(driver)
    words_first(driver, step)
    (score,) = driver.take(ScoreTurn)
    end_turn(driver, score)
    assert driver.take(AdoptSpeculation)
    driver.session.handle(TranscriptionFailed(step.request_id, "engine down"), now=driver.now)
    driver.pump()
    # Only the times failed: the words the reply read are the transcript, without logprobs.
    assert FAILED not in driver.types()
    event = completed(driver)
    assert event["transcript"] == HEARD
    assert event.get("logprobs") is None


def test_the_timed_words_are_the_transcript_when_they_differ(driver: Driver) -> None:
    step = paused(driver)
    words_first(driver, step, "one two three for")
    (first,) = driver.take(ScoreTurn)
    assert first.transcript == "one two three for"
    driver.take(Speculate)
    timed(driver, step)
    # Judged and replied to again, on the words the item will have.
    (second,) = driver.take(ScoreTurn)
    assert second.transcript == HEARD
    (speculate,) = driver.take(Speculate)
    assert speculate.generate.request.messages[-1].content == HEARD
    end_turn(driver, second)
    assert completed(driver)["transcript"] == HEARD
    assert driver.take(AdoptSpeculation)


def test_a_pause_that_only_speculates_waits_for_the_times(driver: Driver) -> None:
    step = paused(driver, semantic=False)
    assert not step.text_first

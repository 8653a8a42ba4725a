"""Incremental recognition in the core, with scripted results on the sample clock."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.resample import resample
from hark.engines.asr import TimedSegment, TimedTranscript, TimedWord, Urgency
from hark.session.actions import CancelRecognition, Generate, Prefill, Recognise, Speculate
from hark.session.recognition import PREFILL_EVERY_S, _TurnAudio
from hark.session.results import Recognised, TranscriptionFailed

from .conftest import ASR_RATE, Driver, silence, voiced

# What the speaker says: ten words, 0.29 s each, from 0.3 s into the turn.
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
FIRST_S = 0.3
PER_WORD_S = 0.29
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


def say(step: Recognise, first_s: float = FIRST_S) -> TimedTranscript:
    """The speaker's words heard in a step's window (which starts at the turn's start: the
    turns here are short), those the window holds whole."""
    end = len(step.request.audio) / ASR_RATE
    words = tuple(
        TimedWord(f" {w}", first_s + i * PER_WORD_S, first_s + (i + 1) * PER_WORD_S, 0.5)
        for i, w in enumerate(WORDS)
        if first_s + (i + 1) * PER_WORD_S <= end
    )
    text = " ".join(w.word.strip() for w in words)
    return TimedTranscript((TimedSegment(0.0, end, text),) if words else (), "en", end, words)


def configure(driver: Driver, *, transcription: bool = True, **session: Any) -> None:
    if transcription:
        session.setdefault("audio", {}).setdefault("input", {})["transcription"] = {
            "model": "whisper-1",
            "language": "en",
            "prompt": "Counting.",
            "delay": "minimal",
        }
    driver.send({"type": "session.update", "session": session})


def speak(driver: Driver, ms: int, answer: bool = True) -> None:
    """Voiced audio 20 ms at a time, answering caption steps as they come."""
    for _ in range(ms // 20):
        driver.append(voiced(20))
        if answer:
            for step in driver.steps(Urgency.CAPTION):
                driver.session.handle(Recognised(step.request_id, say(step)), now=driver.now)
                driver.pump()


def test_a_step_every_interval_of_new_audio_and_one_at_a_time(driver: Driver) -> None:
    configure(driver)
    driver.append(silence(300))
    speak(driver, 1500, answer=False)
    # The minimal delay steps every 0.4 s of audio; the first step is still running.
    (first,) = driver.steps()
    assert first.request.urgency == Urgency.CAPTION
    assert len(first.request.audio) / ASR_RATE == pytest.approx(0.4, abs=0.03)
    assert first.request.language == "en"
    assert first.request.prompt == "Counting."
    # Its answer comes late: the next step is due at once, on everything heard since.
    driver.session.handle(Recognised(first.request_id, say(first)), now=driver.now)
    driver.pump()
    (second,) = driver.steps()
    assert len(second.request.audio) / ASR_RATE == pytest.approx(1.8, abs=0.03)
    speak(driver, 380, answer=False)
    assert not driver.steps()
    driver.session.handle(Recognised(second.request_id, say(second)), now=driver.now)
    driver.pump()
    assert not driver.steps()  # not 0.4 s of new audio yet
    speak(driver, 20, answer=False)
    (third,) = driver.steps()
    assert len(third.request.audio) / ASR_RATE == pytest.approx(2.2, abs=0.03)


def test_captions_go_out_while_the_user_speaks_and_complete_at_the_turn_end(
    driver: Driver,
) -> None:
    configure(driver)
    driver.append(silence(300))
    speak(driver, 3000)
    started = next(e for e in driver.events if e["type"] == "input_audio_buffer.speech_started")
    deltas = [e for e in driver.events if e["type"] == DELTA]
    assert len(deltas) >= 3
    assert all(e["item_id"] == started["item_id"] for e in deltas)
    # The pause is recognised at once (as speculation), and ends the turn with its words.
    driver.append(silence(200))
    (pause,) = driver.steps(Urgency.SPECULATION)
    driver.session.handle(Recognised(pause.request_id, say(pause)), now=driver.now)
    driver.pump()
    driver.append(silence(500))
    types = driver.types()
    stopped = types.index("input_audio_buffer.speech_stopped")
    assert types.index(DELTA) < stopped
    assert not driver.steps(Urgency.ANSWER)
    deltas = [e for e in driver.events if e["type"] == DELTA]
    (completed,) = [e for e in driver.events if e["type"] == COMPLETED]
    assert types.index(COMPLETED) > max(i for i, t in enumerate(types) if t == DELTA)
    assert "".join(e["delta"] for e in deltas) == completed["transcript"] == " ".join(WORDS)
    assert completed["item_id"] == started["item_id"]
    assert "logprobs" not in completed and "logprobs" not in deltas[0]
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].content == " ".join(WORDS)


def captioning(delay: str) -> tuple[int, int]:
    """A new session with transcription ``delay`` captions 5 s of speech, each step answered
    at once: how many steps it took, and how far into the speech its first delta came (ms)."""
    driver = Driver()
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {"input": {"transcription": {"model": "whisper-1", "delay": delay}}}
            },
        }
    )
    driver.append(silence(300))
    steps, first_delta_ms = 0, -1
    for ms in range(20, 5020, 20):
        driver.append(voiced(20))
        for step in driver.steps(Urgency.CAPTION):
            steps += 1
            driver.session.handle(Recognised(step.request_id, say(step)), now=driver.now)
            driver.pump()
        if first_delta_ms < 0 and DELTA in driver.types():
            first_delta_ms = ms
    return steps, first_delta_ms


def test_a_longer_delay_decodes_less_often_and_commits_later() -> None:
    minimal, low, medium, high = (captioning(d) for d in ("minimal", "low", "medium", "high"))
    # Steps every 0.4, 0.6, 1.0 and 1.5 s of audio over 5.3 s.
    assert (minimal[0], low[0], medium[0], high[0]) == (13, 8, 5, 3)
    # The first words need two agreeing hypotheses (three with high): the longer the step,
    # the later they show.
    assert 0 < minimal[1] <= low[1] < medium[1] < high[1]


def test_a_pause_step_is_cancelled_when_the_speaker_goes_on(driver: Driver) -> None:
    configure(driver)
    driver.append(silence(300))
    speak(driver, 1200)
    driver.append(silence(200))
    (pause,) = driver.steps(Urgency.SPECULATION)
    # The caption step asked for during the silence goes on beside the pause's (under load
    # it has waited its turn); its words are committed as usual.
    assert not driver.take(CancelRecognition)
    (caption,) = driver.steps(Urgency.CAPTION)
    assert caption.request_id != pause.request_id
    captioned = len([e for e in driver.events if e["type"] == DELTA])
    driver.session.handle(Recognised(caption.request_id, say(caption)), now=driver.now)
    driver.pump()
    assert len([e for e in driver.events if e["type"] == DELTA]) == captioned + 1
    # No new caption step starts while the pause lasts.
    driver.append(silence(100))
    assert not driver.steps(Urgency.CAPTION)
    speak(driver, 100, answer=False)
    (cancel,) = driver.take(CancelRecognition)
    assert cancel.request_id == pause.request_id
    # Its late answer changes nothing, and captions go on.
    before = len(driver.events)
    driver.session.handle(Recognised(pause.request_id, say(pause)), now=driver.now)
    assert driver.pump() == [] and len(driver.events) == before
    speak(driver, 400, answer=False)
    assert driver.steps(Urgency.CAPTION)


def test_a_pause_result_supersedes_the_caption_step_still_in_flight(driver: Driver) -> None:
    configure(driver)
    driver.append(silence(300))
    speak(driver, 1200)
    driver.append(silence(200))
    (pause,) = driver.steps(Urgency.SPECULATION)
    (caption,) = driver.steps(Urgency.CAPTION)
    driver.session.handle(Recognised(pause.request_id, say(pause)), now=driver.now)
    driver.pump()
    # The caption step decodes less than the pause's did: cancelled, and its late result
    # changes nothing (the turn's words come once).
    (cancel,) = driver.take(CancelRecognition)
    assert cancel.request_id == caption.request_id
    driver.session.handle(Recognised(caption.request_id, say(caption)), now=driver.now)
    driver.pump()
    driver.append(silence(500))
    (completed,) = [e for e in driver.events if e["type"] == COMPLETED]
    heard = completed["transcript"].split()
    assert len(heard) >= 3 and heard == WORDS[: len(heard)]


def test_without_a_pause_result_the_final_step_finishes_the_turn(driver: Driver) -> None:
    configure(driver)
    driver.append(silence(300))
    speak(driver, 3000)
    sent = "".join(e["delta"] for e in driver.events if e["type"] == DELTA)
    driver.append(silence(200))
    (pause,) = driver.steps(Urgency.SPECULATION)
    driver.session.handle(TranscriptionFailed(pause.request_id, "engine down"), now=driver.now)
    driver.pump()
    driver.append(silence(500))
    assert COMPLETED not in driver.types()
    (final,) = driver.steps(Urgency.ANSWER)
    assert len(final.request.audio) / ASR_RATE == pytest.approx(3.8, abs=0.1)
    # Its prompt carries the client's prompt: the window still starts at the turn's start.
    assert final.request.prompt == "Counting."
    driver.session.handle(Recognised(final.request_id, say(final)), now=driver.now)
    new = driver.pump()
    last = [e for e in new if e["type"] == DELTA]
    assert [e["type"] for e in new if e["type"] in (DELTA, COMPLETED)] == [DELTA, COMPLETED]
    assert sent + last[0]["delta"] == " ".join(WORDS)
    assert new[-1]["type"] == COMPLETED or COMPLETED in driver.types(new)


def test_a_manual_commit_streams_the_buffer_and_finishes_it(driver: Driver) -> None:
    configure(driver, audio={"input": {"turn_detection": None}})
    speak(driver, 1800)
    deltas = [e for e in driver.events if e["type"] == DELTA]
    assert deltas
    committed = driver.send({"type": "input_audio_buffer.commit"})[0]
    assert committed["type"] == "input_audio_buffer.committed"
    assert committed["item_id"] == deltas[0]["item_id"]
    (final,) = driver.steps(Urgency.ANSWER)
    driver.session.handle(Recognised(final.request_id, say(final)), now=driver.now)
    driver.pump()
    (completed,) = [e for e in driver.events if e["type"] == COMPLETED]
    assert completed["item_id"] == committed["item_id"]
    deltas = [e for e in driver.events if e["type"] == DELTA]
    assert "".join(e["delta"] for e in deltas) == completed["transcript"]
    assert completed["transcript"] == " ".join(WORDS[:5])
    # The next buffer is a new item, recognised from its own start.
    speak(driver, 500, answer=False)
    (step,) = driver.steps()
    assert step.request_id.split(":")[0] != committed["item_id"]


def test_a_cleared_buffer_cancels_its_steps(driver: Driver) -> None:
    configure(driver, audio={"input": {"turn_detection": None}})
    speak(driver, 500, answer=False)
    (step,) = driver.steps()
    driver.send({"type": "input_audio_buffer.clear"})
    (cancel,) = driver.take(CancelRecognition)
    assert cancel.request_id == step.request_id


def test_no_transcription_events_without_transcription_config(driver: Driver) -> None:
    driver.append(silence(300))
    speak(driver, 3000)
    driver.append(silence(200))
    for step in driver.steps(Urgency.SPECULATION):
        driver.session.handle(Recognised(step.request_id, say(step)), now=driver.now)
    driver.pump()
    driver.append(silence(500))
    assert DELTA not in driver.types() and COMPLETED not in driver.types()
    # Recognition ran all the same: the LLM has the words.
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].content == " ".join(WORDS)


def test_logprobs_when_included(driver: Driver) -> None:
    configure(driver, include=["item.input_audio_transcription.logprobs"])
    driver.append(silence(300))
    speak(driver, 3000)
    driver.append(silence(200))
    (pause,) = driver.steps(Urgency.SPECULATION)
    driver.session.handle(Recognised(pause.request_id, say(pause)), now=driver.now)
    driver.pump()
    driver.append(silence(500))
    deltas = [e for e in driver.events if e["type"] == DELTA]
    for delta in deltas:
        tokens = [entry["token"] for entry in delta["logprobs"]]
        assert "".join(tokens) == delta["delta"]
        for entry in delta["logprobs"]:
            assert entry["logprob"] == pytest.approx(math.log(0.5))
            assert bytes(entry["bytes"]).decode() == entry["token"]
    (completed,) = [e for e in driver.events if e["type"] == COMPLETED]
    assert "".join(e["token"] for e in completed["logprobs"]) == completed["transcript"]


def long_words(seconds: float) -> list[TimedWord]:
    """A long monologue: word ``wN`` every 0.29 s from 0.3 s, on the turn's clock."""
    count = int((seconds - FIRST_S) / PER_WORD_S)
    return [
        TimedWord(f" w{i}", FIRST_S + i * PER_WORD_S, FIRST_S + (i + 1) * PER_WORD_S, 0.5)
        for i in range(count)
    ]


def hear(step: Recognise, words: list[TimedWord], window_start: float) -> TimedTranscript:
    """The words a step whose window starts ``window_start`` s into the turn holds whole,
    timed from the window's start."""
    end = len(step.request.audio) / ASR_RATE
    inside = tuple(
        TimedWord(w.word, w.start - window_start, w.end - window_start, w.probability)
        for w in words
        if w.start >= window_start - 0.01 and w.end - window_start <= end
    )
    text = " ".join(w.word.strip() for w in inside)
    return TimedTranscript((TimedSegment(0.0, end, text),), "en", end, inside)


def seconds_of(step: Recognise) -> float:
    return len(step.request.audio) / ASR_RATE


def test_a_turn_whose_captions_never_came_back_still_gets_all_its_words(
    driver: Driver,
) -> None:
    configure(driver, audio={"input": {"turn_detection": None}})
    # The first caption step never comes back (a loaded machine): 40 s wait for the end.
    speak(driver, 40_000, answer=False)
    assert len(driver.steps(Urgency.CAPTION)) == 1
    words = long_words(40.0)
    driver.send({"type": "input_audio_buffer.commit"})
    # More than the engine hears is left: its first 30 s first...
    (first,) = driver.steps(Urgency.ANSWER)
    assert seconds_of(first) == pytest.approx(30.0, abs=0.01)
    driver.session.handle(Recognised(first.request_id, hear(first, words, 0.0)), now=driver.now)
    driver.pump()
    assert COMPLETED not in driver.types()
    # ...then the rest, from the end of the last word it settled, prompted with the words
    # before it.
    settled = [w for w in words if w.end <= 28.0]
    (second,) = driver.steps(Urgency.ANSWER)
    assert seconds_of(second) == pytest.approx(40.0 - settled[-1].end, abs=0.01)
    assert second.request.prompt is not None
    assert second.request.prompt.endswith(settled[-1].word.strip())
    driver.session.handle(
        Recognised(second.request_id, hear(second, words, settled[-1].end)), now=driver.now
    )
    driver.pump()
    (completed,) = [e for e in driver.events if e["type"] == COMPLETED]
    assert completed["transcript"] == " ".join(w.word.strip() for w in words)
    deltas = [e["delta"] for e in driver.events if e["type"] == DELTA]
    assert "".join(deltas) == completed["transcript"]


def test_a_caption_step_after_a_late_one_decodes_the_audio_in_between(
    driver: Driver,
) -> None:
    configure(driver, audio={"input": {"turn_detection": None}})
    speak(driver, 35_000, answer=False)
    (late,) = driver.steps(Urgency.CAPTION)
    words = long_words(35.0)
    driver.session.handle(Recognised(late.request_id, hear(late, words, 0.0)), now=driver.now)
    driver.pump()
    # The next step starts where the policy's window does, not 30 s before the end.
    (catch_up,) = driver.steps(Urgency.CAPTION)
    assert seconds_of(catch_up) == pytest.approx(30.0, abs=0.01)
    driver.session.handle(
        Recognised(catch_up.request_id, hear(catch_up, words, 0.0)), now=driver.now
    )
    driver.pump()
    settled = [w for w in words if w.end <= 28.0]
    captioned = " ".join(e["delta"] for e in driver.events if e["type"] == DELTA)
    assert captioned.split() == [w.word.strip() for w in settled]
    # The step after goes on from the settled words.
    (following,) = driver.steps(Urgency.CAPTION)
    assert seconds_of(following) == pytest.approx(35.0 - settled[-1].end, abs=0.01)


def speak_long(driver: Driver, ms: int, words: list[TimedWord]) -> list[Prefill]:
    """Voiced audio 20 ms at a time from the session's start, caption steps answered with
    ``words``; returns the prefills asked for meanwhile."""
    prefills: list[Prefill] = []
    for chunk in range(ms // 20):
        driver.append(voiced(20))
        for step in driver.steps(Urgency.CAPTION):
            # A caption step's window ends at the audio heard so far.
            (started,) = [
                e for e in driver.events if e["type"] == "input_audio_buffer.speech_started"
            ]
            end = (chunk + 1) * 0.02 - started["audio_start_ms"] / 1000
            heard = hear(step, words, end - seconds_of(step))
            driver.session.handle(Recognised(step.request_id, heard), now=driver.now)
            driver.pump()
        prefills += driver.take(Prefill)
    return prefills


def test_the_llm_reads_the_turn_while_it_is_spoken(driver: Driver) -> None:
    configure(driver)
    driver.take(Prefill)  # the conversation, at the session's start
    words = long_words(9.0)
    prefills = speak_long(driver, 9000, words)
    # Every second or so of committed words: the conversation, then the user's words so far,
    # left open.
    assert len(prefills) >= 3
    said = " ".join(w.word.strip() for w in words)
    contents = []
    for prefill in prefills:
        assert prefill.request.open_turn
        *before, last = prefill.request.messages
        assert [m.role for m in before] == ["system"]
        assert last.role == "user" and said.startswith(last.content)
        contents.append(last.content)
    assert contents == sorted(contents, key=len) and len(set(contents)) == len(contents)
    captioned = " ".join(e["delta"].strip() for e in driver.events if e["type"] == DELTA)
    assert captioned.startswith(contents[-1])
    # The reply reads the same beginning, then the rest of the turn.
    driver.append(silence(200))
    for pause in driver.steps(Urgency.SPECULATION):
        driver.session.handle(Recognised(pause.request_id, hear(pause, words, 0.0)), now=driver.now)
        driver.pump()
    # The reply speculated on the pause's words reads them: no read-ahead beside it.
    assert driver.take(Speculate)
    assert not [p for p in driver.take(Prefill) if p.request.open_turn]
    driver.append(silence(600))
    (generate,) = driver.take(Generate)
    assert generate.request.messages[:-1] == prefills[-1].request.messages[:-1]
    assert generate.request.messages[-1].content.startswith(contents[-1])


def test_a_short_question_is_read_ahead_from_its_first_hypothesis(driver: Driver) -> None:
    configure(driver)
    driver.take(Prefill)  # the conversation, at the session's start
    words = long_words(2.0)
    said = [w.word.strip() for w in words]
    # Voiced audio, caption steps answered with what they hold whole, until the LLM is
    # offered the turn's first words.
    offered: list[Prefill] = []
    while not offered:
        driver.append(voiced(20))
        for step in driver.steps(Urgency.CAPTION):
            heard = hear(step, words, 0.0)
            driver.session.handle(Recognised(step.request_id, heard), now=driver.now)
            driver.pump()
        offered = [p for p in driver.take(Prefill) if p.request.open_turn]
    # Words are committed only once two hypotheses agree, but the latest hypothesis's words
    # but the last are offered with them, at once (not after a second of committed words),
    # the user's turn left open.
    committed = " ".join(e["delta"] for e in driver.events if e["type"] == DELTA).split()
    (prefill,) = offered
    content = prefill.request.messages[-1].content.split()
    assert content == [w.word.strip() for w in heard.words[:-1]] == said[: len(content)]
    assert len(committed) < len(content)
    assert words[len(content) - 1].end < PREFILL_EVERY_S


def test_no_read_ahead_for_turns_that_get_no_reply(driver: Driver) -> None:
    configure(
        driver,
        audio={"input": {"turn_detection": {"type": "server_vad", "create_response": False}}},
    )
    words = long_words(9.0)
    prefills = speak_long(driver, 9000, words)
    assert any(e["type"] == DELTA for e in driver.events)
    assert not [p for p in prefills if p.request.open_turn]


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 44100, 48000])
def test_the_turn_is_resampled_once_and_each_window_is_as_if_resampled_whole(rate: int) -> None:
    rng = np.random.default_rng(5)
    pcm = (3000 * np.sin(np.cumsum(rng.uniform(0.01, 0.3, 5 * rate)))).astype(np.int16)
    start_ms = 300.0

    def peek(first: float, last: float) -> npt.NDArray[np.int16]:
        index = round((first - start_ms) * rate / 1000)
        return pcm[max(0, index) : round((last - start_ms) * rate / 1000)].copy()

    turn = _TurnAudio(start_ms, rate, ASR_RATE)
    # Caption steps, a pause step ending before the last caption's end, a window moved on.
    for window_ms, end_ms in [(0, 400), (0, 1000), (0, 1600), (0, 1550), (1000, 2900)]:
        heard = turn.read(peek, start_ms + window_ms, start_ms + end_ms)
        whole = resample(
            peek(start_ms + window_ms, start_ms + end_ms).astype(np.float32) / np.float32(32768),
            rate,
            ASR_RATE,
        )
        assert len(heard) == len(whole)
        # The same but at the window's edges, where the turn's own audio beyond them is heard
        # instead of the silence a window resampled alone assumes.
        edge = round(0.01 * ASR_RATE)
        assert np.abs(heard[edge:-edge] - whole[edge:-edge]).max() < 1e-5

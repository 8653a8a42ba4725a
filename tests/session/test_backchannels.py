"""Backchannels while the reply plays: an "uh-huh" leaves it playing, "wait, stop" cuts it."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from hark.engines.asr import Urgency
from hark.engines.llm import Finished
from hark.session.actions import (
    CancelRecognition,
    ClearAudio,
    Generate,
    HoldAudio,
    PlayAudio,
    Recognise,
    ResumeAudio,
)
from hark.session.backchannel import (
    DECISION_MS,
    MAX_BACKCHANNEL_MS,
    judge_words,
    words_of,
)
from hark.session.results import (
    AudioGenerated,
    GenerationFinished,
    PlayoutCleared,
    PlayoutStarted,
    PlayoutStopped,
    Recognised,
    TranscriptionFailed,
)

from .conftest import Driver, silence, timed, voiced

REPLY_MS = 3000
SEMANTIC: dict[str, Any] = {"type": "semantic_vad"}


class Replying:
    """A session whose reply (``REPLY_MS`` of audio, still being generated) plays while
    the listener speaks."""

    def __init__(self, turn_detection: dict[str, Any], plays_audio: bool = True) -> None:
        driver = Driver(plays_audio=plays_audio)
        update = {"audio": {"input": {"turn_detection": turn_detection}}}
        driver.send({"type": "session.update", "session": update})
        driver.asr_text = "Tell me about Paris."
        driver.turn_score = 0.95
        driver.append(silence(300))
        driver.append(voiced(800))
        driver.append(silence(900))
        driver.transcribe_all()
        self.generate: Generate = driver.take(Generate)[-1]
        driver.asr_text = driver.turn_score = None
        driver.session.handle(
            AudioGenerated(
                self.generate.response_id,
                voiced(REPLY_MS, self.generate.output_rate),
                "Paris is the capital of France.",
            ),
            now=driver.now,
        )
        driver.pump()
        self.item_id = next(
            e["item"]["id"]
            for e in driver.events
            if e["type"] == "conversation.item.added" and e["item"]["role"] == "assistant"
        )
        if plays_audio:
            driver.take(PlayAudio)
            driver.session.handle(PlayoutStarted(self.generate.response_id), now=driver.now)
        driver.pump()
        driver.actions.clear()
        self.mark = len(driver.events)
        self.driver = driver

    def listen(self, pcm: Any) -> None:
        """The listener's audio, as the transport (media or appends) brings it."""
        if self.plays_audio:
            self.driver.stream(pcm)
        else:
            self.driver.append(pcm)

    @property
    def plays_audio(self) -> bool:
        return bool(self.driver.session._plays_audio)

    def asked(self) -> Recognise:
        """The one recognition of the candidate's words asked for so far."""
        (step,) = self.driver.steps(Urgency.DECISION)
        assert step.request_id.startswith("backchannel")
        return step

    def hear(self, step: Recognise, text: str) -> None:
        seconds = len(step.request.audio) / self.driver.asr_rate
        self.driver.session.handle(
            Recognised(step.request_id, timed(text, seconds)), now=self.driver.now
        )
        self.driver.pump()

    def since(self) -> list[str]:
        return self.driver.types(self.driver.events[self.mark :])

    def finish(self) -> dict[str, Any]:
        """The reply's generation and playout end; its ``response.done``."""
        driver = self.driver
        driver.session.handle(
            GenerationFinished(self.generate.response_id, Finished("stop", 20, 8)), now=driver.now
        )
        if self.plays_audio:
            driver.session.handle(PlayoutStopped(self.generate.response_id), now=driver.now)
        driver.pump()
        return next(e for e in driver.events if e["type"] == "response.done")["response"]

    def reply_audio_ms(self) -> int:
        retrieved = self.driver.send(
            {"type": "conversation.item.retrieve", "item_id": self.item_id}
        )
        content = retrieved[0]["item"]["content"][0]
        return len(base64.b64decode(content["audio"])) // 48


@pytest.mark.parametrize("plays_audio", [True, False], ids=["webrtc-sip", "websocket"])
def test_a_backchannel_leaves_the_reply_playing_untruncated(plays_audio: bool) -> None:
    replying = Replying(SEMANTIC, plays_audio)
    replying.listen(voiced(320))
    replying.listen(silence(240))
    step = replying.asked()
    # Nothing is said while it is judged: no speech_started, the reply is not cut; a reply
    # the server plays is held meanwhile, one the client plays goes on.
    assert replying.since() == []
    assert not replying.driver.take(ClearAudio)
    response_id = replying.generate.response_id
    assert replying.driver.take(HoldAudio) == ([HoldAudio(response_id)] if plays_audio else [])
    replying.hear(step, "Uh-huh.")
    replying.listen(silence(1500))
    assert replying.since() == []
    assert not replying.driver.take(ClearAudio)
    # It goes on from where it was held.
    assert replying.driver.take(ResumeAudio) == ([ResumeAudio(response_id)] if plays_audio else [])
    assert not replying.driver.take(Generate)
    assert replying.driver.session._turns.backchannels == 1
    response = replying.finish()
    assert response["status"] == "completed"
    assert "conversation.item.truncated" not in replying.since()
    assert replying.since().count("conversation.item.added") == 0
    assert replying.reply_audio_ms() == REPLY_MS


@pytest.mark.parametrize("plays_audio", [True, False], ids=["webrtc-sip", "websocket"])
def test_wait_stop_cuts_the_reply_where_it_was_heard(plays_audio: bool) -> None:
    replying = Replying(SEMANTIC, plays_audio)
    replying.listen(silence(200))
    onset_ms = replying.driver.session._turns._clock_ms
    replying.listen(voiced(400))
    replying.listen(silence(240))
    replying.hear(replying.asked(), "Wait, stop.")
    new = replying.driver.events[replying.mark :]
    started = next(e for e in new if e["type"] == "input_audio_buffer.speech_started")
    # The turn starts where the speech did, prefix padding included, however late it is told.
    assert started["audio_start_ms"] == pytest.approx(onset_ms - 300, abs=40)
    done = next(e for e in new if e["type"] == "response.done")["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "turn_detected"
    if plays_audio:
        # Held at the speech's onset, then cut: never resumed.
        assert replying.driver.take(HoldAudio) == [HoldAudio(replying.generate.response_id)]
        assert not replying.driver.take(ResumeAudio)
        (clear,) = replying.driver.take(ClearAudio)
        assert clear.response_id == replying.generate.response_id
        replying.driver.session.handle(
            PlayoutCleared(replying.generate.response_id, 900), now=replying.driver.now
        )
        replying.driver.pump()
        assert "conversation.item.truncated" in replying.since()
        assert replying.reply_audio_ms() == 900
    # The interruption is a turn: it ends, is committed and answered.
    replying.listen(silence(700))
    types = replying.since()
    assert "input_audio_buffer.speech_stopped" in types
    assert "input_audio_buffer.committed" in types
    replying.driver.transcribe_all("Wait, stop.")
    assert replying.driver.take(Generate)


def test_long_speech_interrupts_without_waiting_for_words() -> None:
    replying = Replying(SEMANTIC)
    replying.listen(voiced(MAX_BACKCHANNEL_MS - 100))
    assert replying.since() == []
    replying.listen(voiced(200))
    assert "input_audio_buffer.speech_started" in replying.since()
    assert replying.driver.take(ClearAudio)
    assert not replying.driver.steps(Urgency.DECISION)


def test_no_verdict_in_time_interrupts() -> None:
    replying = Replying(SEMANTIC)
    replying.listen(voiced(300))
    replying.listen(silence(240))
    step = replying.asked()
    replying.listen(silence(DECISION_MS - 700))
    assert "input_audio_buffer.speech_started" not in replying.since()
    replying.listen(silence(300))
    assert "input_audio_buffer.speech_started" in replying.since()
    assert replying.driver.take(ClearAudio)
    assert CancelRecognition(step.request_id) in replying.driver.actions
    # A verdict that comes after that changes nothing.
    replying.hear(step, "Yeah.")
    assert replying.since().count("input_audio_buffer.speech_started") == 1


def test_a_failed_recognition_interrupts() -> None:
    replying = Replying(SEMANTIC)
    replying.listen(voiced(300))
    replying.listen(silence(240))
    step = replying.asked()
    replying.driver.session.handle(
        TranscriptionFailed(step.request_id, "engine down"), now=replying.driver.now
    )
    replying.driver.pump()
    assert "input_audio_buffer.speech_started" in replying.since()


def test_speech_going_on_after_the_words_were_asked_is_judged_anew() -> None:
    replying = Replying(SEMANTIC)
    replying.listen(voiced(300))
    replying.listen(silence(240))
    first = replying.asked()
    replying.listen(voiced(200))
    assert CancelRecognition(first.request_id) in replying.driver.actions
    replying.listen(silence(240))
    replying.hear(replying.asked(), "Yeah, yeah.")
    replying.listen(silence(800))
    assert replying.since() == []
    assert replying.finish()["status"] == "completed"


def test_off_and_for_server_vad_speech_interrupts_at_once() -> None:
    for turn_detection in (
        {"type": "semantic_vad", "hark_backchannels": False},
        {"type": "server_vad"},
    ):
        replying = Replying(turn_detection)
        replying.listen(voiced(200))
        assert "input_audio_buffer.speech_started" in replying.since()
        assert replying.driver.take(ClearAudio)


def test_server_vad_can_ask_for_it() -> None:
    replying = Replying({"type": "server_vad", "hark_backchannels": True})
    replying.listen(voiced(300))
    replying.listen(silence(240))
    replying.hear(replying.asked(), "Mm-hmm.")
    replying.listen(silence(800))
    assert replying.since() == []
    assert replying.finish()["status"] == "completed"


def test_speech_with_no_reply_playing_is_a_turn_at_once(driver: Driver) -> None:
    driver.send(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": SEMANTIC}}}}
    )
    driver.append(silence(200))
    assert "input_audio_buffer.speech_started" in driver.types(driver.append(voiced(200)))


def test_the_field_is_echoed_only_when_set(driver: Driver) -> None:
    created = driver.events[0]["session"]["audio"]["input"]["turn_detection"]
    assert "hark_backchannels" not in created
    update = {"turn_detection": {"type": "semantic_vad", "hark_backchannels": False}}
    new = driver.send({"type": "session.update", "session": {"audio": {"input": update}}})
    assert new[-1]["session"]["audio"]["input"]["turn_detection"]["hark_backchannels"] is False


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("Uh-huh.", "backchannel"),
        ("Mm-hmm.", "backchannel"),
        ("Mm-mm.", "backchannel"),
        ("Nm-m-hmm.", "backchannel"),
        ("Hmmm", "backchannel"),
        ("Yeah.", "backchannel"),
        ("Right, okay.", "backchannel"),
        ("Hahaha!", "backchannel"),
        ("ah ah ah ah ah ah ah ah ah ah ah ah", "backchannel"),
        ("Wait, wait, wait, wait, wait.", "interruption"),
        ("Yeah, yeah, but what about it?", "interruption"),
        ("(laughs)", "backchannel"),
        ("", "backchannel"),
        ("Wait.", "interruption"),
        ("No, stop.", "interruption"),
        ("What about Lyon?", "interruption"),
        ("Yeah, but what about the price?", "interruption"),
    ],
)
def test_words(text: str, verdict: str) -> None:
    assert judge_words(text) == verdict


def test_words_of() -> None:
    assert words_of("Uh-huh. I see [laughter]") == ["uhhuh", "i", "see"]


def test_speech_before_the_reply_has_audio_is_a_turn_at_once() -> None:
    driver = Driver()
    update = {"audio": {"input": {"turn_detection": SEMANTIC}}}
    driver.send({"type": "session.update", "session": update})
    driver.asr_text = "Tell me about Paris."
    driver.turn_score = 0.95
    driver.append(silence(300))
    driver.append(voiced(800))
    driver.append(silence(900))
    driver.transcribe_all()
    assert driver.take(Generate)
    # The response is under way, but has said nothing yet.
    new = driver.append(voiced(200))
    assert "input_audio_buffer.speech_started" in driver.types(new)
    assert "response.done" in driver.types(new)


def test_a_client_that_asks_hears_of_each_backchannel() -> None:
    replying = Replying(SEMANTIC)
    replying.driver.send({"type": "session.update", "session": {"include": ["hark.backchannels"]}})
    replying.mark = len(replying.driver.events)
    replying.listen(silence(200))
    onset_ms = replying.driver.session._turns._clock_ms
    replying.listen(voiced(300))
    replying.listen(silence(240))
    replying.hear(replying.asked(), " Mm-hmm.")
    new = replying.driver.events[replying.mark :]
    assert [e["type"] for e in new] == ["hark.backchannel"]
    assert new[0]["transcript"] == "Mm-hmm."
    assert new[0]["audio_start_ms"] == pytest.approx(onset_ms - 300, abs=40)
    assert new[0]["audio_end_ms"] == pytest.approx(onset_ms + 300, abs=40)

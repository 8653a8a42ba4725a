"""What clients written for OpenAI expect of the core: model names, item snapshots, inline
audio, and the idle timeout (issue 16)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.engines.asr import Urgency
from hark.engines.llm import Finished
from hark.session.actions import CancelRecognition, Generate, Transcribe
from hark.session.results import (
    AudioGenerated,
    GenerationFinished,
    PlayoutStarted,
    PlayoutStopped,
    TextGenerated,
    TranscriptionDone,
    TranscriptionFailed,
)
from tests.helpers.streams import of_type

from .conftest import Driver, silence, voiced


def b64(pcm: npt.NDArray[np.int16]) -> str:
    return base64.b64encode(pcm.astype("<i2").tobytes()).decode()


def audio_item(pcm: npt.NDArray[np.int16], item_id: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": b64(pcm)}],
    }
    if item_id is not None:
        item["id"] = item_id
    return item


# ---------------------------------------------------------------- model names


def test_any_model_name_is_accepted_and_echoed(driver: Driver) -> None:
    # The agents SDK connects with ?model= and then updates with its own default.
    new = driver.send({"type": "session.update", "session": {"model": "gpt-realtime-2.1"}})
    assert driver.types(new) == ["session.updated"]
    assert new[0]["session"]["model"] == "gpt-realtime-2.1"
    again = driver.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    assert again[0]["session"]["model"] == "gpt-realtime-2.1"


# ---------------------------------------------------------------- item snapshots


def test_an_assistant_item_is_announced_without_content(driver: Driver) -> None:
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    start = len(driver.events)
    driver.speak_reply(generate, ["Hello."])
    new = driver.events[start:]
    (added,) = of_type(new, "response.output_item.added")
    (conversation_added,) = of_type(new, "conversation.item.added")
    for event in (added, conversation_added):
        assert event["item"]["content"] == []
        assert event["item"]["status"] == "in_progress"
    types = driver.types(new)
    assert types.index("response.output_item.added") < types.index("response.content_part.added")
    (part,) = of_type(new, "response.content_part.added")
    assert part["part"] == {"type": "audio", "transcript": ""}
    (done,) = of_type(new, "response.output_item.done")
    assert done["item"]["content"] == [{"type": "output_audio", "transcript": "Hello."}]


def test_input_audio_carries_a_null_transcript_until_known(driver: Driver) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {"audio": {"input": {"transcription": {"model": "whisper-1"}}}},
        }
    )
    driver.append(silence(300))
    driver.append(voiced(800))
    new = driver.append(silence(700))
    (committed,) = of_type(new, "conversation.item.added")
    assert committed["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    driver.transcribe_all("Hello there.")
    retrieved = driver.send(
        {"type": "conversation.item.retrieve", "item_id": committed["item"]["id"]}
    )
    content = retrieved[0]["item"]["content"][0]
    assert content["transcript"] == "Hello there."
    assert content["audio"]


def test_an_item_created_without_audio_or_transcript_has_a_null_transcript(
    driver: Driver,
) -> None:
    new = driver.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_audio"}]},
        }
    )
    (added,) = of_type(new, "conversation.item.added")
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]


# ---------------------------------------------------------------- audio with no transcript


def inline_response(driver: Driver, pcm: npt.NDArray[np.int16]) -> list[dict[str, Any]]:
    """``response.create`` whose own input is a user's audio with no transcript."""
    return driver.send(
        {
            "type": "response.create",
            "response": {"output_modalities": ["text"], "input": [audio_item(pcm)]},
        }
    )


def user_words(generate: Generate) -> list[str]:
    return [m.content for m in generate.request.messages if m.role == "user"]


def answer_text(driver: Driver, generate: Generate, text: str = "Paris.") -> list[dict[str, Any]]:
    driver.session.handle(TextGenerated(generate.response_id, text), now=driver.now)
    driver.session.handle(
        GenerationFinished(
            generate.response_id, Finished("stop", prompt_tokens=10, completion_tokens=2)
        ),
        now=driver.now,
    )
    return driver.pump()


def test_inline_audio_is_transcribed_and_answered(driver: Driver) -> None:
    new = inline_response(driver, voiced(800))
    assert driver.types(new) == ["response.created", "rate_limits.updated"]
    (transcribe,) = driver.take(Transcribe)
    assert len(transcribe.audio) == 800 * driver.asr_rate // 1000
    assert not driver.take(Generate)
    driver.session.handle(
        TranscriptionDone(transcribe.request_id, "What is the capital of France?", 0.8),
        now=driver.now,
    )
    new = driver.pump()
    # Its words are the response's own: no conversation item, no transcription events.
    assert not [t for t in driver.types(new) if t.startswith("conversation.item")]
    (generate,) = driver.take(Generate)
    assert user_words(generate) == ["What is the capital of France?"]
    done = of_type(answer_text(driver, generate), "response.done")
    assert done[0]["response"]["status"] == "completed"
    # The conversation's next response is not blocked.
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    assert len(driver.take(Generate)) == 1


def test_inline_audio_that_cannot_be_transcribed_fails_its_response(driver: Driver) -> None:
    inline_response(driver, voiced(800))
    (transcribe,) = driver.take(Transcribe)
    driver.session.handle(TranscriptionFailed(transcribe.request_id, "engine down"), now=driver.now)
    new = driver.pump()
    (done,) = of_type(new, "response.done")
    assert done["response"]["status"] == "failed"
    error = done["response"]["status_details"]["error"]
    assert error["code"] == "transcription_failed"
    assert "engine down" in error["message"]
    assert not driver.take(Generate)
    assert "error" not in driver.types()
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    assert len(driver.take(Generate)) == 1


def test_a_response_waiting_for_words_can_be_cancelled(driver: Driver) -> None:
    inline_response(driver, voiced(800))
    (transcribe,) = driver.take(Transcribe)
    new = driver.send({"type": "response.cancel"})
    (done,) = of_type(new, "response.done")
    assert done["response"]["status"] == "cancelled"
    # Nothing else waits for the inline item's words: its transcription is cancelled.
    assert [c.request_id for c in driver.take(CancelRecognition)] == [transcribe.request_id]
    driver.session.handle(TranscriptionDone(transcribe.request_id, "Hello?", 0.8), now=driver.now)
    assert driver.pump() == []
    assert not driver.take(Generate)
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    assert len(driver.take(Generate)) == 1


def test_a_cancelled_response_leaves_a_created_items_transcription_running(
    driver: Driver,
) -> None:
    driver.send({"type": "conversation.item.create", "item": audio_item(voiced(600), "item_a")})
    driver.send(
        {
            "type": "response.create",
            "response": {
                "output_modalities": ["text"],
                "input": [{"type": "item_reference", "id": "item_a"}],
            },
        }
    )
    assert len(driver.take(Transcribe)) == 1
    driver.send({"type": "response.cancel"})
    # The item is the conversation's: the client still gets its transcript.
    assert not driver.take(CancelRecognition)


def test_an_inline_item_is_not_transcribed_when_the_response_is_refused(driver: Driver) -> None:
    bad_audio = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": "not base64!"}],
    }
    refused = driver.send(
        {
            "type": "response.create",
            "response": {
                "output_modalities": ["text"],
                "input": [audio_item(voiced(800)), bad_audio],
            },
        }
    )
    assert driver.types(refused) == ["error"]
    refused = driver.send(
        {
            "type": "response.create",
            "response": {
                "input": [audio_item(voiced(800))],
                "tool_choice": {"type": "function", "name": "missing"},
            },
        }
    )
    assert driver.types(refused) == ["error"]
    started = {t.request_id for t in driver.take(Transcribe)}
    assert started == {c.request_id for c in driver.take(CancelRecognition)}


def test_a_created_audio_item_is_transcribed_before_the_response_reads_it(
    driver: Driver,
) -> None:
    driver.send({"type": "conversation.item.create", "item": audio_item(voiced(600), "item_a")})
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    assert not driver.take(Generate)
    (transcribe,) = driver.take(Transcribe)
    driver.session.handle(
        TranscriptionDone(transcribe.request_id, "Hello there.", 0.6), now=driver.now
    )
    driver.pump()
    (generate,) = driver.take(Generate)
    assert user_words(generate) == ["Hello there."]


def test_a_created_audio_item_that_cannot_be_transcribed_fails_the_response(
    driver: Driver,
) -> None:
    driver.send({"type": "conversation.item.create", "item": audio_item(voiced(600), "item_a")})
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    (transcribe,) = driver.take(Transcribe)
    driver.session.handle(TranscriptionFailed(transcribe.request_id, "engine down"), now=driver.now)
    (done,) = of_type(driver.pump(), "response.done")
    assert done["response"]["status"] == "failed"
    assert not driver.take(Generate)
    # The session goes on: the next response reads the conversation (the item has no words).
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    (generate,) = driver.take(Generate)
    assert user_words(generate) == [""]


# ---------------------------------------------------------------- idle timeout

IDLE_MS = 2000


def with_idle_timeout(driver: Driver) -> None:
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": IDLE_MS}}
                }
            },
        }
    )


def answered_turn(driver: Driver, reply_ms: int = 400) -> float:
    """A spoken turn and its spoken reply; returns where the reply ends on the input's sample
    clock, were the client to play it while it goes on streaming."""
    driver.asr_text = "Hello."
    driver.append(silence(300))
    driver.append(voiced(800))
    driver.append(silence(700))
    (generate,) = driver.take(Generate)
    driver.speak_reply(generate, ["Hi there."], ms_per_clause=reply_ms)
    return 1800 + reply_ms


def test_idle_timeout_fires_on_wall_time_when_the_client_stops_sending(driver: Driver) -> None:
    with_idle_timeout(driver)
    answered_turn(driver)
    # Nothing more arrives: only the wall clock moves.
    assert driver.advance(2.3) == []
    assert driver.session.next_deadline() == driver.now + 0.1
    new = driver.advance(0.1)
    types = driver.types(new)
    assert types[:4] == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert "response.created" in types
    triggered, committed = new[0], new[1]
    # No audio was written after the reply: the silent segment is empty, at its end.
    assert triggered["audio_start_ms"] == triggered["audio_end_ms"] == 1800
    assert committed["item_id"] == triggered["item_id"]
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].role == "user"
    # Fired once: nothing waits on the clock but the session limit.
    assert driver.session.next_deadline() == driver.session.expires_at


def test_idle_timeout_reports_the_silence_after_the_reply(driver: Driver) -> None:
    with_idle_timeout(driver)
    reply_end_ms = answered_turn(driver, reply_ms=600)
    new = driver.append(silence(3000))
    (triggered,) = of_type(new, "input_audio_buffer.timeout_triggered")
    # The segment after the reply's playback, as long as the timeout.
    assert triggered["audio_start_ms"] == reply_end_ms
    assert triggered["audio_end_ms"] - triggered["audio_start_ms"] == IDLE_MS
    (committed,) = of_type(new, "input_audio_buffer.committed")
    assert committed["item_id"] == triggered["item_id"]
    assert len(of_type(new, "response.created")) == 1


def test_idle_timeout_counts_from_the_end_of_playout_on_webrtc() -> None:
    driver = Driver(plays_audio=True)
    with_idle_timeout(driver)
    driver.asr_text = "Hello."
    driver.stream(silence(300))
    driver.stream(voiced(800))
    driver.stream(silence(700))
    (generate,) = driver.take(Generate)
    rid = generate.response_id
    driver.session.handle(AudioGenerated(rid, voiced(1000), "Hi there."), now=driver.now)
    driver.session.handle(GenerationFinished(rid, Finished("stop", 10, 3)), now=driver.now)
    driver.session.handle(PlayoutStarted(rid), now=driver.now)
    # Playing the reply takes longer than the timeout would have from response.done.
    assert "input_audio_buffer.timeout_triggered" not in driver.types(driver.stream(silence(3000)))
    driver.session.handle(PlayoutStopped(rid), now=driver.now)
    driver.pump()
    played_ms = 1800 + 3000
    new = driver.stream(silence(2500))
    (triggered,) = of_type(new, "input_audio_buffer.timeout_triggered")
    assert triggered["audio_start_ms"] == played_ms
    assert triggered["audio_end_ms"] == played_ms + IDLE_MS


def test_speech_disarms_the_idle_timeout(driver: Driver) -> None:
    with_idle_timeout(driver)
    answered_turn(driver)
    driver.append(silence(1000))
    driver.append(voiced(600))
    assert driver.session.next_deadline() == driver.session.expires_at
    assert "input_audio_buffer.timeout_triggered" not in driver.types(driver.advance(5))


def test_an_empty_idle_segment_needs_no_recognition(driver: Driver) -> None:
    with_idle_timeout(driver)
    answered_turn(driver)
    driver.take(Transcribe)
    driver.asr_text = None
    new = driver.advance(2.4)
    assert "input_audio_buffer.timeout_triggered" in driver.types(new)
    assert not driver.take(Transcribe)
    # The response reads the conversation at once: nobody waits for words.
    assert len(driver.take(Generate)) == 1


def test_an_item_with_two_audio_parts_waits_for_both(driver: Driver) -> None:
    item = audio_item(voiced(400), "item_two")
    item["content"].append({"type": "input_audio", "audio": b64(voiced(300))})
    driver.send({"type": "conversation.item.create", "item": item})
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    first, second = driver.take(Transcribe)
    assert first.request_id != second.request_id
    driver.session.handle(TranscriptionDone(second.request_id, "too.", 0.3), now=driver.now)
    driver.pump()
    assert not driver.take(Generate)
    driver.session.handle(TranscriptionDone(first.request_id, "Me", 0.4), now=driver.now)
    driver.pump()
    (generate,) = driver.take(Generate)
    assert user_words(generate) == ["Me too."]


def test_a_spoken_turn_that_cannot_be_recognised_fails_its_response(driver: Driver) -> None:
    driver.append(silence(300))
    driver.append(voiced(800))
    new = driver.append(silence(700))
    assert "response.created" in driver.types(new)
    waiting = [s for s in driver.steps() if s.request.urgency != Urgency.CAPTION]
    for step in waiting:
        driver.session.handle(TranscriptionFailed(step.request_id, "engine down"), now=driver.now)
    (done,) = of_type(driver.pump(), "response.done")
    assert done["response"]["status"] == "failed"
    assert done["response"]["status_details"]["error"]["code"] == "transcription_failed"
    assert not driver.take(Generate)

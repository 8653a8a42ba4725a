"""What clients written for OpenAI expect of the core: model names, item snapshots, inline
audio, and the idle timeout (issue 16)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.engines.llm import Finished
from hark.session.actions import Generate, Transcribe

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


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


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
    driver.session.on_text(generate.response_id, text, now=driver.now)
    driver.session.on_generation_finished(
        generate.response_id,
        Finished("stop", prompt_tokens=10, completion_tokens=2),
        now=driver.now,
    )
    return driver.pump()


def test_inline_audio_is_transcribed_and_answered(driver: Driver) -> None:
    new = inline_response(driver, voiced(800))
    assert driver.types(new) == ["response.created", "rate_limits.updated"]
    (transcribe,) = driver.take(Transcribe)
    assert len(transcribe.audio) == 800 * driver.asr_rate // 1000
    assert not driver.take(Generate)
    driver.session.on_transcription_done(
        transcribe.request_id, "What is the capital of France?", 0.8, now=driver.now
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
    driver.session.on_transcription_failed(transcribe.request_id, "engine down", now=driver.now)
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
    driver.session.on_transcription_done(transcribe.request_id, "Hello?", 0.8, now=driver.now)
    assert driver.pump() == []
    assert not driver.take(Generate)
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    assert len(driver.take(Generate)) == 1


def test_a_created_audio_item_is_transcribed_before_the_response_reads_it(
    driver: Driver,
) -> None:
    driver.send({"type": "conversation.item.create", "item": audio_item(voiced(600), "item_a")})
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    assert not driver.take(Generate)
    (transcribe,) = driver.take(Transcribe)
    driver.session.on_transcription_done(transcribe.request_id, "Hello there.", 0.6, now=driver.now)
    driver.pump()
    (generate,) = driver.take(Generate)
    assert user_words(generate) == ["Hello there."]


def test_a_created_audio_item_that_cannot_be_transcribed_fails_the_response(
    driver: Driver,
) -> None:
    driver.send({"type": "conversation.item.create", "item": audio_item(voiced(600), "item_a")})
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    (transcribe,) = driver.take(Transcribe)
    driver.session.on_transcription_failed(transcribe.request_id, "engine down", now=driver.now)
    (done,) = of_type(driver.pump(), "response.done")
    assert done["response"]["status"] == "failed"
    assert not driver.take(Generate)
    # The session goes on: the next response reads the conversation (the item has no words).
    driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    (generate,) = driver.take(Generate)
    assert user_words(generate) == [""]

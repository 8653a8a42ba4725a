"""What clients written for OpenAI expect of the core: model names, item snapshots, inline
audio, and the idle timeout (issue 16)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.session.actions import Generate

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

"""Input audio and image tokens in ``usage`` (issue 28, point 6): hark's LLM reads the words of
the audio, but a cost dashboard reading ``usage`` expects what OpenAI would bill for the same
conversation, as output audio already is: a user's audio one token per 100 ms, the assistant's
one per 50 ms, an image ``IMAGE_TOKENS``.
"""

from __future__ import annotations

import base64
from typing import Any

from hark.engines.llm import Finished
from hark.session.actions import Generate
from hark.session.response_lifecycle import IMAGE_TOKENS
from hark.session.results import AudioGenerated, GenerationFinished

from .conftest import Driver, manual, voiced

# A 1x1 PNG.
PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def user_audio(driver: Driver, ms: int) -> None:
    pcm = voiced(ms)
    audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": audio, "transcript": "Hello there."}],
    }
    driver.send({"type": "conversation.item.create", "item": item})


def respond(driver: Driver, prompt_tokens: int, reply_ms: int = 0) -> dict[str, Any]:
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    if reply_ms:
        pcm = voiced(reply_ms, generate.output_rate)
        driver.session.handle(AudioGenerated(generate.response_id, pcm, "Hi."), now=driver.now)
    driver.session.handle(
        GenerationFinished(
            generate.response_id, Finished("stop", prompt_tokens=prompt_tokens, completion_tokens=2)
        ),
        now=driver.now,
    )
    return driver.pump()[-1]["response"]["usage"]


def test_the_audio_a_response_read_is_counted_as_openai_counts_it() -> None:
    driver = Driver()
    manual(driver)
    user_audio(driver, 1500)
    usage = respond(driver, prompt_tokens=40, reply_ms=800)
    assert usage["input_token_details"]["audio_tokens"] == 15
    assert usage["input_token_details"]["text_tokens"] == 40
    assert usage["input_tokens"] == 55
    assert usage["output_token_details"]["audio_tokens"] == 16
    assert usage["total_tokens"] == 55 + 2 + 16
    # The next response reads the user's audio and the reply's (one token per 50 ms).
    user_audio(driver, 1000)
    usage = respond(driver, prompt_tokens=60)
    assert usage["input_token_details"]["audio_tokens"] == 15 + 16 + 10
    assert usage["input_tokens"] == 60 + 41


def test_audio_let_go_under_the_retention_budget_still_counts() -> None:
    driver = Driver(audio_retention_s=1.0)
    manual(driver)
    user_audio(driver, 1500)
    user_audio(driver, 1500)
    parts = [e.parts[0] for e in driver.session.conversation.entries()]
    assert parts[0].audio is None and parts[0].audio_dropped
    usage = respond(driver, prompt_tokens=10)
    assert usage["input_token_details"]["audio_tokens"] == 30


def test_an_image_is_counted_out_of_the_text_the_llm_counted() -> None:
    driver = Driver()
    manual(driver)
    item = {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": PIXEL},
        ],
    }
    driver.send({"type": "conversation.item.create", "item": item})
    usage = respond(driver, prompt_tokens=IMAGE_TOKENS + 12)
    details = usage["input_token_details"]
    assert (details["text_tokens"], details["image_tokens"]) == (12, IMAGE_TOKENS)
    assert usage["input_tokens"] == IMAGE_TOKENS + 12


def test_a_text_conversation_has_no_audio_tokens() -> None:
    driver = Driver()
    manual(driver)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    driver.send({"type": "conversation.item.create", "item": item})
    usage = respond(driver, prompt_tokens=7)
    assert usage["input_token_details"]["audio_tokens"] == 0
    assert usage["input_tokens"] == 7

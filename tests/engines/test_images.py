"""Images (``input_image``) reach an OpenAI-compatible backend as ``image_url`` content parts,
and a text-only model refuses them with a clear error instead of reading "[image]"."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.llm import ChatMessage, GenerationRequest, ImagePart, takes_images
from hark.engines.llm.llama_cpp import LlamaCppLlm
from hark.engines.llm.openai_compatible import OpenAICompatibleLlm, message_to_openai
from hark.engines.registry import build_engines

from .conftest import scripted_peer

# A 1x1 red PNG.
RED_PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAF"
    "BQIAX8jx0gAAAABJRU5ErkJggg=="
)
REPLY = "A single red pixel."


class VisionBackend:
    """A chat-completions handler that keeps each request's body and streams ``REPLY`` back
    in two chunks, as vLLM or Ollama would; ``url`` is set once it serves."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.url = ""

    async def complete(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        half = len(REPLY) // 2
        for piece in (REPLY[:half], REPLY[half:]):
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        done: dict[str, Any] = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        usage: dict[str, Any] = {
            "choices": [],
            "usage": {"prompt_tokens": 30, "completion_tokens": 5},
        }
        for chunk in (done, usage):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
async def backend() -> AsyncIterator[VisionBackend]:
    """A vision backend, serving."""
    server = VisionBackend()
    async with scripted_peer("/chat/completions", server.complete) as url:
        server.url = url
        yield server


def image_item(*content: dict[str, Any]) -> dict[str, Any]:
    """``conversation.item.create`` of a user message."""
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": list(content)},
    }


async def run_turn(runner: SessionRunner, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send ``events``; return what the session sends until a ``response.done`` or an error."""
    await runner.start()
    for event in events:
        runner.receive_text(json.dumps(event))
    received: list[dict[str, Any]] = []

    async def until_done() -> None:
        async for text in runner.outgoing():
            received.append(json.loads(text))
            if received[-1]["type"] in ("response.done", "error"):
                return

    await asyncio.wait_for(until_done(), 10)
    await runner.close()
    return received


def test_a_message_with_images_is_sent_as_content_parts() -> None:
    message = ChatMessage(
        role="user", content="What is this?", images=(ImagePart(RED_PIXEL, "low"),)
    )
    assert message_to_openai(message) == {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": RED_PIXEL, "detail": "low"}},
        ],
    }
    # Without images, content stays a plain string, which text-only servers expect.
    assert message_to_openai(ChatMessage(role="user", content="Hi")) == {
        "role": "user",
        "content": "Hi",
    }


def test_which_engines_take_images() -> None:
    assert takes_images(OpenAICompatibleLlm("http://127.0.0.1:9/v1", "m"))
    # The embedded SmolLM2 reads text only (the model is not loaded to say so).
    assert not takes_images(LlamaCppLlm())


async def test_an_image_reaches_the_backend_and_the_reply_comes_back(
    backend: VisionBackend,
) -> None:
    llm = OpenAICompatibleLlm(backend.url, "vision")
    engines = dataclasses.replace(build_engines(Settings(engines="fake")), llm=llm)
    runner = SessionRunner(engines, model="m")
    received = await run_turn(
        runner,
        [
            {"type": "session.update", "session": {"output_modalities": ["text"]}},
            image_item(
                {"type": "input_text", "text": "What is in this picture?"},
                {"type": "input_image", "image_url": RED_PIXEL, "detail": "high"},
            ),
            {"type": "response.create"},
        ],
    )
    done = received[-1]
    assert done["type"] == "response.done", received
    assert done["response"]["status"] == "completed"
    text = "".join(e["delta"] for e in received if e["type"] == "response.output_text.delta")
    assert text == REPLY
    (body,) = backend.bodies
    assert body["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": RED_PIXEL, "detail": "high"}},
        ],
    }
    # The item keeps the image as the client sent it.
    added = next(e for e in received if e["type"] == "conversation.item.added")
    assert added["item"]["content"][1] == {
        "type": "input_image",
        "image_url": RED_PIXEL,
        "detail": "high",
    }
    await llm.aclose()


async def test_a_text_only_model_refuses_the_image_and_the_session_goes_on() -> None:
    engines = dataclasses.replace(build_engines(Settings(engines="fake")), llm=LlamaCppLlm())
    runner = SessionRunner(engines, model="m")
    received = await run_turn(
        runner,
        [
            image_item(
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": RED_PIXEL},
            )
        ],
    )
    error = received[-1]
    assert error["type"] == "error"
    assert error["error"]["param"] == "item.content[1].type"
    assert "takes no images" in error["error"]["message"]
    # Nothing was added: no response will trip over an image it cannot read.
    assert "conversation.item.added" not in [e["type"] for e in received]
    assert len(runner.session.conversation) == 0


async def test_a_text_only_model_refuses_images_in_response_input_too() -> None:
    engines = dataclasses.replace(build_engines(Settings(engines="fake")), llm=LlamaCppLlm())
    runner = SessionRunner(engines, model="m")
    item = image_item({"type": "input_image", "image_url": RED_PIXEL})["item"]
    received = await run_turn(
        runner, [{"type": "response.create", "response": {"conversation": "none", "input": [item]}}]
    )
    assert received[-1]["type"] == "error"
    assert received[-1]["error"]["param"] == "response.input[0].content[0].type"
    assert "response.created" not in [e["type"] for e in received]


@pytest.mark.parametrize("url", [None, "https://example.com/cat.png", "data:text/plain,hi"])
async def test_an_image_must_be_a_data_url(backend: VisionBackend, url: str | None) -> None:
    llm = OpenAICompatibleLlm(backend.url, "vision")
    engines = dataclasses.replace(build_engines(Settings(engines="fake")), llm=llm)
    runner = SessionRunner(engines, model="m")
    part: dict[str, Any] = {"type": "input_image"}
    if url is not None:
        part["image_url"] = url
    received = await run_turn(runner, [image_item(part)])
    assert received[-1]["type"] == "error"
    assert received[-1]["error"]["param"] == "item.content[0].image_url"
    assert backend.bodies == []
    await llm.aclose()


def test_the_request_carries_an_image_only_message() -> None:
    request = GenerationRequest(
        messages=(ChatMessage(role="user", content="", images=(ImagePart(RED_PIXEL),)),)
    )
    body = OpenAICompatibleLlm("http://127.0.0.1:9/v1", "m").payload(request)
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": RED_PIXEL}}]}
    ]

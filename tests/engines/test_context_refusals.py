"""A backend's refusal of a prompt past its context, in the words each server uses: the
OpenAI-compatible LLM learns the context size and the prompt's real tokens from it and sends
the conversation once more, truncated. The peer is a loopback aiohttp server that refuses as
vLLM or llama.cpp's llama-server do (their messages copied from their refusals), so these run
fast; ``test_truncation_external.py`` has the real llama-cpp-python server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from hark.engines.llm import ChatMessage, Finished, GenerationRequest, TextDelta
from hark.engines.llm.openai_compatible import LlmError, OpenAICompatibleLlm

from .conftest import scripted_peer

N_CTX = 512
# What the peer takes a message for: more than hark's estimate, as a refusal may show.
TOKENS_PER_MESSAGE = 40


def vllm_refusal(tokens: int) -> dict[str, Any]:
    return {
        "object": "error",
        "message": (
            f"This model's maximum context length is {N_CTX} tokens. However, you requested "
            f"{tokens + 16} tokens ({tokens} in the messages, 16 in the completion). Please "
            "reduce the length of the messages or completion."
        ),
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def llama_server_refusal(tokens: int) -> dict[str, Any]:
    return {
        "error": {
            "code": 400,
            "message": (
                f"request ({tokens} tokens) exceeds the available context size ({N_CTX} "
                "tokens), try increasing it"
            ),
            "type": "exceed_context_size_error",
            "n_prompt_tokens": tokens,
            "n_ctx": N_CTX,
        }
    }


@dataclass
class Peer:
    """Refuses a prompt past ``N_CTX`` (counting ``TOKENS_PER_MESSAGE`` a message) with
    ``refusal``, else streams a short reply; records each request's messages."""

    refusal: Any
    requests: list[list[dict[str, Any]]] = field(default_factory=list)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body["messages"])
        tokens = TOKENS_PER_MESSAGE * len(body["messages"])
        if tokens + body.get("max_tokens", 0) > N_CTX:
            return web.json_response(self.refusal(tokens), status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for choice in ({"delta": {"content": "Paris."}}, {"delta": {}, "finish_reason": "stop"}):
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, **choice}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture(params=[vllm_refusal, llama_server_refusal], ids=["vllm", "llama-server"])
async def peer(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Peer, str]]:
    recorder = Peer(request.param)
    async with scripted_peer("/chat/completions", recorder.completions) as url:
        yield recorder, url


def conversation() -> tuple[ChatMessage, ...]:
    messages = [ChatMessage("system", "Answer in one short sentence.")]
    for t in range(15):
        messages.append(ChatMessage("user", f"Box {t} holds {t * 7} red marbles."))
        messages.append(ChatMessage("assistant", "Noted."))
    messages.append(ChatMessage("user", "What is the capital of France?"))
    return tuple(messages)


async def test_a_refusal_teaches_the_context_and_the_prompt_is_sent_again_shorter(
    peer: tuple[Peer, str],
) -> None:
    recorder, url = peer
    llm = OpenAICompatibleLlm(url, "m")
    try:
        request = GenerationRequest(conversation(), max_tokens=16)
        events = [event async for event in llm.generate(request)]
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Paris."
        assert isinstance(events[-1], Finished)
        first, second = recorder.requests
        assert len(first) == len(conversation())
        # Cut to fit what the refusal said, keeping the instructions and the question.
        assert TOKENS_PER_MESSAGE * len(second) + 16 <= N_CTX
        assert second[0] == first[0] and second[-1] == first[-1]
        assert llm.context_tokens == N_CTX
        # Now that the size and the real tokens are known, the next fits at the first try.
        [event async for event in llm.generate(request)]
        assert len(recorder.requests) == 3
        assert TOKENS_PER_MESSAGE * len(recorder.requests[2]) + 16 <= N_CTX
    finally:
        await llm.aclose()


async def test_a_refusal_that_is_not_about_the_context_is_not_retried() -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "model not found"}}, status=400)

    async with scripted_peer("/chat/completions", refuse) as url:
        llm = OpenAICompatibleLlm(url, "m")
        try:
            with pytest.raises(LlmError, match="model not found"):
                [event async for event in llm.generate(GenerationRequest(conversation()))]
            assert llm.context_tokens is None
        finally:
            await llm.aclose()


async def test_an_empty_answer_names_the_context_option() -> None:
    async def empty(request: web.Request) -> web.StreamResponse:
        # llama-cpp-python's server, streaming, for a prompt past its context.
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response

    async with scripted_peer("/chat/completions", empty) as url:
        llm = OpenAICompatibleLlm(url, "m")
        try:
            with pytest.raises(LlmError, match="--llm-context-tokens") as failure:
                [event async for event in llm.generate(GenerationRequest(conversation()))]
            assert not failure.value.context_exceeded
        finally:
            await llm.aclose()

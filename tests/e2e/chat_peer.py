"""A strict, scripted OpenAI-compatible chat-completions server for end-to-end tests.

It stands in for ``--llm-url``: hark sends it the rendered prompt, and it streams back what
its script says, in OpenAI's wire format. It is strict about the order of tool messages, as
vLLM's tool parsers, Mistral's tokenizer and several chat templates are: every assistant
message with ``tool_calls`` must be followed at once by one ``tool`` message per call (and
nothing else until all are answered), and a ``tool`` message must answer a call just made.
A prompt that breaks the order gets a 400 with OpenAI's error body, and is recorded.

The script: a last message that is a tool result is answered with ``Done: <result>``; a last
user message that names one of ``calls``' keywords, when the tool is offered, calls it; any
other is answered with ``reply``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.helpers.net import free_port
from tests.servers import hark_serve

from .conftest import API_KEY

MODEL = "strict-peer"


def order_problem(messages: list[dict[str, Any]]) -> str | None:
    """Why a strict backend would refuse ``messages``, or None."""
    waiting: list[str] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in waiting:
                return f"messages[{index}]: tool message for {call_id!r}, which no call awaits"
            waiting.remove(call_id)
            continue
        if waiting:
            return f"messages[{index}]: {role} message before the results of {waiting}"
        if role == "assistant":
            waiting = [call["id"] for call in message.get("tool_calls") or []]
    if waiting:
        return f"the prompt ends before the results of {waiting}"
    return None


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-peer",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


@dataclass
class ChatPeer:
    """The scripted server; ``requests`` holds every request body, ``refused`` why each
    refused one was refused."""

    calls: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    reply: str = "Hello there."
    requests: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        return app

    def script(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks answering ``body``."""
        messages = body["messages"]
        last = messages[-1] if messages else {}
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        yield _chunk({"role": "assistant", "content": ""})
        if last.get("role") == "user":
            said = _text(last).lower()
            for keyword, (name, arguments) in self.calls.items():
                if keyword in said and name in offered:
                    call = {
                        "index": 0,
                        "id": f"call_peer{len(self.requests)}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                    yield _chunk({"tool_calls": [call]})
                    yield _chunk({}, "tool_calls")
                    return
        text = f"Done: {_text(last)}" if last.get("role") == "tool" else self.reply
        yield _chunk({"content": text})
        yield _chunk({}, "stop")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        problem = order_problem(body["messages"])
        if problem is not None:
            self.refused.append(problem)
            error = {"message": problem, "type": "invalid_request_error", "param": "messages"}
            return web.json_response({"error": {**error, "code": None}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in self.script(body):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@contextlib.contextmanager
def running(peer: ChatPeer, host: str = "127.0.0.1") -> Iterator[str]:
    """``peer`` served on a loopback port by a thread of its own (hark, started by the test
    with ``--llm-url``, checks it while the test waits); yields the ``--llm-url``."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(peer.app())
    port = free_port()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()

    thread = threading.Thread(target=loop.run_forever, name="chat peer", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@contextlib.contextmanager
def hark_with_peer(peer: ChatPeer, log: Path, args: Sequence[str] = ()) -> Iterator[int]:
    """`hark serve --engines fake` (real Silero VAD, scripted ASR and TTS) with ``peer`` as
    its LLM and ``args`` besides, ready; yields its port."""
    with running(peer) as llm_url:
        options = ["--engines", "fake", "--llm-url", llm_url, "--llm-model", MODEL, *args]
        with hark_serve(options, log, env={"HARK_API_KEYS": API_KEY}) as port:
            yield port

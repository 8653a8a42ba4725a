"""End to end: asynchronous function calling (issue 28, point 5) with the official `openai` SDK.
The user speaks while a function call is pending, and the output comes after that turn. On a
strict chat-completions peer (``chat_peer``: it refuses a prompt whose tool messages do not
follow their call at once, as vLLM's tool parsers and several chat templates do) and on the
embedded model, every response completes, with no `error`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.streams import of_type
from tests.servers import hark_serve

from .chat_peer import ChatPeer, hark_with_peer
from .conftest import API_KEY, Server, artifact, events_until

pytestmark = pytest.mark.slow

TIME: Any = {
    "type": "function",
    "name": "get_time",
    "description": "The time in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def peer() -> ChatPeer:
    return ChatPeer(calls={"time": ("get_time", {"city": "Paris"})})


@pytest.fixture(scope="module")
def peer_server(peer: ChatPeer) -> Iterator[Server]:
    log = artifact("e2e-async-calls-server.log")
    with hark_with_peer(peer, log) as port:
        yield Server("127.0.0.1", port, log)


async def say(conn: Any, text: str, **response: Any) -> Any:
    """A user message and a response for it; the ``response.done``'s response."""
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create(response=response or None)
    events: list[Any] = [e async for e in events_until(conn, "response.done", 180)]
    assert of_type(events, "error") == []
    return events[-1].response


async def conversation(server: Server, **response: Any) -> list[Any]:
    """The asynchronous turn: a call, a question while it is pending, then its output (the
    last two responses with ``response``'s settings)."""
    async with server.client().realtime.connect(model="gpt-realtime") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                "tools": [TIME],
            }
        )
        [_ async for _ in events_until(conn, "session.updated", 30)]
        asked = await say(conn, "What time is it in Paris?", tool_choice="required")
        (call,) = asked.output
        assert call.type == "function_call" and call.name == "get_time"
        meanwhile = await say(
            conn, "While you look: is it raining?", tool_choice="none", **response
        )
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call_id, "output": "noon"}
        )
        last: Any = {"tool_choice": "none", **response}
        await conn.response.create(response=last)
        events: list[Any] = [e async for e in events_until(conn, "response.done", 180)]
        assert of_type(events, "error") == []
        return [asked, meanwhile, events[-1].response]


async def test_a_strict_backend_takes_every_prompt(peer_server: Server, peer: ChatPeer) -> None:
    asked, meanwhile, answered = await conversation(peer_server)
    assert peer.refused == []
    assert [r.status for r in (asked, meanwhile, answered)] == ["completed"] * 3
    assert meanwhile.output[0].content[0].text == "Hello there."
    # The late output is the last thing the model reads, and it answers with it.
    assert answered.output[0].content[0].text == "Done: noon"


@pytest.fixture(scope="module")
def embedded() -> Iterator[Server]:
    """`hark serve` on the embedded models, with stage limits a busy machine cannot reach
    (what is tested is that the model is given a prompt it reads, not how fast)."""
    log = artifact("e2e-async-calls-embedded.log")
    limits = ["--llm-first-token-timeout", "600", "--llm-token-timeout", "600"]
    with hark_serve(limits, log, env={"HARK_API_KEYS": API_KEY}) as port:
        yield Server("127.0.0.1", port, log)


async def test_the_embedded_model_answers_every_turn(embedded: Server) -> None:
    responses = await conversation(embedded, max_output_tokens=24)
    assert all(r.status in ("completed", "incomplete") for r in responses)
    assert [o.type for r in responses[1:] for o in r.output] == ["message", "message"]

"""The async driver: engine work, cancellation and the end of a session."""

from __future__ import annotations

import asyncio
import json

from hark.config import Settings
from hark.engines.registry import build_engines
from hark.session.runner import SessionRunner


async def test_expired_session_sends_the_error_then_ends() -> None:
    now = [1000.0]
    runner = SessionRunner(build_engines(Settings(engines="fake")), model="m", clock=lambda: now[0])
    await runner.start()
    now[0] += 3600
    runner.receive_text(json.dumps({"type": "session.update", "session": {}}))
    received = []

    async def drain() -> None:
        async for text in runner.outgoing():
            received.append(json.loads(text))

    await asyncio.wait_for(drain(), 10)
    assert [e["type"] for e in received] == ["session.created", "error"]
    assert received[1]["error"]["code"] == "session_expired"
    await runner.close()


async def test_text_turn_through_the_engines() -> None:
    runner = SessionRunner(build_engines(Settings(engines="fake")), model="m")
    await runner.start()
    for event in (
        {"type": "session.update", "session": {"output_modalities": ["text"]}},
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            },
        },
        {"type": "response.create"},
    ):
        runner.receive_text(json.dumps(event))
    texts = []

    async def until_done() -> None:
        async for text in runner.outgoing():
            event = json.loads(text)
            if event["type"] == "response.output_text.delta":
                texts.append(event["delta"])
            if event["type"] == "response.done":
                assert event["response"]["status"] == "completed"
                return

    await asyncio.wait_for(until_done(), 10)
    assert "".join(texts) == "The capital of France is Paris."
    await runner.close()

"""``hark bench fuzz``: its frames, a run against ``hark serve --engines fake``, and a server
that leaves a session hanging."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import WSMsgType, web

from hark.bench.fuzz import FuzzConfig, FuzzRun, KnownIds, fuzz_frame, mutate, valid_event
from hark.protocol import client_events as ce
from tests.servers import hark_serve


def test_valid_events_decode_and_name_known_ids() -> None:
    rng = random.Random(3)
    known = KnownIds()
    known.learn({"type": "conversation.item.added", "item": {"id": "item_real"}})
    known.learn({"type": "response.created", "response": {"id": "resp_real"}})
    kinds = set()
    named = set()
    for _ in range(3000):
        event = valid_event(rng, known)
        kinds.add(ce.EVENT_TYPE[type(ce.decode_client_event(json.dumps(event)))])
        named |= {event.get("item_id"), event.get("response_id")}
    assert kinds == set(ce.CLIENT_EVENT_TYPES) - {"transcription_session.update"}
    assert {"item_real", "resp_real"} <= named


def test_mutations_are_not_the_event() -> None:
    rng = random.Random(4)
    event = {"type": "input_audio_buffer.commit"}
    frames = [mutate(rng, event) for _ in range(500)]
    assert any(isinstance(f, bytes) for f in frames)
    texts = [f for f in frames if isinstance(f, str)]
    assert json.dumps(event) not in texts
    rejected = 0
    for text in texts:
        try:
            ce.decode_client_event(text)
        except ce.DecodeError:
            rejected += 1
    # Some mutations still decode (an unknown field removed, an event_id added); most do not.
    assert rejected > len(texts) // 2
    assert all(isinstance(fuzz_frame(rng, KnownIds()), str | bytes) for _ in range(200))


@pytest.mark.slow
def test_command_against_hark_serve(tmp_path: Path) -> None:
    """A short run against a real server on the fake engines: every frame sent, no crash, no
    hung session, memory sampled, normal turns timed before and during."""
    json_path = tmp_path / "fuzz.json"
    log = tmp_path / "server.log"
    with hark_serve(["--engines", "fake"], log, without=("HARK_API_KEYS",), ready_s=120) as port:
        command = [sys.executable, "-m", "hark.cli", "bench", "fuzz"]
        command += ["--url", f"ws://127.0.0.1:{port}", "--events", "6000", "--sessions", "3"]
        command += ["--turns-before", "5", "--hang-s", "30", "--seed", "1"]
        command += ["--json", str(json_path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hung sessions 0" in done.stdout
    report = json.loads(json_path.read_text())
    assert report["events_sent"] == 6000
    assert (report["crashes"], report["crash"]) == (0, None)
    assert (report["hung_sessions"], report["hung"]) == (0, [])
    assert report["slow_turns"] >= 0 and report["rate_per_session"] is None
    sessions = report["sessions"]
    assert sessions["concurrent"] == 3
    assert sessions["opened"] >= 3
    assert sessions["opened"] == sessions["closed_by_server"] + sessions["closed_by_client"]
    assert report["probes"]["sent"] >= 6000 // 500 - 3
    assert report["probes"]["answered"] == report["probes"]["sent"]
    assert report["errors"] > 0
    assert report["server_events"] > report["errors"]
    memory = report["memory_mib"]
    assert len(memory["samples"]) >= 2 and memory["first"] > 0 and memory["max"] >= memory["last"]
    turns = report["turn_ms"]
    assert turns["before"]["n"] == 5
    assert turns["during"]["n"] >= 1
    assert 0 < turns["during"]["p50"] <= turns["during"]["p99"]


@pytest.fixture
async def deaf_server() -> AsyncIterator[str]:
    """A WebSocket server that holds normal turns but never answers anything else: every
    fuzzing session it has is hung."""

    async def realtime(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        async for message in ws:
            if message.type is WSMsgType.TEXT and message.data == '{"type": "response.create"}':
                await ws.send_json({"type": "response.done"})
        return ws

    app = web.Application()
    app.router.add_get("/v1/realtime", realtime)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_session_that_never_answers_is_hung(deaf_server: str) -> None:
    # Seeded: each of the two sessions then sends more than the 500 frames after which it
    # probes (its budget is random, 200 to 20,000 frames, and one under 500 never probed).
    config = FuzzConfig(
        url=deaf_server, key="k", events=1200, sessions=2, hang_s=0.5, turns_before=2, seed=1
    )
    report = await FuzzRun(config).run()
    assert report["crashes"] == 0
    assert report["hung_sessions"] >= 2
    assert report["probes"]["answered"] == 0
    assert report["memory_mib"]["samples"] == []

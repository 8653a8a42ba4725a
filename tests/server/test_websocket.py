"""The WebSocket transport: frame sizes, who closes, and that closing ends the session."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import aiohttp
import pytest
from aiohttp import web

import hark.transports.call
import hark.transports.websocket
from hark.config import Settings
from hark.engines.fake import FakeAsr, FakeTts
from hark.engines.registry import Engines
from hark.engines.vad.batcher import BatchedSileroVad
from hark.observability.session_metrics import SessionMetrics
from hark.protocol.limits import MAX_APPEND_BYTES, MAX_MESSAGE_BYTES
from hark.server.app import create_app, make_runner
from tests.conftest import shared_end_of_turn
from tests.helpers.net import bearer

from .conftest import API_KEY, HangingLlm, StartServer

KEYED = Settings(api_keys=(API_KEY,))
MiB = 1024 * 1024


class StubSession:
    """Records what the transport hands it and answers each text frame with its length, or
    ``{"burst": n, "size": k}`` with n events of about k bytes each; it sends as the runner
    does, through the transport's sender while nothing is queued."""

    opened: ClassVar[list[StubSession]] = []

    def __init__(self, engines: Engines, *, model: str, **_: Any) -> None:
        self.model = model
        self.metrics = SessionMetrics.disabled()
        self.texts: list[str] = []
        # For each text: whether it came outside any task (straight from the frame parser).
        self.from_parser: list[bool] = []
        self.binaries: list[bytes] = []
        self.events: asyncio.Queue[str | None] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.send: Callable[[str], bool] | None = None
        self.sent_now = 0
        self.refused = 0
        StubSession.opened.append(self)

    async def start(self) -> None:
        self.events.put_nowait(json.dumps({"type": "session.created"}))

    def catch_up(self) -> None:
        pass

    def receive_text(self, text: str) -> None:
        self.texts.append(text)
        self.from_parser.append(asyncio.current_task() is None)
        burst = json.loads(text).get("burst") if text.startswith("{") else None
        if burst is None:
            self.emit(json.dumps({"type": "received", "length": len(text)}))
            return
        filler = "x" * json.loads(text)["size"]
        for n in range(burst):
            self.emit(json.dumps({"type": "burst", "n": n, "filler": filler}))

    def emit(self, event: str) -> None:
        if self.send is not None and not self.events.qsize():
            if self.send(event):
                self.sent_now += 1
                return
            self.refused += 1
        self.events.put_nowait(event)

    def send_with(
        self, send: Callable[[str], bool] | None, stalled: Callable[[str], None] | None = None
    ) -> None:
        self.send = send

    def receive_bytes(self, data: bytes) -> None:
        self.binaries.append(data)

    async def outgoing(self) -> AsyncIterator[str]:
        while (event := await self.events.get()) is not None:
            yield event

    async def close(self) -> None:
        self.closed.set()

    # What the server asks of every session it runs, besides the transport's part.
    generations_running = 0

    async def end(self, message: str, code: str, reason: str) -> None:
        self.emit(json.dumps({"type": "error", "error": {"message": message, "code": code}}))
        self.events.put_nowait(None)
        await self.close()


@pytest.fixture
def stub_sessions(monkeypatch: pytest.MonkeyPatch) -> list[StubSession]:
    StubSession.opened = []
    # Every session's runner is made by the server's CallHost (hark.transports.call).
    monkeypatch.setattr(hark.transports.call, "SessionRunner", StubSession)
    return StubSession.opened


async def next_json(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), timeout=30)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    event: dict[str, Any] = json.loads(msg.data)
    return event


async def send_oversized(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Send one frame over the server's limit, which may close the connection mid-frame."""
    with contextlib.suppress(ConnectionError):
        await ws.send_str("x" * (MAX_MESSAGE_BYTES + 1))


async def test_large_appends_arrive_and_binary_frames_reach_the_session(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(server.ws_url + "?model=m", headers=bearer(API_KEY)) as ws:
        assert (await next_json(ws))["type"] == "session.created"
        # The largest append a session takes: 15 MiB of base64.
        audio = "A" * MAX_APPEND_BYTES
        frame = json.dumps({"type": "input_audio_buffer.append", "audio": audio})
        await ws.send_str(frame)
        assert await next_json(ws) == {"type": "received", "length": len(frame)}
        await ws.send_bytes(b"\x00\x01")
        await ws.send_str("{}")
        assert (await next_json(ws))["length"] == 2
    session = stub_sessions[0]
    assert session.model == "m"
    assert session.texts[0] == frame
    assert session.binaries == [b"\x00\x01"]
    await asyncio.wait_for(session.closed.wait(), timeout=10)


async def test_text_frames_go_to_the_session_from_the_parser_and_in_order(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(server.ws_url, headers=bearer(API_KEY)) as ws:
        # Frames sent before the session has started wait in aiohttp's queue; pings and
        # binary frames in between still go through the reader loop.
        for i in range(40):
            await ws.send_str(json.dumps({"n": i}))
            if i % 10 == 5:
                await ws.ping()
                await ws.send_bytes(b"\x00")
        assert (await next_json(ws))["type"] == "session.created"
        for i in range(40, 80):
            await ws.send_str(json.dumps({"n": i}))
        for _ in range(80):
            assert (await next_json(ws))["type"] == "received"
    session = stub_sessions[0]
    assert [json.loads(text)["n"] for text in session.texts] == list(range(80))
    # Once the queue has been received, appends are handled in the data_received that
    # parsed them, with no task behind them, and their answers are written right there.
    assert all(session.from_parser[40:])
    assert session.sent_now >= 40
    assert session.binaries == [b"\x00"] * 4


async def test_events_for_a_peer_that_stops_reading_queue_and_all_arrive_in_order(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(server.ws_url, headers=bearer(API_KEY)) as ws:
        assert (await next_json(ws))["type"] == "session.created"
        # 32 MiB at once, while this client reads nothing: far more than the sockets
        # buffer, so the server's sender must refuse and the rest wait in the queue.
        await ws.send_str(json.dumps({"burst": 512, "size": 64 * 1024}))
        session = stub_sessions[0]
        async with asyncio.timeout(30):
            while True:
                if session.refused:
                    break
                await asyncio.sleep(0.02)
        assert session.refused and session.sent_now
        received = [(await next_json(ws))["n"] for _ in range(512)]
        assert received == list(range(512))
        # Once the queue is empty, events are written at once again.
        sent_before = session.sent_now
        await ws.send_str("{}")
        assert (await next_json(ws)) == {"type": "received", "length": 2}
        assert session.sent_now == sent_before + 1


async def test_an_offer_of_compression_is_declined(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
) -> None:
    """Base64 audio barely deflates: the server answers without permessage-deflate, and
    frames still arrive whole."""
    server = await start_server(KEYED, fake_engines)
    url = server.ws_url + "?model=m"
    async with http.ws_connect(url, headers=bearer(API_KEY), compress=15) as ws:
        assert ws.compress == 0
        assert (await next_json(ws))["type"] == "session.created"
        await ws.send_str("{}")
        assert await next_json(ws) == {"type": "received", "length": 2}


async def test_a_frame_over_the_limit_closes_with_1009_and_ends_the_session(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(server.ws_url + "?model=m", headers=bearer(API_KEY)) as ws:
        await next_json(ws)
        await send_oversized(ws)
        msg = await asyncio.wait_for(ws.receive(), timeout=30)
        # The server may drop the connection before the client finished sending.
        if msg.type is aiohttp.WSMsgType.CLOSE:
            assert msg.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        else:
            assert msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
    await asyncio.wait_for(stub_sessions[0].closed.wait(), timeout=10)
    assert stub_sessions[0].texts == []


async def test_the_session_ending_closes_the_socket_normally(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(server.ws_url + "?model=m", headers=bearer(API_KEY)) as ws:
        await next_json(ws)
        stub_sessions[0].events.put_nowait(json.dumps({"type": "error"}))
        stub_sessions[0].events.put_nowait(None)
        assert (await next_json(ws))["type"] == "error"
        msg = await asyncio.wait_for(ws.receive(), timeout=30)
        assert msg.type is aiohttp.WSMsgType.CLOSE
        assert msg.data == aiohttp.WSCloseCode.OK
    await asyncio.wait_for(stub_sessions[0].closed.wait(), timeout=10)


async def test_one_session_closing_leaves_another_running(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(server.ws_url + "?model=a", headers=bearer(API_KEY)) as first:
        await next_json(first)
        async with http.ws_connect(server.ws_url + "?model=b", headers=bearer(API_KEY)) as ws:
            await next_json(ws)
            await send_oversized(ws)
            await asyncio.wait_for(stub_sessions[1].closed.wait(), timeout=10)
        await first.send_str("still here")
        assert (await next_json(first))["length"] == len("still here")
        assert not stub_sessions[0].closed.is_set()


async def test_server_shutdown_tells_sessions_why_and_closes_them(
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
) -> None:
    runner = make_runner(create_app(KEYED, fake_engines))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    ws = await http.ws_connect(f"ws://{host}:{port}/v1/realtime?model=m", headers=bearer(API_KEY))
    await next_json(ws)
    cleanup = asyncio.create_task(runner.cleanup())
    # The client hears why, then the session ends and its socket closes normally.
    error = await next_json(ws)
    assert (error["type"], error["error"]["code"]) == ("error", "server_shutting_down")
    msg = await asyncio.wait_for(ws.receive(), timeout=30)
    assert msg.type is aiohttp.WSMsgType.CLOSE
    assert msg.data == aiohttp.WSCloseCode.OK
    await ws.close()
    await asyncio.wait_for(cleanup, timeout=30)
    assert stub_sessions[0].closed.is_set()


async def test_disconnect_cancels_the_sessions_engine_work(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    llm = HangingLlm()
    engines = Engines(
        vad=BatchedSileroVad(), asr=FakeAsr(), llm=llm, tts=FakeTts(), turn=shared_end_of_turn()
    )
    server = await start_server(KEYED, engines)
    ws = await http.ws_connect(server.ws_url + "?model=gpt-realtime", headers=bearer(API_KEY))
    assert (await next_json(ws))["type"] == "session.created"
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Tell me a long story."}],
    }
    await ws.send_json({"type": "conversation.item.create", "item": item})
    await ws.send_json({"type": "response.create"})
    await asyncio.wait_for(llm.started.wait(), timeout=30)
    await ws.close()
    await asyncio.wait_for(llm.cancelled.wait(), timeout=10)


async def test_a_peer_that_does_not_answer_pings_is_closed(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hark.transports.websocket, "HEARTBEAT_SECONDS", 0.3)
    server = await start_server(KEYED, fake_engines)
    # autoping=False: the client neither answers the server's pings nor sends anything.
    ws = await http.ws_connect(server.ws_url + "?model=m", headers=bearer(API_KEY), autoping=False)
    try:
        assert (await next_json(ws))["type"] == "session.created"
        msg = await asyncio.wait_for(ws.receive(), timeout=30)
        assert msg.type is aiohttp.WSMsgType.PING
        msg = await asyncio.wait_for(ws.receive(), timeout=30)
        assert msg.type is aiohttp.WSMsgType.CLOSE
        assert msg.data == aiohttp.WSCloseCode.GOING_AWAY
    finally:
        await ws.close()
    await asyncio.wait_for(stub_sessions[0].closed.wait(), timeout=10)


async def test_a_quiet_peer_that_answers_pings_stays_and_is_answered(
    start_server: StartServer,
    http: aiohttp.ClientSession,
    fake_engines: Engines,
    stub_sessions: list[StubSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The peer has half the interval to answer a ping: long enough for a busy machine.
    monkeypatch.setattr(hark.transports.websocket, "HEARTBEAT_SECONDS", 1.0)
    server = await start_server(KEYED, fake_engines)
    async with http.ws_connect(
        server.ws_url + "?model=m", headers=bearer(API_KEY), autoping=False
    ) as ws:
        assert (await next_json(ws))["type"] == "session.created"
        # Two pings, each answered: after the first answer the server pings again rather
        # than closing (whatever time the machine took to get there).
        for _ in range(2):
            msg = await asyncio.wait_for(ws.receive(), timeout=30)
            assert msg.type is aiohttp.WSMsgType.PING, msg
            await ws.pong(msg.data)
        # Still open, and the server answers the client's own ping.
        await ws.ping(b"hello")
        msg = await asyncio.wait_for(ws.receive(), timeout=30)
        while msg.type is aiohttp.WSMsgType.PING:
            await ws.pong(msg.data)
            msg = await asyncio.wait_for(ws.receive(), timeout=30)
        assert (msg.type, msg.data) == (aiohttp.WSMsgType.PONG, b"hello")
        assert not stub_sessions[0].closed.is_set()

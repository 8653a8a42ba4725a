"""End to end: remote MCP tools. A real `hark serve` (fake LLM, which calls the first tool
when ``tool_choice`` is ``required``), the official `openai` SDK as the client, and MCP
servers built with the official `mcp` SDK (streamable HTTP) that this test runs on loopback:
listing, a call and its result, approval both ways, a tool that fails, a server that is down
or goes down, and a header the server checks. Credentials never reach hark's log.

The MCP servers listen on 127.0.0.2, the one address hark's egress policy is told to allow
(``--egress-allow``): every other loopback, private or link-local address stays refused.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pydantic
import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from openai.types.realtime import RealtimeMcpApprovalResponseParam
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from starlette.types import ASGIApp, Receive, Scope, Send

from hark.tools.egress import EgressPolicy
from hark.tools.mcp_client import McpCallFailed, McpClients
from hark.tools.mcp_server import McpServer
from tests.helpers.net import free_port
from tests.helpers.streams import of_type
from tests.servers import hark_serve

from .conftest import API_KEY, Server, artifact, events_until

pytestmark = pytest.mark.slow

MODEL = "gpt-realtime"
TOKEN = "tok-e2e-7f3a"
TOWN_KEY = "key-e2e-51c9"
FAKE_REPLY = "The capital of France is Paris."
# How long the client waits for an MCP server's answer: ample for the tools that answer on
# a busy machine; the slow tool never answers.
PATIENCE_S = 5.0
SDK_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
# Where the test's MCP servers listen, and all hark may reach beyond the public internet.
ALLOWED_HOST = "127.0.0.2"


def town() -> MCPServer:
    """An MCP server with a read-only tool that reports the bearer token it was called
    with, one that changes things, and one that always fails."""
    server = MCPServer("town")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def get_weather(city: str, ctx: Context) -> str:
        """The weather in a city."""
        seen = (ctx.headers or {}).get("authorization", "none")
        return f"Sunny in {city}; called with {seen}"

    @server.tool()
    def book_table(name: str) -> str:
        """Book a table at the town's restaurant."""
        return f"Table booked for {name}"

    @server.tool()
    def broken(name: str) -> str:
        """A tool whose kitchen is closed."""
        raise ValueError("the kitchen is closed")

    @server.tool()
    async def slow(name: str) -> str:
        """A tool that never answers: longer than any caller waits (the server's shutdown
        cancels it)."""
        await anyio.Event().wait()
        return "too late"

    return server


class RequireKey:
    """ASGI middleware: HTTP requests without the right ``X-Town-Key`` get 401."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"x-town-key") != self.key:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"wrong key"})
            return
        await self.app(scope, receive, send)


@dataclass
class McpHttpServer:
    """An MCP server on a loopback port, served by uvicorn in a thread."""

    host: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def serve_mcp(host: str = ALLOWED_HOST) -> McpHttpServer:
    port = free_port()
    app = RequireKey(town().streamable_http_app(host=host), TOWN_KEY)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="mcp server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the MCP server did not start"
        time.sleep(0.05)
    return McpHttpServer(host, port, server, thread)


@pytest.fixture
def mcp_server() -> Iterator[McpHttpServer]:
    running = serve_mcp()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fake_server() -> Iterator[Server]:
    """`hark serve --engines fake` (real Silero VAD, the fake ASR, LLM and TTS) that may
    reach ``ALLOWED_HOST``."""
    log = artifact("e2e-mcp-server.log")
    args = ["--engines", "fake", "--egress-allow", ALLOWED_HOST]
    with hark_serve(args, log, env={"HARK_API_KEYS": API_KEY}) as port:
        server = Server("127.0.0.1", port, log)
        yield server
    text = server.log.read_text()
    assert TOKEN not in text and TOWN_KEY not in text, "an MCP credential reached hark's log"


def mcp_tool(url: str, **overrides: Any) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "type": "mcp",
        "server_label": "town",
        "server_url": url,
        "authorization": TOKEN,
        "headers": {"X-Town-Key": TOWN_KEY},
        "require_approval": "never",
    }
    return {**tool, **overrides}


async def collect(conn: Any, stop: str) -> list[Any]:
    """The events until one of type ``stop``; each must be one the `openai` SDK reads (it
    builds them unchecked)."""
    events: list[Any] = [e async for e in events_until(conn, stop, limit_s=60)]
    for event in events:
        SDK_EVENT.validate_python(event.to_dict())
    return events


async def configure(conn: Any, tool: dict[str, Any]) -> list[Any]:
    """A text session with ``tool``; the events until its tools are listed (or not)."""
    assert (await conn.recv()).type == "session.created"
    await conn.session.update(
        session={
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}},
            "tools": [tool],
        }
    )
    events = await collect(conn, "conversation.item.done")
    assert events[0].type == "session.updated"
    return events


async def respond(conn: Any, **response: Any) -> list[Any]:
    await conn.response.create(response=response or None)
    return await collect(conn, "response.done")


async def test_tools_are_listed_called_and_the_next_response_reads_the_result(
    fake_server: Server, mcp_server: McpHttpServer
) -> None:
    tool = mcp_tool(mcp_server.url, allowed_tools={"read_only": True})
    async with fake_server.client().realtime.connect(model=MODEL) as conn:
        listing = await configure(conn, tool)
        echoed = listing[0].session.tools[0]
        assert echoed.server_label == "town" and echoed.authorization is None
        assert [e.type for e in listing[1:]] == [
            "conversation.item.added",
            "mcp_list_tools.in_progress",
            "mcp_list_tools.completed",
            "conversation.item.done",
        ]
        listed = listing[-1].item
        assert listed.type == "mcp_list_tools"
        assert [t.name for t in listed.tools] == ["get_weather"]
        assert listed.tools[0].input_schema["properties"]["city"]["type"] == "string"
        assert listing[2].item_id == listing[3].item_id == listed.id

        events = await respond(conn, tool_choice="required")
        # As with OpenAI, the response that called ends with the call (issue 28, point 1);
        # the client asks for the answer, as the JS agents SDK does after every MCP call.
        answered = await respond(conn)
    assert not of_type([*events, *answered], "error")
    types = [e.type for e in events]
    (added,) = of_type(events, "response.output_item.added")
    assert added.item.type == "mcp_call" and added.item.name == "get_weather"
    deltas = of_type(events, "response.mcp_call_arguments.delta")
    (arguments,) = of_type(events, "response.mcp_call_arguments.done")
    assert "".join(d.delta for d in deltas) == arguments.arguments == '{"city": "example"}'
    assert types.index("response.mcp_call.in_progress") < types.index("response.mcp_call.completed")
    (done,) = [e for e in of_type(events, "response.output_item.done") if e.item.type == "mcp_call"]
    # The server ran the tool, and saw the session's authorization as a bearer token.
    assert done.item.output == f"Sunny in example; called with Bearer {TOKEN}"
    assert done.item.error is None
    assert types[-4:] == [
        "response.mcp_call.completed",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    response = events[-1].response
    assert response.status == "completed"
    assert [o.type for o in response.output] == ["mcp_call"]
    assert not of_type(events, "response.output_text.done")
    # One answer, in the next response.
    assert [o.type for o in answered[-1].response.output] == ["message"]
    (text,) = of_type(answered, "response.output_text.done")
    assert text.text == FAKE_REPLY


async def test_approval_both_ways(fake_server: Server, mcp_server: McpHttpServer) -> None:
    tool = mcp_tool(mcp_server.url, allowed_tools=["book_table"], require_approval="always")
    async with fake_server.client().realtime.connect(model=MODEL) as conn:
        await configure(conn, tool)
        for approve in (True, False):
            asked = await respond(conn, tool_choice="required")
            assert not of_type(asked, "response.mcp_call.in_progress")
            (request,) = [o for o in asked[-1].response.output]
            assert request.type == "mcp_approval_request"
            assert (request.name, request.arguments) == ("book_table", '{"name": "example"}')
            assert asked[-1].response.status == "completed"

            answer = RealtimeMcpApprovalResponseParam(
                id=f"approval_{request.id}",
                type="mcp_approval_response",
                approval_request_id=request.id,
                approve=approve,
                reason=None if approve else "not today",
            )
            await conn.conversation.item.create(item=answer)
            stored = await collect(conn, "conversation.item.done")
            assert stored[-1].item.type == "mcp_approval_response"
            assert stored[-1].item.id == answer["id"]
            if approve:
                # The approved call runs with no response.create; the client asks for the
                # answer once it has completed.
                ran = await collect(conn, "conversation.item.done")
                (call,) = [e.item for e in ran if e.type == "conversation.item.done"]
                assert call.type == "mcp_call"
                assert call.approval_request_id == request.id
                assert call.output == "Table booked for example"
                (completed,) = of_type(ran, "response.mcp_call.completed")
                assert completed.item_id == call.id
            answered = await respond(conn)
            assert not of_type(answered, "response.mcp_call.in_progress")
            assert [o.type for o in answered[-1].response.output] == ["message"]


async def test_a_tool_that_fails_fails_its_call_and_the_model_goes_on(
    fake_server: Server, mcp_server: McpHttpServer
) -> None:
    tool = mcp_tool(mcp_server.url, allowed_tools=["broken"])
    async with fake_server.client().realtime.connect(model=MODEL) as conn:
        await configure(conn, tool)
        events = await respond(conn, tool_choice="required")
        answered = await respond(conn)
    assert of_type(events, "response.mcp_call.failed")
    assert not of_type(events, "response.mcp_call.completed")
    (call,) = [o for o in events[-1].response.output if o.type == "mcp_call"]
    assert call.error.type == "tool_execution_error"
    assert call.output is None
    assert events[-1].response.status == "completed"
    assert [o.type for o in answered[-1].response.output] == ["message"]


async def test_a_server_that_checks_a_header_refuses_the_wrong_one(
    fake_server: Server, mcp_server: McpHttpServer
) -> None:
    tool = mcp_tool(mcp_server.url, headers={"X-Town-Key": "not-the-key"})
    async with fake_server.client().realtime.connect(model=MODEL) as conn:
        listing = await configure(conn, tool)
        assert "mcp_list_tools.failed" in [e.type for e in listing]
        assert listing[-1].item.tools == []
        # The session goes on, without the server's tools.
        events = await respond(conn)
    assert events[-1].response.status == "completed"
    assert [o.type for o in events[-1].response.output] == ["message"]


async def test_a_server_that_is_down_fails_its_list_and_the_session_goes_on(
    fake_server: Server,
) -> None:
    tool = mcp_tool(f"http://{ALLOWED_HOST}:{free_port()}/mcp")
    async with fake_server.client().realtime.connect(model=MODEL) as conn:
        listing = await configure(conn, tool)
        assert [e.type for e in listing[1:]] == [
            "conversation.item.added",
            "mcp_list_tools.in_progress",
            "mcp_list_tools.failed",
            "conversation.item.done",
        ]
        events = await respond(conn)
    assert events[-1].response.status == "completed"


async def test_a_server_that_goes_down_fails_the_call_and_the_model_goes_on(
    fake_server: Server,
) -> None:
    running = serve_mcp()
    try:
        tool = mcp_tool(running.url, allowed_tools=["get_weather"])
        async with fake_server.client().realtime.connect(model=MODEL) as conn:
            await configure(conn, tool)
            running.stop()
            events = await respond(conn, tool_choice="required")
            answered = await respond(conn)
    finally:
        running.stop()
    assert of_type(events, "response.mcp_call.failed")
    (call,) = [o for o in events[-1].response.output if o.type == "mcp_call"]
    assert call.error.type == "http_error", call.error
    assert call.error.code == 502
    assert events[-1].response.status == "completed"
    assert [o.type for o in answered[-1].response.output] == ["message"]


async def test_addresses_the_operator_did_not_allow_are_refused(fake_server: Server) -> None:
    # A real MCP server on 127.0.0.1, reachable (by a name too) but not allowed.
    running = serve_mcp("127.0.0.1")
    try:
        for url in (
            running.url,
            f"http://localhost:{running.port}/mcp",
            f"http://[::ffff:127.0.0.1]:{running.port}/mcp",
            f"http://10.1.2.3:{running.port}/mcp",
            "http://169.254.169.254/mcp",
        ):
            async with fake_server.client().realtime.connect(model=MODEL) as conn:
                listing = await configure(conn, mcp_tool(url))
                assert "mcp_list_tools.failed" in [e.type for e in listing], url
                assert listing[-1].item.tools == []
                (error,) = [e for e in await collect(conn, "error") if e.type == "error"]
                assert error.error.type == "invalid_request_error"
                assert error.error.code == "mcp_list_tools_failed"
                assert "Error retrieving tool list from MCP server: 'town'" in error.error.message
                assert (
                    "not allowed" in error.error.message and "--egress-allow" in error.error.message
                )
                # The session goes on, without the server's tools.
                events = await respond(conn)
                assert events[-1].response.status == "completed", url
    finally:
        running.stop()


async def test_a_name_is_checked_again_on_every_connection(
    mcp_server: McpHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: a name that answered an allowed address, then a refused one."""
    answer = [ALLOWED_HOST]
    loop = asyncio.get_running_loop()
    resolve = loop.getaddrinfo

    async def getaddrinfo(host: str, port: int, **options: Any) -> list[Any]:
        if host != "mcp.rebinding.example":
            return await resolve(host, port, **options)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (answer[0], port))]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    clients = McpClients(timeout_s=PATIENCE_S, policy=EgressPolicy.parse([ALLOWED_HOST]))
    url = f"http://mcp.rebinding.example:{mcp_server.port}/mcp"
    server = McpServer("town", url, headers={"X-Town-Key": TOWN_KEY})
    assert "get_weather" in [t.name for t in await clients.connection(server).list_tools()]
    # The name now points at 127.0.0.1 (where a server of the operator's could listen): the
    # next connection is refused before it is made.
    answer[0] = "127.0.0.1"
    await clients.close("town")
    with pytest.raises(McpCallFailed) as refused:
        await clients.connection(server).list_tools()
    assert (refused.value.error.type, refused.value.error.code) == ("http_error", 403)
    assert "mcp.rebinding.example resolves only to addresses" in refused.value.error.message
    await clients.close_all()


async def test_the_client_gives_up_on_a_slow_tool_and_closes_with_the_session(
    mcp_server: McpHttpServer,
) -> None:
    clients = McpClients(timeout_s=PATIENCE_S, policy=EgressPolicy.parse([ALLOWED_HOST]))
    server = McpServer("town", mcp_server.url, headers={"X-Town-Key": TOWN_KEY})
    connection = clients.connection(server)
    assert clients.connection(server) is connection
    names = [t.name for t in await connection.list_tools()]
    assert names == ["get_weather", "book_table", "broken", "slow"]
    with pytest.raises(McpCallFailed) as failed:
        await connection.call_tool("slow", '{"name": "x"}')
    assert (failed.value.error.type, failed.value.error.code) == ("http_error", 504)
    # The connection still serves the next call.
    assert await connection.call_tool("book_table", '{"name": "Ada"}') == "Table booked for Ada"
    with pytest.raises(McpCallFailed) as bad:
        await connection.call_tool("book_table", "[1, 2]")
    assert bad.value.error.type == "tool_execution_error"
    await clients.close_all()
    # A closed session's connection is gone: a new one would connect afresh.
    assert clients.connection(server) is not connection
    await clients.close_all()

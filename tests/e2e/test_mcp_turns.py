"""End to end: MCP turns as OpenAI runs them (issue 28, point 1). A real `hark serve` whose LLM
is a strict, scripted chat-completions peer (``chat_peer``), a real MCP server (the official
`mcp` SDK, as in ``test_mcp_tools``), and two clients that ask for the answer after each MCP
call, as OpenAI needs them to: the JS agents SDK's realtime session (installed from npm,
driven by Node) and the official `openai` SDK. Each question gets one answer, and no `error`.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import function_tool
from agents.mcp import MCPServerStreamableHttp
from agents.realtime import RealtimeAgent, RealtimeSessionModelSettings

from tests.helpers.streams import of_type

from .chat_peer import ChatPeer, hark_with_peer
from .conftest import API_KEY, ARTIFACTS, Server, artifact, events_until
from .test_agents_sdk import conversation
from .test_mcp_tools import ALLOWED_HOST, TOWN_KEY, McpHttpServer, serve_mcp

pytestmark = pytest.mark.slow

AGENTS_JS = Path(__file__).parent / "agents_js"
WEATHER = "What is the weather in Paris?"
TIME = "What time is it in Paris?"
CONCIERGE = "You are the concierge of the town hall. Answer briefly."


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[McpHttpServer]:
    running_server = serve_mcp()
    yield running_server
    running_server.stop()


@pytest.fixture(scope="module")
def peer() -> ChatPeer:
    return ChatPeer(
        calls={
            "weather": ("get_weather", {"city": "Paris"}),
            "time": ("get_time", {"city": "Paris"}),
        }
    )


@pytest.fixture(scope="module")
def server(peer: ChatPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The fake ASR and TTS, the peer as the LLM, a prompt store, and the MCP server's
    address allowed."""
    store = tmp_path_factory.mktemp("prompts")
    (store / "pmpt_concierge.txt").write_text(CONCIERGE)
    args = ["--egress-allow", ALLOWED_HOST, "--prompts", str(store)]
    log = artifact("e2e-mcp-turns-server.log")
    with hark_with_peer(peer, log, args) as port:
        yield Server("127.0.0.1", port, log)


@pytest.fixture(scope="session")
def agents_js() -> Path:
    """A folder holding ``session.mjs`` beside the JS agents SDK, installed from npm at the
    versions ``agents_js/package.json`` pins (once; pytest-xdist workers take turns)."""
    folder = ARTIFACTS / "agents-js"
    folder.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / "agents-js.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = (AGENTS_JS / "package.json").read_text()
        installed = folder / "package.json"
        if not (folder / "node_modules").is_dir() or installed.read_text() != wanted:
            installed.write_text(wanted)
            npm = shutil.which("npm")
            assert npm is not None, "the JS agents SDK test needs Node and npm"
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=folder,
                check=True,
                timeout=600,
            )
        shutil.copy(AGENTS_JS / "session.mjs", folder / "session.mjs")
    return folder


def answers(done: list[dict[str, Any]]) -> list[list[str]]:
    """Each ``response.done``'s output, as item types (a message as its text)."""
    return [
        [
            " ".join(c.get("text") or c.get("transcript") or "" for c in o["content"])
            if o["type"] == "message"
            else o["type"]
            for o in event["response"]["output"]
        ]
        for event in done
    ]


async def test_the_js_agents_sdk_gets_one_answer_per_question(
    server: Server, mcp_server: McpHttpServer, agents_js: Path, peer: ChatPeer
) -> None:
    env = {
        **os.environ,
        "HARK_WS": f"{server.ws}/realtime?model=gpt-realtime",
        "HARK_KEY": API_KEY,
        "MCP_URL": mcp_server.url,
        "MCP_HEADER": f"X-Town-Key={TOWN_KEY}",
        "QUESTIONS": json.dumps([WEATHER, TIME]),
        "PROMPT_ID": "pmpt_concierge",
    }
    node = await asyncio.create_subprocess_exec(
        "node",
        "session.mjs",
        cwd=agents_js,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(node.communicate(), 300)
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()
    records = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
    assert node.returncode == 0, stderr.decode()[-4000:]
    assert records[-1] == {"kind": "closed"}
    events = [r["event"] for r in records if r["kind"] == "event"]
    assert [r for r in records if r["kind"] == "error"] == []
    assert [e for e in events if e["type"] == "error"] == []
    updated = [e for e in events if e["type"] == "session.updated"][-1]["session"]
    # The stored prompt's instructions, the MCP server and the function tool all applied.
    assert updated["instructions"] == CONCIERGE
    assert [t.get("name") or t.get("server_label") for t in updated["tools"]] == [
        "town",
        "get_time",
    ]
    done = [e for e in events if e["type"] == "response.done"]
    assert answers(done) == [
        ["mcp_call"],
        ["Done: Sunny in Paris; called with none"],
        ["function_call"],
        ["Done: noon in Paris"],
        ["Hello there."],
    ]
    assert all(e["response"]["status"] == "completed" for e in done)
    assert peer.refused == []


async def test_the_openai_sdk_asks_after_each_call_and_gets_one_answer(
    server: Server, mcp_server: McpHttpServer, peer: ChatPeer
) -> None:
    tool: Any = {
        "type": "mcp",
        "server_label": "town",
        "server_url": mcp_server.url,
        "headers": {"X-Town-Key": TOWN_KEY},
        "require_approval": "never",
    }
    async with server.client().realtime.connect(model="gpt-realtime") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                "tools": [tool],
            }
        )
        [_ async for _ in events_until(conn, "mcp_list_tools.completed", 60)]
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": WEATHER}],
            }
        )
        await conn.response.create()
        seen: list[Any] = []
        # As OpenAI's clients do: on the call's result, ask for the answer at once.
        async for event in events_until(conn, "response.mcp_call.completed", 60):
            seen.append(event)
        await conn.response.create()
        async for event in events_until(conn, "response.done", 60):
            seen.append(event)
        while len(of_type(seen, "response.done")) < 2:
            seen += [e async for e in events_until(conn, "response.done", 60)]
    assert of_type(seen, "error") == []
    done = [e.to_dict() for e in of_type(seen, "response.done")]
    assert answers(done) == [["mcp_call"], ["Done: Sunny in Paris; called with none"]]


async def test_the_python_agents_sdk_runs_a_stored_prompt_with_mcp_and_a_function_tool(
    server: Server, mcp_server: McpHttpServer, peer: ChatPeer
) -> None:
    """The `openai-agents` SDK's realtime runner takes MCP servers on the client's side (its
    realtime sessions send function tools only): the MCP server's tools are offered as
    function tools, the SDK calls the server itself and sends the output, and asks for the
    answer; beside them a function tool of its own, and the stored prompt's instructions."""

    @function_tool
    async def get_time(city: str) -> str:
        """The time in a city."""
        return f"noon in {city}"

    town = MCPServerStreamableHttp(
        {"url": mcp_server.url, "headers": {"X-Town-Key": TOWN_KEY}}, name="town"
    )
    async with town:
        agent = RealtimeAgent(
            name="Concierge",
            prompt={"id": "pmpt_concierge"},
            tools=[get_time],
            mcp_servers=[town],
        )
        async with conversation(server, agent, RealtimeSessionModelSettings()) as (
            session,
            recorder,
            _,
        ):
            updated = await recorder.wait_for("session.updated", 0)
            assert updated["session"]["instructions"] == CONCIERGE
            offered = {t["name"] for t in updated["session"]["tools"]}
            assert {"get_time", "get_weather"} <= offered
            # (The SDK sends an MCP tool's result as the JSON of its content.)
            for question, answer in (
                (WEATHER, "Sunny in Paris; called with none"),
                (TIME, "noon in Paris"),
            ):
                mark = recorder.mark()
                await session.send_message(question)
                call = await recorder.wait_for("response.done", mark)
                assert answers([call]) == [["function_call"]]
                done = await recorder.wait_for("response.done", recorder.raw.index(call) + 1)
                ((said,),) = answers([done])
                assert said.startswith("Done: ") and answer in said
                assert done["response"]["status"] == "completed"
    assert recorder.errors() == []
    assert peer.refused == []

"""A ``session.update`` never loses configuration (issue 28, point 2).

What OpenAI refuses (an unknown field, a wrong type or value) refuses the whole update, as
with OpenAI. What OpenAI accepts and hark cannot honour (an MCP server reached by connector
or tunnel, a stored prompt hark's store lacks) is set aside with an ``error`` of its own,
and the rest of the update applies: the agents SDKs send the instructions, tools, voice and
prompt in one update, and the agent must not be left on hark's defaults. The newest SDK's
MCP fields (``defer_loading``, ``allowed_callers``) are modelled.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from hark.engines.llm import Finished
from hark.protocol import items as wire
from hark.protocol.session_config import DEFAULT_INSTRUCTIONS, FunctionToolDef, McpToolDef
from hark.session.actions import Generate, ListMcpTools
from hark.session.results import GenerationFinished, McpToolsListed

from .conftest import Driver

SDK_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
WEATHER = wire.McpTool(name="get_weather", description="The weather.", input_schema={})
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}


@pytest.fixture
def driver() -> Iterator[Driver]:
    """The core's driver; every event it made must be one the `openai` SDK reads."""
    driver = Driver()
    yield driver
    for event in driver.events:
        SDK_EVENT.validate_python(event)


def mcp(label: str = "town", **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": label,
        "server_url": "http://127.0.0.1:9/mcp",
        "require_approval": "never",
        **fields,
    }


def update(driver: Driver, session: dict[str, Any]) -> list[dict[str, Any]]:
    return driver.send({"type": "session.update", "event_id": "evt_7", "session": session})


def test_a_connector_is_set_aside_with_its_error_and_the_rest_applies(driver: Driver) -> None:
    connector = {"type": "mcp", "server_label": "mail", "connector_id": "connector_gmail"}
    events = update(
        driver,
        {
            "type": "realtime",
            "instructions": "You are Ada.",
            "tools": [LOOKUP, connector, mcp()],
            "audio": {"output": {"voice": "cedar"}},
        },
    )
    assert driver.types(events)[:2] == ["error", "session.updated"]
    error = events[0]["error"]
    assert error["param"] == "session.tools[1].connector_id"
    assert error["code"] == "unsupported_parameter"
    assert error["event_id"] == "evt_7"
    assert "'mail'" in error["message"] and "rest of the update" in error["message"]
    config = driver.session.config
    assert config.instructions == "You are Ada."
    assert config.audio.output.voice == "cedar"
    assert [type(t) for t in config.tools] == [FunctionToolDef, McpToolDef]
    echoed = events[1]["session"]
    assert [t.get("name") or t["server_label"] for t in echoed["tools"]] == ["lookup", "town"]
    # The server reached by URL is listed as ever.
    assert [a.server.label for a in driver.take(ListMcpTools)] == ["town"]


def test_tool_choice_of_a_server_set_aside_falls_back_to_auto(driver: Driver) -> None:
    tunnel = {"type": "mcp", "server_label": "vault", "tunnel_id": "tun_1"}
    events = update(
        driver,
        {
            "type": "realtime",
            "instructions": "Use the vault.",
            "tools": [tunnel],
            "tool_choice": {"type": "mcp", "server_label": "vault"},
        },
    )
    assert driver.types(events) == ["error", "error", "session.updated"]
    assert [e["error"]["param"] for e in events[:2]] == [
        "session.tools[0].tunnel_id",
        "session.tool_choice.server_label",
    ]
    assert driver.session.config.tool_choice == "auto"
    assert driver.session.config.instructions == "Use the vault."


def test_what_openai_refuses_still_refuses_the_whole_update(driver: Driver) -> None:
    for session, param in (
        ({"instructions": "You are Ada.", "voice_of_god": True}, "session.voice_of_god"),
        (
            {"instructions": "You are Ada.", "tools": [mcp(allowed_callers=["robot"])]},
            "session.tools[0].allowed_callers[0]",
        ),
        ({"instructions": "You are Ada.", "audio": {"output": {"voice": "nova"}}}, None),
    ):
        events = update(driver, {"type": "realtime", **session})
        assert driver.types(events) == ["error"]
        if param is not None:
            assert events[0]["error"]["param"] == param
        assert driver.session.config.instructions == DEFAULT_INSTRUCTIONS


def test_defer_loading_and_allowed_callers_are_taken_and_echoed(driver: Driver) -> None:
    events = update(
        driver,
        {
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}},
            "tools": [
                mcp("town", defer_loading=True, allowed_callers=["direct", "programmatic"]),
                mcp("lab", server_url="http://127.0.0.1:8/mcp", allowed_callers=["programmatic"]),
            ],
        },
    )
    assert driver.types(events)[0] == "session.updated"
    town, lab = events[0]["session"]["tools"]
    assert (town["defer_loading"], town["allowed_callers"]) == (True, ["direct", "programmatic"])
    assert lab["allowed_callers"] == ["programmatic"]
    # Both are listed; a deferred server's tools are offered from the start (hark has no tool
    # search), and those only code may call are not offered to the model.
    listings = driver.take(ListMcpTools)
    assert [a.server.label for a in listings] == ["town", "lab"]
    for action in listings:
        driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    driver.pump()
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert [t.name for t in generate.request.tools] == ["get_weather"]
    driver.session.handle(
        GenerationFinished(generate.response_id, Finished("stop")), now=driver.now
    )
    driver.pump()


def test_a_prompt_hark_cannot_look_up_is_set_aside_and_the_rest_applies(driver: Driver) -> None:
    # As the agents SDKs send an agent: instructions, tools, voice and prompt at once.
    events = update(
        driver,
        {
            "type": "realtime",
            "instructions": "You are Ada.",
            "tools": [LOOKUP],
            "audio": {"output": {"voice": {"id": "voice_68ad2a2b2f0c8190"}}},
            "prompt": {"id": "pmpt_123", "variables": {"city": "Paris"}},
        },
    )
    assert driver.types(events) == ["error", "session.updated"]
    assert events[0]["error"]["param"] == "session.prompt"
    assert events[0]["error"]["event_id"] == "evt_7"
    config = driver.session.config
    assert config.instructions == "You are Ada."
    assert [t.name for t in config.tools if isinstance(t, FunctionToolDef)] == ["lookup"]
    assert events[1]["session"]["audio"]["output"]["voice"] == {"id": "voice_68ad2a2b2f0c8190"}
    assert events[1]["session"]["prompt"] is None

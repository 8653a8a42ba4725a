"""Remote MCP tools on the sans-I/O core: listing, calls, approvals, failures.

The driver plays the runner's part: it answers ``ListMcpTools`` and ``CallMcpTool`` with the
results a server would give, and the LLM's part with tool-call events.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pydantic
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.llm import Finished
from hark.engines.registry import build_engines
from hark.protocol import items as wire
from hark.session.actions import (
    CallMcpTool,
    CancelGeneration,
    CloseMcpServer,
    Generate,
    ListMcpTools,
)
from hark.session.results import (
    AudioGenerated,
    GenerationFinished,
    McpCallDone,
    McpCallFailed,
    McpListFailed,
    McpToolsListed,
    TextGenerated,
    ToolCallDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from hark.tools import egress
from tests.e2e.test_mcp_tools import ALLOWED_HOST, TOKEN, TOWN_KEY, serve_mcp

from .conftest import Driver

WEATHER = wire.McpTool(
    name="get_weather",
    description="The weather in a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
    annotations={"readOnlyHint": True},
)
BOOK = wire.McpTool(name="book_table", input_schema={"type": "object"}, annotations=None)
SDK_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)


@pytest.fixture
def driver() -> Iterator[Driver]:
    """The core's driver; every event the test made must be one the `openai` SDK reads."""
    driver = Driver()
    yield driver
    for event in driver.events:
        SDK_EVENT.validate_python(event)


def mcp_tool(**overrides: Any) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "type": "mcp",
        "server_label": "town",
        "server_url": "http://127.0.0.1:9/mcp",
        "headers": {"X-Town-Key": "k-123"},
        "authorization": "secret-token",
        "require_approval": "never",
    }
    return {**tool, **overrides}


def text_session(driver: Driver, *tools: dict[str, Any]) -> list[dict[str, Any]]:
    return driver.send(
        {
            "type": "session.update",
            "session": {
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                "tools": list(tools),
            },
        }
    )


def listed(driver: Driver, *tools: wire.McpTool, **overrides: Any) -> ListMcpTools:
    """A session with one MCP server, listed with ``tools``."""
    text_session(driver, mcp_tool(**overrides))
    (action,) = driver.take(ListMcpTools)
    driver.session.handle(McpToolsListed(action.item_id, list(tools)), now=driver.now)
    driver.pump()
    return action


def call(driver: Driver, generate: Generate, name: str, arguments: str) -> None:
    """The LLM calls ``name`` with ``arguments`` in two pieces, and finishes its round."""
    rid = generate.response_id
    driver.session.handle(ToolCallStarted(rid, "call_1", name), now=driver.now)
    middle = len(arguments) // 2
    for piece in (arguments[:middle], arguments[middle:]):
        driver.session.handle(ToolCallDelta(rid, "call_1", piece), now=driver.now)
    driver.session.handle(ToolCallFinished(rid, "call_1", arguments), now=driver.now)
    driver.session.handle(
        GenerationFinished(rid, Finished("tool_calls", prompt_tokens=30, completion_tokens=5)),
        now=driver.now,
    )
    driver.pump()


def answer(driver: Driver, generate: Generate, text: str) -> list[dict[str, Any]]:
    driver.session.handle(TextGenerated(generate.response_id, text), now=driver.now)
    driver.session.handle(
        GenerationFinished(
            generate.response_id, Finished("stop", prompt_tokens=40, completion_tokens=3)
        ),
        now=driver.now,
    )
    return driver.pump()


def test_an_update_that_adds_a_server_lists_its_tools(driver: Driver) -> None:
    new = text_session(driver, mcp_tool(allowed_tools=["get_weather"]))
    assert driver.types(new) == [
        "session.updated",
        "conversation.item.added",
        "mcp_list_tools.in_progress",
    ]
    item = new[1]["item"]
    assert item["type"] == "mcp_list_tools"
    assert item["server_label"] == "town"
    assert item["tools"] == []
    assert new[2]["item_id"] == item["id"]
    (action,) = driver.take(ListMcpTools)
    assert action.item_id == item["id"]
    assert action.server.url == "http://127.0.0.1:9/mcp"
    assert action.server.headers == {"X-Town-Key": "k-123"}
    assert action.server.authorization == "secret-token"
    # Credentials stay out of what gets printed.
    assert "secret-token" not in repr(action) and "k-123" not in repr(action)

    driver.session.handle(McpToolsListed(action.item_id, [WEATHER, BOOK]), now=driver.now)
    done = driver.pump()
    assert driver.types(done) == ["mcp_list_tools.completed", "conversation.item.done"]
    assert done[0]["item_id"] == item["id"]
    assert [t["name"] for t in done[1]["item"]["tools"]] == ["get_weather"]
    assert done[1]["item"]["tools"][0]["input_schema"] == WEATHER.input_schema


def test_session_updated_keeps_the_server_credentials_to_itself(driver: Driver) -> None:
    (updated, *_) = text_session(driver, mcp_tool())
    (tool,) = updated["session"]["tools"]
    assert tool["server_label"] == "town"
    assert tool["server_url"] == "http://127.0.0.1:9/mcp"
    assert tool["authorization"] is None and tool["headers"] is None
    assert "secret-token" not in str(updated) and "k-123" not in str(updated)


def test_the_same_server_again_is_not_listed_again_and_a_changed_one_is(driver: Driver) -> None:
    listed(driver, WEATHER)
    again = text_session(driver, mcp_tool())
    assert driver.types(again) == ["session.updated"]
    assert driver.take(ListMcpTools) == []
    moved = text_session(driver, mcp_tool(headers={"X-Town-Key": "k-456"}))
    assert driver.types(moved)[1:] == ["conversation.item.added", "mcp_list_tools.in_progress"]
    assert driver.take(CloseMcpServer) == [CloseMcpServer("town")]
    assert [a.server.headers for a in driver.take(ListMcpTools)] == [{"X-Town-Key": "k-456"}]
    text_session(driver)
    assert driver.take(CloseMcpServer) == [CloseMcpServer("town")]


@pytest.mark.parametrize(
    ("tool", "param", "code"),
    [
        (mcp_tool(server_url=None), "session.tools[0].server_url", "missing_required_parameter"),
        (mcp_tool(server_url="ftp://x/mcp"), "session.tools[0].server_url", "invalid_value"),
        (mcp_tool(server_label="a b"), "session.tools[0].server_label", None),
        (mcp_tool(require_approval="sometimes"), "session.tools[0].require_approval", None),
    ],
)
def test_a_bad_mcp_tool_fails_the_update_naming_the_param(
    driver: Driver, tool: dict[str, Any], param: str, code: str | None
) -> None:
    (error,) = text_session(driver, tool)
    assert error["type"] == "error"
    assert error["error"]["param"] == param
    if code is not None:
        assert error["error"]["code"] == code
    assert driver.session.config.tools == []
    assert driver.take(ListMcpTools) == []


def test_server_labels_are_unique(driver: Driver) -> None:
    (error,) = text_session(driver, mcp_tool(), mcp_tool(server_url="http://127.0.0.1:8/mcp"))
    assert error["error"]["param"] == "session.tools[1].server_label"


def test_a_server_that_cannot_be_listed_offers_nothing_and_the_session_goes_on(
    driver: Driver,
) -> None:
    text_session(driver, mcp_tool())
    (action,) = driver.take(ListMcpTools)
    driver.session.handle(McpListFailed(action.item_id), now=driver.now)
    failed = driver.pump()
    assert driver.types(failed) == ["mcp_list_tools.failed", "conversation.item.done"]
    assert failed[1]["item"]["tools"] == []
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert generate.request.tools == ()


def test_why_a_list_failed_reaches_the_client_as_an_error(driver: Driver) -> None:
    text_session(driver, mcp_tool())
    (action,) = driver.take(ListMcpTools)
    why = wire.McpCallError(
        type="http_error", code=403, message="The MCP server's address is not allowed."
    )
    driver.session.handle(McpListFailed(action.item_id, why), now=driver.now)
    failed = driver.pump()
    assert driver.types(failed) == ["mcp_list_tools.failed", "conversation.item.done", "error"]
    assert failed[2]["error"] == {
        "type": "invalid_request_error",
        "code": "mcp_list_tools_failed",
        "message": "Error retrieving tool list from MCP server: 'town'. The MCP server's "
        "address is not allowed.",
        "param": None,
        "event_id": None,
    }


def test_listed_tools_reach_the_llm_as_functions(driver: Driver) -> None:
    listed(driver, WEATHER, BOOK)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    tools = {t.name: t for t in generate.request.tools}
    assert set(tools) == {"get_weather", "book_table"}
    assert tools["get_weather"].parameters == WEATHER.input_schema
    assert tools["get_weather"].description == "The weather in a city."
    # A response with tools of its own has only those.
    answer(driver, generate, "Hi.")
    own = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    driver.send({"type": "response.create", "response": {"tools": [own]}})
    (generate,) = driver.take(Generate)
    assert [t.name for t in generate.request.tools] == ["lookup"]


def test_a_tool_without_a_description_is_listed_with_an_empty_one(driver: Driver) -> None:
    # The JS agents SDK's schema of a listing requires a string description and drops the
    # whole event for a null (issue 28, point 4). The MCP client passes on the server's
    # None; a client's own listing item may hold a null too.
    text_session(driver, mcp_tool())
    (action,) = driver.take(ListMcpTools)
    bare = wire.McpTool(name="book_table", input_schema={"type": "object"}, description=None)
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER, bare]), now=driver.now)
    (_, done) = driver.pump()
    assert [t["description"] for t in done["item"]["tools"]] == ["The weather in a city.", ""]
    own = {
        "type": "mcp_list_tools",
        "server_label": "shop",
        "tools": [{"name": "price", "input_schema": {}, "description": None}],
    }
    (added, *_) = driver.send({"type": "conversation.item.create", "item": own})
    assert added["item"]["tools"][0]["description"] == ""


def test_a_response_during_the_listing_goes_on_without_its_tools(driver: Driver) -> None:
    # A reply is not held up by a slow server (a listing may take its whole timeout): it
    # has the tools listed so far, and a client that needs them waits for
    # mcp_list_tools.completed, as OpenAI's own examples do.
    text_session(driver, mcp_tool())
    (action,) = driver.take(ListMcpTools)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert generate.request.tools == ()
    answer(driver, generate, "Hi.")
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    driver.pump()
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert [t.name for t in generate.request.tools] == ["get_weather"]


def test_tool_choice_names_an_mcp_server_or_one_of_its_tools(driver: Driver) -> None:
    own = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    text_session(driver, own, mcp_tool())
    (action,) = driver.take(ListMcpTools)
    choice = {"type": "mcp", "server_label": "town", "name": "book_table"}
    # Before the listing the tool is not known: nothing is forced.
    driver.send({"type": "response.create", "response": {"tool_choice": choice}})
    (generate,) = driver.take(Generate)
    assert generate.request.tool_choice.mode == "auto"
    answer(driver, generate, "Hi.")
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER, BOOK]), now=driver.now)
    driver.pump()
    driver.send({"type": "response.create", "response": {"tool_choice": choice}})
    (generate,) = driver.take(Generate)
    assert (generate.request.tool_choice.mode, generate.request.tool_choice.name) == (
        "function",
        "book_table",
    )
    answer(driver, generate, "Hi.")
    # The server alone: one of its tools must be called, and only its tools are offered.
    updated = driver.send(
        {
            "type": "session.update",
            "session": {"tool_choice": {"type": "mcp", "server_label": "town"}},
        }
    )
    assert updated[0]["session"]["tool_choice"] == {
        "type": "mcp",
        "server_label": "town",
        "name": None,
    }
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert generate.request.tool_choice.mode == "required"
    assert {t.name for t in generate.request.tools} == {"get_weather", "book_table"}


def test_tool_choice_must_name_a_server_of_the_session(driver: Driver) -> None:
    listed(driver, WEATHER)
    (error,) = driver.send(
        {
            "type": "session.update",
            "session": {"tool_choice": {"type": "mcp", "server_label": "elsewhere"}},
        }
    )
    assert error["error"]["param"] == "session.tool_choice.server_label"
    (error,) = driver.send(
        {
            "type": "response.create",
            "response": {"tool_choice": {"type": "mcp", "server_label": "elsewhere"}},
        }
    )
    assert error["error"]["param"] == "response.tool_choice.server_label"
    assert driver.take(Generate) == []


def test_a_call_runs_on_the_server_and_ends_the_response(driver: Driver) -> None:
    # As OpenAI runs MCP turns (issue 28, point 1): the response that calls ends once the
    # call is done, and the client's next response.create reads the result (the JS agents
    # SDK sends one after every MCP call; a response that went on would answer twice).
    listed(driver, WEATHER)
    driver.send({"type": "response.create", "response": {"tool_choice": "required"}})
    (generate,) = driver.take(Generate)
    assert generate.request.tool_choice.mode == "required"
    start = len(driver.events)
    call(driver, generate, "get_weather", '{"city": "Paris"}')
    made = driver.events[start:]
    assert driver.types(made) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
    ]
    item_id = made[0]["item"]["id"]
    assert made[0]["item"]["type"] == "mcp_call"
    assert made[0]["item"]["name"] == "get_weather"
    assert made[4]["arguments"] == '{"city": "Paris"}'
    # The JS agents SDK's schema of the delta requires obfuscation, a string (issue 28,
    # point 8); OpenAI pads with it, hark has nothing to hide.
    assert [e["obfuscation"] for e in made[2:4]] == ["", ""]
    (action,) = driver.take(CallMcpTool)
    assert (action.response_id, action.item_id) == (generate.response_id, item_id)
    assert (action.name, action.arguments) == ("get_weather", '{"city": "Paris"}')
    assert action.server.label == "town"
    # The LLM is done, the call is not: the response waits for it.
    assert driver.types()[-1] == "response.mcp_call.in_progress"

    driver.session.handle(McpCallDone(generate.response_id, item_id, "Sunny, 21 C"), now=driver.now)
    done = driver.pump()
    assert driver.types(done) == [
        "response.mcp_call.completed",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert done[1]["item"]["output"] == "Sunny, 21 C"
    assert driver.take(Generate) == []
    response = done[-1]["response"]
    assert response["status"] == "completed"
    assert [o["type"] for o in response["output"]] == ["mcp_call"]
    assert response["output"][0]["output"] == "Sunny, 21 C"
    assert response["usage"]["input_tokens"] == 30
    assert response["usage"]["output_tokens"] == 5

    # The client asks for the answer, as the JS agents SDK does on the call's item.done.
    created = driver.send({"type": "response.create"})
    assert driver.types(created)[0] == "response.created"
    (again,) = driver.take(Generate)
    assert again.response_id != generate.response_id
    assert again.request.tool_choice.mode == "auto"
    messages = again.request.messages
    assert messages[-2].tool_calls[0].name == "get_weather"
    assert (messages[-1].role, messages[-1].content) == ("tool", "Sunny, 21 C")
    end = answer(driver, again, "It is sunny.")
    assert [o["type"] for o in end[-1]["response"]["output"]] == ["message"]
    assert "error" not in driver.types()


def test_a_result_before_the_llm_is_done_is_announced_with_the_response_end(
    driver: Driver,
) -> None:
    # A client that asks for the next response when it sees the result finds the response
    # done by then: nothing comes between the result and response.done.
    listed(driver, WEATHER)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    rid = generate.response_id
    driver.session.handle(ToolCallStarted(rid, "c", "get_weather"), now=driver.now)
    driver.session.handle(ToolCallFinished(rid, "c", "{}"), now=driver.now)
    driver.pump()
    (action,) = driver.take(CallMcpTool)
    driver.session.handle(McpCallDone(rid, action.item_id, "ok"), now=driver.now)
    assert driver.pump() == []
    driver.session.handle(GenerationFinished(rid, Finished("tool_calls")), now=driver.now)
    end = driver.pump()
    assert driver.types(end) == [
        "response.mcp_call.completed",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert end[1]["item"]["output"] == "ok"
    assert driver.take(Generate) == []
    driver.send({"type": "response.create"})
    assert len(driver.take(Generate)) == 1


def test_a_failed_call_carries_its_error_and_the_next_response_reads_it(
    driver: Driver,
) -> None:
    listed(driver, WEATHER)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    call(driver, generate, "get_weather", "{}")
    (action,) = driver.take(CallMcpTool)
    error = wire.McpCallError(type="http_error", code=502, message="connection refused")
    driver.session.handle(
        McpCallFailed(generate.response_id, action.item_id, error), now=driver.now
    )
    failed = driver.pump()
    assert driver.types(failed) == [
        "response.mcp_call.failed",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    item = failed[1]["item"]
    assert item["error"] == {"type": "http_error", "message": "connection refused", "code": 502}
    assert item["output"] is None
    assert failed[-1]["response"]["status"] == "completed"
    driver.send({"type": "response.create"})
    (again,) = driver.take(Generate)
    assert again.request.messages[-1].content == "error: connection refused"
    end = answer(driver, again, "The weather service is down.")
    assert end[-1]["response"]["status"] == "completed"


def test_an_audio_response_that_calls_ends_with_its_words_and_the_call(driver: Driver) -> None:
    # What was said before the call is the response's message; the answer after the call is
    # the next response's.
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {"input": {"turn_detection": None}},
                "tools": [mcp_tool()],
            },
        }
    )
    (action,) = driver.take(ListMcpTools)
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    driver.pump()
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    rid = generate.response_id
    driver.session.handle(
        AudioGenerated(rid, np.zeros(2400, np.int16), "Let me look. "), now=driver.now
    )
    call(driver, generate, "get_weather", "{}")
    (mcp_call,) = driver.take(CallMcpTool)
    driver.session.handle(McpCallDone(rid, mcp_call.item_id, "Rain"), now=driver.now)
    end = driver.pump()
    response = end[-1]["response"]
    assert [o["type"] for o in response["output"]] == ["message", "mcp_call"]
    assert response["output"][0]["content"][0]["transcript"] == "Let me look. "
    assert response["usage"]["output_token_details"]["audio_tokens"] == 2


def test_a_call_that_needs_approval_ends_the_turn_with_a_request(driver: Driver) -> None:
    listed(driver, WEATHER, require_approval=None)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    start = len(driver.events)
    call(driver, generate, "get_weather", '{"city": "Oslo"}')
    made = driver.events[start:]
    assert "response.mcp_call_arguments.delta" not in driver.types(made)
    assert driver.take(CallMcpTool) == []
    assert driver.take(Generate) == []
    request = made[0]["item"]
    assert request["type"] == "mcp_approval_request"
    (item_done,) = [e for e in made if e["type"] == "response.output_item.done"]
    assert item_done["item"]["arguments"] == '{"city": "Oslo"}'
    assert made[-1]["type"] == "response.done"
    assert made[-1]["response"]["status"] == "completed"
    return_request = request["id"]

    approval = {
        "type": "mcp_approval_response",
        "approval_request_id": return_request,
        "approve": True,
    }
    added = driver.send({"type": "conversation.item.create", "item": approval})
    # The approved call runs at once, with no response.create, as an item of the
    # conversation; OpenAI's clients ask for the answer once it has completed.
    assert driver.types(added) == [
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.added",
        "response.mcp_call.in_progress",
    ]
    call_item = added[2]["item"]
    assert call_item["type"] == "mcp_call"
    assert call_item["approval_request_id"] == return_request
    assert added[3]["item_id"] == call_item["id"]
    (action,) = driver.take(CallMcpTool)
    assert (action.item_id, action.name, action.arguments) == (
        call_item["id"],
        "get_weather",
        '{"city": "Oslo"}',
    )
    assert driver.take(Generate) == []
    driver.session.handle(McpCallDone(action.response_id, action.item_id, "Snow"), now=driver.now)
    completed = driver.pump()
    assert driver.types(completed) == ["response.mcp_call.completed", "conversation.item.done"]
    assert completed[1]["item"]["output"] == "Snow"
    assert completed[1]["item"]["error"] is None
    assert driver.take(Generate) == []
    driver.send({"type": "response.create"})
    (again,) = driver.take(Generate)
    assert again.request.messages[-1].content == "Snow"
    answer(driver, again, "It snows.")
    # Answered once: a later response does not call it again.
    driver.send({"type": "response.create"})
    assert driver.take(CallMcpTool) == []
    assert len(driver.take(Generate)) == 1


def answer_last_request(driver: Driver, *, approve: bool) -> None:
    """Approve or deny the last item a response added (an ``mcp_approval_request``)."""
    added = [e for e in driver.events if e["type"] == "response.output_item.added"]
    answer = {
        "type": "mcp_approval_response",
        "approval_request_id": added[-1]["item"]["id"],
        "approve": approve,
    }
    driver.send({"type": "conversation.item.create", "item": answer})


def test_a_response_waits_for_an_approved_call_still_running(driver: Driver) -> None:
    listed(driver, WEATHER, require_approval="always")
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    call(driver, generate, "get_weather", "{}")
    answer_last_request(driver, approve=True)
    (action,) = driver.take(CallMcpTool)
    driver.send({"type": "response.create"})
    assert driver.take(Generate) == []
    driver.session.handle(
        McpCallFailed(
            action.response_id,
            action.item_id,
            wire.McpCallError(type="http_error", code=502, message="unreachable"),
        ),
        now=driver.now,
    )
    failed = driver.pump()
    assert driver.types(failed)[:2] == ["response.mcp_call.failed", "conversation.item.done"]
    assert failed[1]["item"]["error"]["code"] == 502
    (generate,) = driver.take(Generate)
    assert generate.request.messages[-1].content == "error: unreachable"


def test_a_denied_call_is_never_made(driver: Driver) -> None:
    listed(driver, WEATHER, require_approval="always")
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    call(driver, generate, "get_weather", "{}")
    answer_last_request(driver, approve=False)
    driver.send({"type": "response.create"})
    assert driver.take(CallMcpTool) == []
    assert len(driver.take(Generate)) == 1


def test_approval_filters(driver: Driver) -> None:
    rule = {"never": {"read_only": True}}
    listed(driver, WEATHER, BOOK, require_approval=rule)
    for name, kind in (("get_weather", "mcp_call"), ("book_table", "mcp_approval_request")):
        driver.send({"type": "response.create"})
        (generate,) = driver.take(Generate)
        start = len(driver.events)
        call(driver, generate, name, "{}")
        assert driver.events[start]["item"]["type"] == kind
        for action in driver.take(CallMcpTool):
            driver.session.handle(
                McpCallDone(action.response_id, action.item_id, ""), now=driver.now
            )
            driver.pump()
        assert driver.types()[-1] == "response.done"


def test_an_approval_response_must_answer_a_request(driver: Driver) -> None:
    listed(driver, WEATHER)
    bad = {"type": "mcp_approval_response", "approval_request_id": "item_nope", "approve": True}
    (error,) = driver.send({"type": "conversation.item.create", "item": bad})
    assert error["error"]["param"] == "item.approval_request_id"


def test_cancelling_a_response_abandons_its_call(driver: Driver) -> None:
    listed(driver, WEATHER)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    call(driver, generate, "get_weather", "{}")
    (action,) = driver.take(CallMcpTool)
    cancelled = driver.send({"type": "response.cancel"})
    assert [a.response_id for a in driver.take(CancelGeneration)] == [generate.response_id]
    assert cancelled[-1]["response"]["status"] == "cancelled"
    driver.session.handle(McpCallDone(action.response_id, action.item_id, "late"), now=driver.now)
    assert driver.pump() == []
    assert driver.take(Generate) == []


def test_a_raw_clients_response_create_after_each_result_gets_one_answer(
    driver: Driver,
) -> None:
    # The raw client's loop that failed with conversation_already_has_active_response: on
    # each call's result it asks for a response, which is accepted and answers once.
    driver.send(
        {
            "type": "session.update",
            "session": {
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                "tools": [mcp_tool()],
                "tool_choice": "required",
            },
        }
    )
    (action,) = driver.take(ListMcpTools)
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    driver.pump()
    driver.send({"type": "response.create"})
    for _ in range(3):
        (generate,) = driver.take(Generate)
        call(driver, generate, "get_weather", "{}")
        (action,) = driver.take(CallMcpTool)
        driver.session.handle(McpCallDone(action.response_id, action.item_id, "ok"), now=driver.now)
        assert driver.pump()[-1]["type"] == "response.done"
        assert driver.take(Generate) == []
        driver.send({"type": "response.create", "response": {"tool_choice": "auto"}})
    (generate,) = driver.take(Generate)
    end = answer(driver, generate, "Done.")
    assert [o["type"] for o in end[-1]["response"]["output"]] == ["message"]
    assert driver.types().count("response.created") == 4
    assert driver.types().count("response.done") == 4
    assert "error" not in driver.types()


def test_a_function_call_beside_an_mcp_call_ends_the_response_for_the_client(
    driver: Driver,
) -> None:
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    text_session(driver, mcp_tool(), lookup)
    (action,) = driver.take(ListMcpTools)
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    rid = generate.response_id
    for call_id, name in (("a", "get_weather"), ("b", "lookup")):
        driver.session.handle(ToolCallStarted(rid, call_id, name), now=driver.now)
        driver.session.handle(ToolCallFinished(rid, call_id, "{}"), now=driver.now)
    driver.session.handle(GenerationFinished(rid, Finished("tool_calls")), now=driver.now)
    driver.pump()
    (mcp_call,) = driver.take(CallMcpTool)
    driver.session.handle(McpCallDone(rid, mcp_call.item_id, "ok"), now=driver.now)
    end = driver.pump()
    assert driver.take(Generate) == []
    assert [o["type"] for o in end[-1]["response"]["output"]] == ["mcp_call", "function_call"]


# ---------------------------------------------------------------------- a response's own servers
# OpenAI lets response.create name MCP servers for that response only (issue 28, point 4). As
# with function tools, a response's own tools replace the session's for that response.

LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}


def shop(**overrides: Any) -> dict[str, Any]:
    """A server that only responses name: not the session's ``town``."""
    place = {"server_label": "shop", "server_url": "http://127.0.0.1:7/mcp", "headers": None}
    return mcp_tool(**{**place, **overrides})


def test_a_responses_own_server_is_listed_in_it_and_offered_for_it_alone(
    driver: Driver,
) -> None:
    listed(driver, BOOK)
    created = driver.send(
        {
            "type": "response.create",
            "response": {"tools": [LOOKUP, shop(allowed_tools=["get_weather"])]},
        }
    )
    assert driver.types(created) == [
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "mcp_list_tools.in_progress",
    ]
    item = created[2]["item"]
    assert (item["type"], item["server_label"], item["tools"]) == ("mcp_list_tools", "shop", [])
    assert created[4]["item_id"] == item["id"]
    (action,) = driver.take(ListMcpTools)
    assert (action.item_id, action.server.url) == (item["id"], "http://127.0.0.1:7/mcp")
    assert action.server.authorization == "secret-token"
    # The LLM waits for the response's own tools.
    assert driver.take(Generate) == []

    driver.session.handle(McpToolsListed(action.item_id, [WEATHER, BOOK]), now=driver.now)
    done = driver.pump()
    assert driver.types(done) == [
        "mcp_list_tools.completed",
        "response.output_item.done",
        "conversation.item.done",
    ]
    assert [t["name"] for t in done[1]["item"]["tools"]] == ["get_weather"]
    (generate,) = driver.take(Generate)
    # The response's function and its server's allowed tool; none of the session's town.
    assert [t.name for t in generate.request.tools] == ["lookup", "get_weather"]
    end = answer(driver, generate, "Hi.")
    assert [o["type"] for o in end[-1]["response"]["output"]] == ["mcp_list_tools", "message"]

    # The next response has the session's tools again, and nothing of the shop.
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    assert [t.name for t in generate.request.tools] == ["book_table"]
    assert "error" not in driver.types()


def test_a_listing_made_before_is_reused_and_a_server_reached_differently_is_listed(
    driver: Driver,
) -> None:
    listed(driver, WEATHER, BOOK)
    # The session's own server, named again by a response with its own allowed_tools: the
    # listing the session made serves, with no new item.
    created = driver.send(
        {"type": "response.create", "response": {"tools": [mcp_tool(allowed_tools=["book_table"])]}}
    )
    assert driver.types(created) == ["response.created", "rate_limits.updated"]
    assert driver.take(ListMcpTools) == []
    (generate,) = driver.take(Generate)
    assert [t.name for t in generate.request.tools] == ["book_table"]
    answer(driver, generate, "Hi.")

    # Another key: another listing.
    driver.send(
        {"type": "response.create", "response": {"tools": [mcp_tool(headers={"X-Town-Key": "b"})]}}
    )
    (action,) = driver.take(ListMcpTools)
    assert action.server.headers == {"X-Town-Key": "b"}
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    driver.pump()
    answer(driver, driver.take(Generate)[0], "Hi.")
    # A response-level listing serves the next response naming the same server.
    again = driver.send(
        {"type": "response.create", "response": {"tools": [mcp_tool(headers={"X-Town-Key": "b"})]}}
    )
    assert driver.types(again) == ["response.created", "rate_limits.updated"]
    assert driver.take(ListMcpTools) == []
    (generate,) = driver.take(Generate)
    assert [t.name for t in generate.request.tools] == ["get_weather"]


def test_a_responses_own_server_is_called_there_and_the_response_ends_with_the_call(
    driver: Driver,
) -> None:
    text_session(driver)
    driver.send(
        {"type": "response.create", "response": {"tools": [shop()], "tool_choice": "required"}}
    )
    (action,) = driver.take(ListMcpTools)
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    driver.pump()
    (generate,) = driver.take(Generate)
    assert generate.request.tool_choice.mode == "required"
    call(driver, generate, "get_weather", '{"city": "Rome"}')
    (mcp_call,) = driver.take(CallMcpTool)
    # The session has no such server: the call goes where the response said.
    assert (mcp_call.server.label, mcp_call.server.url) == ("shop", "http://127.0.0.1:7/mcp")
    assert mcp_call.server.authorization == "secret-token"
    driver.session.handle(
        McpCallDone(mcp_call.response_id, mcp_call.item_id, "Hot"), now=driver.now
    )
    end = driver.pump()
    assert driver.types(end)[-1] == "response.done"
    response = end[-1]["response"]
    assert [o["type"] for o in response["output"]] == ["mcp_list_tools", "mcp_call"]
    assert response["output"][1]["output"] == "Hot"
    driver.send({"type": "response.create"})
    (again,) = driver.take(Generate)
    assert again.request.messages[-1].content == "Hot"
    assert again.request.tools == ()


def test_a_call_of_a_responses_own_server_waits_for_approval_and_runs_there(
    driver: Driver,
) -> None:
    text_session(driver)
    rule = {"never": {"tool_names": ["get_weather"]}}
    for name, kind in (("get_weather", "mcp_call"), ("book_table", "mcp_approval_request")):
        driver.send(
            {"type": "response.create", "response": {"tools": [shop(require_approval=rule)]}}
        )
        for listing in driver.take(ListMcpTools):
            driver.session.handle(McpToolsListed(listing.item_id, [WEATHER, BOOK]), now=driver.now)
            driver.pump()
        (generate,) = driver.take(Generate)
        start = len(driver.events)
        call(driver, generate, name, "{}")
        assert next(e["item"]["type"] for e in driver.events[start:] if "item" in e) == kind
        for action in driver.take(CallMcpTool):
            driver.session.handle(
                McpCallDone(action.response_id, action.item_id, ""), now=driver.now
            )
            driver.pump()
        assert driver.types()[-1] == "response.done"
    # Approved once the response is over: the call still goes to the response's server.
    answer_last_request(driver, approve=True)
    (action,) = driver.take(CallMcpTool)
    assert (action.server.label, action.server.url, action.name) == (
        "shop",
        "http://127.0.0.1:7/mcp",
        "book_table",
    )
    assert action.server.authorization == "secret-token"


def test_a_responses_server_that_cannot_be_listed_leaves_it_without_those_tools(
    driver: Driver,
) -> None:
    text_session(driver)
    driver.send({"type": "response.create", "response": {"tools": [LOOKUP, shop()]}})
    (action,) = driver.take(ListMcpTools)
    why = wire.McpCallError(
        type="http_error", code=403, message="The MCP server's address is not allowed."
    )
    driver.session.handle(McpListFailed(action.item_id, why), now=driver.now)
    failed = driver.pump()
    assert driver.types(failed) == [
        "mcp_list_tools.failed",
        "response.output_item.done",
        "conversation.item.done",
        "error",
    ]
    assert failed[-1]["error"]["code"] == "mcp_list_tools_failed"
    assert "'shop'" in failed[-1]["error"]["message"]
    (generate,) = driver.take(Generate)
    assert [t.name for t in generate.request.tools] == ["lookup"]
    end = answer(driver, generate, "Hi.")
    assert end[-1]["response"]["status"] == "completed"
    # A failed listing is not reused: the next response naming the server lists it again.
    driver.send({"type": "response.create", "response": {"tools": [shop()]}})
    assert len(driver.take(ListMcpTools)) == 1


def test_a_response_cancelled_while_its_server_is_listed_ends_and_the_listing_is_dropped(
    driver: Driver,
) -> None:
    text_session(driver)
    driver.send({"type": "response.create", "response": {"tools": [shop()]}})
    (action,) = driver.take(ListMcpTools)
    cancelled = driver.send({"type": "response.cancel"})
    assert driver.types(cancelled) == [
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert cancelled[-1]["response"]["status"] == "cancelled"
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    assert driver.pump() == []
    assert driver.take(Generate) == []


def test_an_out_of_band_responses_listing_stays_out_of_the_conversation(driver: Driver) -> None:
    text_session(driver)
    created = driver.send(
        {"type": "response.create", "response": {"conversation": "none", "tools": [shop()]}}
    )
    assert driver.types(created) == [
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "mcp_list_tools.in_progress",
    ]
    (action,) = driver.take(ListMcpTools)
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER]), now=driver.now)
    assert driver.types(driver.pump()) == ["mcp_list_tools.completed", "response.output_item.done"]
    assert driver.session.conversation.entries() == []


def test_a_responses_tool_choice_names_its_own_server(driver: Driver) -> None:
    listed(driver, WEATHER)
    choice = {"type": "mcp", "server_label": "shop", "name": "book_table"}
    driver.send({"type": "response.create", "response": {"tools": [shop()], "tool_choice": choice}})
    (action,) = driver.take(ListMcpTools)
    driver.session.handle(McpToolsListed(action.item_id, [WEATHER, BOOK]), now=driver.now)
    driver.pump()
    (generate,) = driver.take(Generate)
    assert (generate.request.tool_choice.mode, generate.request.tool_choice.name) == (
        "function",
        "book_table",
    )
    answer(driver, generate, "Hi.")
    # A response with tools of its own has none of the session's: naming town is an error.
    town_choice = {"type": "mcp", "server_label": "town"}
    (error,) = driver.send(
        {"type": "response.create", "response": {"tools": [shop()], "tool_choice": town_choice}}
    )
    assert error["error"]["param"] == "response.tool_choice.server_label"
    assert driver.take(ListMcpTools) == []


@pytest.mark.parametrize(
    ("tool", "param", "code"),
    [
        (shop(server_url=None), "response.tools[0].server_url", "missing_required_parameter"),
        (shop(server_url="ftp://x/mcp"), "response.tools[0].server_url", "invalid_value"),
        (
            shop(server_url=None, connector_id="connector_gmail"),
            "response.tools[0].connector_id",
            "unsupported_parameter",
        ),
        (shop(server_url=None, tunnel_id="tun_1"), "response.tools[0].tunnel_id", None),
    ],
)
def test_a_bad_mcp_tool_refuses_the_response_naming_the_param(
    driver: Driver, tool: dict[str, Any], param: str, code: str | None
) -> None:
    text_session(driver)
    (error,) = driver.send({"type": "response.create", "response": {"tools": [tool]}})
    assert error["type"] == "error"
    assert error["error"]["param"] == param
    if code is not None:
        assert error["error"]["code"] == code
    assert driver.take(ListMcpTools) == []
    (error,) = driver.send({"type": "response.create", "response": {"tools": [shop(), shop()]}})
    assert error["error"]["param"] == "response.tools[1].server_label"


# ------------------------------------------------- a response's own server, reached for real
# The runner carries out the listing and the call with the MCP client, through the egress
# policy (issue 27): a response's own server_url is held to it as a session's is. The servers
# are real MCP servers (the official `mcp` SDK over streamable HTTP) on loopback, as in
# tests/e2e/test_mcp_tools.py.


@pytest.fixture
def policy() -> Iterator[None]:
    """The process's egress policy allows ``ALLOWED_HOST`` alone beyond the public internet,
    as ``--egress-allow`` would; the one before is put back."""
    before = egress.current()
    egress.configure(egress.EgressPolicy.parse([ALLOWED_HOST]))
    yield
    egress.configure(before)


async def until(stream: AsyncIterator[str], stop: str) -> list[dict[str, Any]]:
    """The runner's events up to one of type ``stop``; each one the `openai` SDK reads."""
    events: list[dict[str, Any]] = []

    async def read() -> None:
        async for text in stream:
            event = json.loads(text)
            SDK_EVENT.validate_python(event)
            events.append(event)
            if event["type"] == stop:
                return

    await asyncio.wait_for(read(), 60)
    return events


async def test_a_responses_own_server_is_held_to_the_egress_policy(policy: None) -> None:
    allowed = serve_mcp()
    refused = serve_mcp("127.0.0.1")
    runner = SessionRunner(build_engines(Settings(engines="fake")), model="m")
    try:
        await runner.start()
        stream = runner.outgoing()
        runner.receive_text(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "output_modalities": ["text"],
                        "audio": {"input": {"turn_detection": None}},
                    },
                }
            )
        )
        await until(stream, "session.updated")
        real = {
            "type": "mcp",
            "server_label": "town",
            "authorization": TOKEN,
            "headers": {"X-Town-Key": TOWN_KEY},
            "require_approval": "never",
            "allowed_tools": ["get_weather"],
        }

        # A server on an address the operator did not allow: its listing is refused, the
        # client is told why, and the response answers without its tools.
        tools = [{**real, "server_url": refused.url}]
        runner.receive_text(json.dumps({"type": "response.create", "response": {"tools": tools}}))
        events = await until(stream, "response.done")
        types = [e["type"] for e in events]
        assert "mcp_list_tools.failed" in types
        (error,) = [e for e in events if e["type"] == "error"]
        assert error["error"]["code"] == "mcp_list_tools_failed"
        assert "not allowed" in error["error"]["message"]
        response = events[-1]["response"]
        assert response["status"] == "completed"
        assert [o["type"] for o in response["output"]] == ["mcp_list_tools", "message"]
        assert response["output"][0]["tools"] == []

        # The allowed one is listed and called, with the response's credentials.
        tools = [{**real, "server_url": allowed.url}]
        runner.receive_text(
            json.dumps(
                {
                    "type": "response.create",
                    "response": {"tools": tools, "tool_choice": "required"},
                }
            )
        )
        events = await until(stream, "response.done")
        assert "error" not in [e["type"] for e in events]
        response = events[-1]["response"]
        assert [o["type"] for o in response["output"]] == ["mcp_list_tools", "mcp_call"]
        assert [t["name"] for t in response["output"][0]["tools"]] == ["get_weather"]
        assert response["output"][1]["output"] == f"Sunny in example; called with Bearer {TOKEN}"
    finally:
        await runner.close()
        allowed.stop()
        refused.stop()

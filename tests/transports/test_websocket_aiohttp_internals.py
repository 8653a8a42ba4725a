"""Pins the private parts of aiohttp that the WebSocket transport relies on
(``hark.transports.websocket``, the one module that reaches into aiohttp) against the
installed aiohttp: ``RealtimeWebSocket._post_start`` is a copy of aiohttp's own with another
queue, so a version whose ``_post_start`` does something new, or that renames what the copy
uses, fails here, naming it."""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap

from aiohttp import web
from aiohttp._websocket.reader import WebSocketDataQueue, WebSocketReader
from aiohttp.base_protocol import BaseProtocol
from aiohttp.web_request import BaseRequest

from hark.transports.websocket import RealtimeWebSocket

# What aiohttp's _post_start does, and what the copy in RealtimeWebSocket does too: the
# attributes it sets and the calls it makes.
SETS = {"_ws_protocol", "_writer", "_reader", "_parser"}
CALLS = {
    "_reset_heartbeat",
    "WebSocketDataQueue",
    "WebSocketReader",
    "bool",
    "set_parser",
    "keep_alive",
}


def _post_start_of(cls: type) -> ast.FunctionDef:
    source = textwrap.dedent(inspect.getsource(cls._post_start))  # type: ignore[attr-defined]
    (function,) = ast.parse(source).body
    assert isinstance(function, ast.FunctionDef)
    return function


def _sets_and_calls(function: ast.FunctionDef) -> tuple[set[str], set[str]]:
    sets, calls = set(), set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            sets.add(node.attr)
        if isinstance(node, ast.Call):
            callee = node.func
            calls.add(
                callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
            )
    return sets, calls


def test_aiohttp_s_post_start_is_what_the_copy_follows() -> None:
    theirs = _post_start_of(web.WebSocketResponse)
    assert [a.arg for a in theirs.args.args] == ["self", "request", "protocol", "writer"]
    sets, calls = _sets_and_calls(theirs)
    assert sets == SETS
    assert calls == CALLS
    ours_sets, ours_calls = _sets_and_calls(_post_start_of(RealtimeWebSocket))
    assert ours_sets >= SETS
    assert ours_calls >= CALLS - {"WebSocketDataQueue"}


async def test_the_attributes_the_copy_reads_exist() -> None:
    response = web.WebSocketResponse()
    for name in ("_max_msg_size", "_compress", "_decode_text", "_heartbeat", "_loop"):
        assert hasattr(response, name), name
    for name in ("_reset_heartbeat", "_on_data_received"):
        assert callable(getattr(response, name)), name
    assert {"_protocol", "_loop"} <= BaseRequest.ATTRS
    queue = WebSocketDataQueue(
        BaseProtocol(asyncio.get_running_loop()), 2**16, loop=asyncio.get_running_loop()
    )
    assert len(queue._buffer) == 0
    assert list(inspect.signature(WebSocketDataQueue.feed_data).parameters) == [
        "self",
        "data",
        "size",
    ]
    assert callable(WebSocketReader)

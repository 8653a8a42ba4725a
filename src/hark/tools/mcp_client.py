"""A session's connections to remote MCP servers, over streamable HTTP with the official
``mcp`` SDK: list a server's tools, call one, each within a timeout.

One connection per server label, opened on first use and kept for the session, closed with
it. The SDK's transport and ``ClientSession`` are anyio context managers that must be left by
the task that entered them, so each connection lives in a task of its own, and calls from any
task use the session it opened. A server that is down, refuses or stalls fails that one list
or call; the next one connects again.

The server's headers and authorization are secrets: they go to the server and nowhere else,
never into a log line or an error message. Every connection goes through the egress policy
(``hark.tools.egress``): a ``server_url`` on loopback, a private network or cloud metadata
fails with a 403 ``http_error`` unless the operator allowed it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

import httpcore2
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    CallToolResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)

from hark.protocol import items as wire
from hark.tools import egress
from hark.tools.mcp_server import McpServer

log = logging.getLogger(__name__)

# How long one list or call (connecting included) may take.
DEFAULT_TIMEOUT_S = 30.0
# How a gateway reports an upstream it could not reach, or that did not answer in time.
BAD_GATEWAY = 502
GATEWAY_TIMEOUT = 504
# How a refusal by the egress policy is reported: the server may not go there.
FORBIDDEN = 403


class McpCallFailed(Exception):
    """An MCP call failed; ``error`` is the ``mcp_call`` item's ``error``."""

    def __init__(self, error: wire.McpCallError) -> None:
        super().__init__(error.message)
        self.error = error


class McpConnection:
    """One session's connection to one MCP server."""

    def __init__(
        self,
        server: McpServer,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        policy: egress.EgressPolicy | None = None,
    ) -> None:
        """``policy``: where connections may go (None: the process's, ``egress.current()``,
        read at each connection)."""
        self.server = server
        self._timeout_s = timeout_s
        self._policy = policy
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[ClientSession] | None = None
        self._closing = asyncio.Event()
        # The last HTTP error status the server answered, for http_error's code.
        self._status: int | None = None
        # The egress policy's refusal of the last connection, whatever the SDK made of it.
        self._refused: egress.EgressRefused | None = None

    async def list_tools(self) -> list[wire.McpTool]:
        """The server's tools, every page of them. Raises McpCallFailed."""
        tools: list[wire.McpTool] = []
        async with self._within_timeout():
            session = await self._session()
            cursor: str | None = None
            while True:
                page = await session.list_tools(
                    params=None if cursor is None else PaginatedRequestParams(cursor=cursor)
                )
                tools += [_tool(t) for t in page.tools]
                cursor = page.next_cursor
                if cursor is None:
                    return tools

    async def call_tool(self, name: str, arguments: str) -> str:
        """Call ``name`` with ``arguments`` (a JSON object, as text): the tool's output as
        text. Raises McpCallFailed."""
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise McpCallFailed(
                wire.McpCallError(
                    type="tool_execution_error",
                    message=f"The arguments of {name} are not a JSON object.",
                )
            )
        async with self._within_timeout():
            session = await self._session()
            result = await session.call_tool(name, parsed)
        assert isinstance(result, CallToolResult)
        output = _output(result)
        if result.is_error:
            raise McpCallFailed(wire.McpCallError(type="tool_execution_error", message=output))
        return output

    async def close(self) -> None:
        """Close the connection (a no-op when none is open)."""
        self._closing.set()
        task, self._task = self._task, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    @asynccontextmanager
    async def _within_timeout(self) -> AsyncIterator[None]:
        """The timeout of one list or call, its errors turned into ``McpCallFailed``."""
        try:
            async with asyncio.timeout(self._timeout_s):
                yield
        except (Exception, BaseExceptionGroup) as exc:
            raise McpCallFailed(self.failure(exc)) from None

    async def _session(self) -> ClientSession:
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            # Callers that gave up before the connection failed never read its error.
            self._ready.add_done_callback(_read_error)
            self._closing = asyncio.Event()
            self._status = None
            self._refused = None
            self._task = asyncio.create_task(
                self._run(self._ready, self._closing), name=f"mcp {self.server.label}"
            )
        assert self._ready is not None
        # Shielded: a caller that gives up must not cancel the connection for the others.
        return await asyncio.shield(self._ready)

    async def _run(self, ready: asyncio.Future[ClientSession], closing: asyncio.Event) -> None:
        headers = dict(self.server.headers)
        if self.server.authorization:
            headers["Authorization"] = f"Bearer {self.server.authorization}"
        policy = self._policy if self._policy is not None else egress.current()
        backend = _PolicedBackend(policy, on_refused=self._refuse)
        # As the SDK's own client (create_mcp_http_client): redirects are the SDK's to follow,
        # within the server's origin; every connection, a redirect's too, is policed.
        http = httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(self._timeout_s),
            transport=_policed_transport(backend),
        )
        http.event_hooks["response"].append(self._saw)
        try:
            async with (
                http,
                streamable_http_client(self.server.url, http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=self._timeout_s) as session,
            ):
                await session.initialize()
                ready.set_result(session)
                await closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(_leaf(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
            # Already reported to the callers waiting; the next call connects again.
            log.warning(
                "MCP server %s: connection ended (%s)", self.server.label, type(_leaf(exc)).__name__
            )

    def _refuse(self, refusal: egress.EgressRefused) -> None:
        self._refused = refusal

    async def _saw(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self._status = response.status_code

    def failure(self, exc: BaseException) -> wire.McpCallError:
        """What went wrong, as an ``mcp_call`` item's ``error``."""
        exc = _leaf(exc)
        if isinstance(exc, McpCallFailed):
            return exc.error
        refused = exc if isinstance(exc, egress.EgressRefused) else self._refused
        if refused is not None:
            return wire.McpCallError(
                type="http_error",
                code=FORBIDDEN,
                message=f"The MCP server's address is not allowed: {refused} An operator "
                "can allow it with --egress-allow.",
            )
        if isinstance(exc, TimeoutError | httpx2.TimeoutException):
            return wire.McpCallError(
                type="http_error",
                code=GATEWAY_TIMEOUT,
                message=f"The MCP server did not answer within {self._timeout_s:g} s.",
            )
        if isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED:
            if self._status is not None:
                return wire.McpCallError(
                    type="http_error",
                    code=self._status,
                    message=f"The MCP server answered HTTP {self._status}.",
                )
            return wire.McpCallError(type="protocol_error", code=exc.code, message=exc.message)
        if isinstance(exc, httpx2.HTTPStatusError):
            status = exc.response.status_code
            return wire.McpCallError(
                type="http_error", code=status, message=f"The MCP server answered HTTP {status}."
            )
        return wire.McpCallError(
            type="http_error",
            code=BAD_GATEWAY,
            message=f"The MCP server could not be reached ({type(exc).__name__}).",
        )


class McpClients:
    """A session's MCP connections, by server label."""

    def __init__(
        self, timeout_s: float = DEFAULT_TIMEOUT_S, policy: egress.EgressPolicy | None = None
    ) -> None:
        """``policy``: where connections may go (None: the process's egress policy)."""
        self._timeout_s = timeout_s
        self._policy = policy
        self._connections: dict[str, McpConnection] = {}

    def connection(self, server: McpServer) -> McpConnection:
        """The connection to ``server``; one reached differently under the same label is
        replaced (the old one closes in the background)."""
        current = self._connections.get(server.label)
        if current is not None and current.server == server:
            return current
        if current is not None:
            asyncio.get_running_loop().create_task(current.close())
        self._connections[server.label] = McpConnection(server, self._timeout_s, self._policy)
        return self._connections[server.label]

    async def close(self, label: str) -> None:
        """Close the connection to the server ``label``, if any."""
        connection = self._connections.pop(label, None)
        if connection is not None:
            await connection.close()

    async def close_all(self) -> None:
        """Close every connection (the session ends)."""
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)


class _PolicedBackend(httpcore2.AsyncNetworkBackend):
    """An httpcore network backend that connects only where ``policy`` allows: it resolves
    the host itself and connects to an address it checked, trying each in turn, on every
    connection (so a rebound name is checked again).

    ``on_refused`` is told of each refusal (the connection reports it whatever the SDK
    wraps the error in).
    """

    def __init__(
        self,
        policy: egress.EgressPolicy,
        on_refused: Callable[[egress.EgressRefused], None] | None = None,
    ) -> None:
        self._policy = policy
        self._on_refused = on_refused
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """A TCP connection to an allowed address of ``host`` (TLS then names ``host``)."""
        try:
            async with asyncio.timeout(timeout):
                addresses = await self._policy.addresses(host, port)
        except egress.EgressRefused as exc:
            if self._on_refused is not None:
                self._on_refused(exc)
            raise
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(f"resolving {host} timed out") from exc
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """Never: a client cannot name a local socket."""
        raise egress.EgressRefused("Unix sockets are not reachable.")

    async def sleep(self, seconds: float) -> None:
        """As the default backend sleeps."""
        await self._inner.sleep(seconds)


def _policed_transport(backend: _PolicedBackend) -> httpx2.AsyncHTTPTransport:
    """An httpx transport whose every connection goes through ``backend``. A client given a
    transport uses no proxy of the environment, which would connect past the check."""
    transport = httpx2.AsyncHTTPTransport()
    # httpx takes no network backend, httpcore's pool does: the pool httpx made (its private
    # _pool, hark's only reach into httpx) is replaced by the same pool on the policed
    # backend. httpx2 and httpcore2 are pinned in uv.lock, and the refusals of
    # tests/e2e/test_mcp_tools.py fail if a version stops sending through this pool.
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2.create_ssl_context(), network_backend=backend
    )
    return transport


def _read_error(future: asyncio.Future[ClientSession]) -> None:
    if not future.cancelled():
        future.exception()


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _tool(tool: Tool) -> wire.McpTool:
    annotations = (
        tool.annotations.model_dump(by_alias=True, exclude_none=True)
        if tool.annotations is not None
        else None
    )
    return wire.McpTool(
        name=tool.name,
        input_schema=tool.input_schema,
        description=tool.description,
        annotations=annotations,
    )


def _output(result: CallToolResult) -> str:
    """A tool's result as the model reads it: its text, else its structured content."""
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content)
    return ""

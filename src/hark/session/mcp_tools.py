"""Remote MCP tools: the session's MCP servers, the tools they listed, and the calls that
wait for the user's approval.

Sans-I/O like the rest of the core: listing and calling are actions (``ListMcpTools``,
``CallMcpTool``) that the driver carries out with ``hark.tools.mcp_client``, and the results
come back through the session's ``on_mcp_*`` inputs. A server is listed when a session update
adds it (or changes how it is reached), into an ``mcp_list_tools`` conversation item; the tools
it listed, narrowed by ``allowed_tools``, reach the LLM as function tools. Responses call them
(see ``response_lifecycle``); ``require_approval`` turns a call into an ``mcp_approval_request``
item, which the client's ``mcp_approval_response`` item answers: an approved call runs at once.

A response with ``tools`` of its own has its own MCP servers instead of the session's
(``open_for_response``): each is listed into an ``mcp_list_tools`` output item of that response,
unless a listing of the same server (same label, URL and credentials) was made before in the
session, by the session or an earlier response, which is reused without a new item.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from hark.protocol import items as wire
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import McpToolDef, McpToolFilter, ToolDef
from hark.session.actions import CloseMcpServer, ListMcpTools
from hark.session.context import SessionContext, SessionPart
from hark.session.conversation import Entry
from hark.tools.mcp_server import McpServer


@dataclass(frozen=True, slots=True)
class McpTarget:
    """The MCP tool behind a name the LLM was offered."""

    server_label: str
    name: str


# How many listings (by how a server is reached) a session keeps for responses to reuse.
MAX_KNOWN_LISTINGS = 32


@dataclass(slots=True)
class ListedServer:
    """An MCP server whose tools the LLM may be offered: one of the session's, or one of a
    response's own."""

    config: McpToolDef
    # Its ``mcp_list_tools`` item; None for a response's server whose listing was reused.
    item: Entry | None
    # What the server listed and ``allowed_tools`` lets through; empty until listed.
    tools: list[wire.McpTool]
    # Still being listed.
    listing: bool = False


class ListingEnded(NamedTuple):
    """What the end of a server's listing changed: a response's own server was listed, or
    could not be (``response_item``, its complete ``mcp_list_tools`` item: the response may
    go on), or the session's tools became known (``tools_changed``: the LLM's prompt changed
    with them). ``label``: the server's."""

    label: str
    response_item: Entry | None = None
    tools_changed: bool = False


class McpTools(SessionPart):
    """The session's MCP servers and the approval requests not yet answered."""

    def __init__(self, context: SessionContext) -> None:
        super().__init__(context)
        self._servers: dict[str, ListedServer] = {}
        # What each server listed (before ``allowed_tools``), by how it is reached, for
        # responses naming the same server to reuse; the most recent last.
        self._known: dict[McpServer, list[wire.McpTool]] = {}
        # Responses' own servers being listed, by their ``mcp_list_tools`` item id.
        self._response_listings: dict[str, ListedServer] = {}
        # Approval requests made in this session and not yet answered, by item id, with how
        # to reach a response's own server (None: the session's server of that label).
        self._awaiting: dict[str, tuple[wire.McpApprovalRequestItem, McpServer | None]] = {}

    # ------------------------------------------------------------------ servers

    def configure(self, tools: list[ToolDef]) -> None:
        """The session's tools are now ``tools``: list each MCP server that is new or reached
        differently, and let go of those no longer there."""
        wanted = {t.server_label: t for t in tools if isinstance(t, McpToolDef)}
        for label, server in list(self._servers.items()):
            if wanted.get(label) != server.config:
                del self._servers[label]
                self._outbox.act(CloseMcpServer(label))
        for label, config in wanted.items():
            if label not in self._servers:
                self._list(config)

    def _list(self, config: McpToolDef) -> None:
        entry = Entry(
            id=self._ids.new("item"),
            type="mcp",
            mcp=wire.McpListToolsItem(server_label=config.server_label, tools=[]),
        )
        self._servers[config.server_label] = ListedServer(config, entry, [], listing=True)
        previous = self._conversation.insert(entry)
        self._outbox.emit(se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire()))
        self._outbox.emit(se.McpListToolsInProgress(item_id=entry.id))
        self._outbox.act(ListMcpTools(entry.id, server_of(config)))

    def open_for_response(
        self, configs: list[McpToolDef], add_output: Callable[[Entry], object]
    ) -> dict[str, ListedServer]:
        """A response's own MCP servers, by label. A server listed before in the session
        (by the session or another response, reached the same way) has that listing, narrowed
        by this ``allowed_tools``; any other is listed now into an ``mcp_list_tools`` item,
        which ``add_output`` makes an output item of the response before the listing starts.
        """
        servers: dict[str, ListedServer] = {}
        for config in configs:
            known = self._known.get(server_of(config))
            if known is not None:
                tools = [t for t in known if _allowed(config.allowed_tools, t)]
                servers[config.server_label] = ListedServer(config, None, tools)
                continue
            entry = Entry(
                id=self._ids.new("item"),
                type="mcp",
                mcp=wire.McpListToolsItem(server_label=config.server_label, tools=[]),
            )
            server = ListedServer(config, entry, [], listing=True)
            servers[config.server_label] = server
            self._response_listings[entry.id] = server
            add_output(entry)
            self._outbox.emit(se.McpListToolsInProgress(item_id=entry.id))
            self._outbox.act(ListMcpTools(entry.id, server_of(config)))
        return servers

    def abandon(self, servers: dict[str, ListedServer]) -> None:
        """A response ended: the listings of its servers still running are for nobody."""
        for server in servers.values():
            if server.item is not None:
                self._response_listings.pop(server.item.id, None)

    def listed(self, item_id: str, tools: list[wire.McpTool]) -> ListingEnded | None:
        """The server listed ``tools`` into the item ``item_id``; None when that listing is
        for nobody now."""
        ending = self._ending(item_id)
        if ending is None:
            return None
        server, item, own = ending
        self._remember(server.config, tools)
        server.tools = [t for t in tools if _allowed(server.config.allowed_tools, t)]
        assert isinstance(item.mcp, wire.McpListToolsItem)
        item.mcp = msgspec.structs.replace(item.mcp, tools=list(server.tools))
        self._outbox.emit(se.McpListToolsCompleted(item_id=item_id))
        return self._ended(server.config.server_label, item, own, tools_changed=True)

    def _remember(self, config: McpToolDef, tools: list[wire.McpTool]) -> None:
        reach = server_of(config)
        self._known.pop(reach, None)
        self._known[reach] = list(tools)
        while len(self._known) > MAX_KNOWN_LISTINGS:
            del self._known[next(iter(self._known))]

    def list_failed(self, item_id: str) -> ListingEnded | None:
        """The server could not be listed: it offers no tools. A response's own server fails
        the same way: the response goes on without its tools. None when that listing is for
        nobody now."""
        ending = self._ending(item_id)
        if ending is None:
            return None
        server, item, own = ending
        self._outbox.emit(se.McpListToolsFailed(item_id=item_id))
        return self._ended(server.config.server_label, item, own, tools_changed=False)

    def _ending(self, item_id: str) -> tuple[ListedServer, Entry, bool] | None:
        """The server listing into ``item_id``, its item, and whether it is a response's own
        server (not the session's), its listing over; None when that listing is for nobody
        now."""
        server = self._server_listing(item_id)
        own = server is None
        if server is None:
            server = self._response_listings.pop(item_id, None)
        if server is None or server.item is None:
            return None
        server.listing = False
        return server, server.item, own

    def _ended(self, label: str, item: Entry, own: bool, *, tools_changed: bool) -> ListingEnded:
        if own:
            return ListingEnded(label, response_item=item)
        self.item_done(item)
        return ListingEnded(label, tools_changed=tools_changed)

    def list_error(self, label: str, error: wire.McpCallError) -> None:
        """Why the server ``label`` could not be listed (down, refused by the egress
        policy…), to the client as an ``error`` event, as OpenAI reports a list that failed."""
        self._outbox.emit(
            se.Error(
                error=se.ErrorDetail(
                    type="invalid_request_error",
                    code="mcp_list_tools_failed",
                    message=f"Error retrieving tool list from MCP server: '{label}'. "
                    f"{error.message}",
                    param=None,
                    event_id=None,
                )
            )
        )

    def _server_listing(self, item_id: str) -> ListedServer | None:
        # A result for a server since removed or replaced is for nobody.
        return next(
            (s for s in self._servers.values() if s.item is not None and s.item.id == item_id),
            None,
        )

    def item_done(self, entry: Entry) -> None:
        """``conversation.item.done`` for ``entry``, if it is in the conversation."""
        entries = self._conversation.entries()
        if entry not in entries:
            return
        position = entries.index(entry)
        previous = entries[position - 1].id if position else None
        self._outbox.emit(se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire()))

    def server(
        self, label: str, servers: dict[str, ListedServer] | None = None
    ) -> McpServer | None:
        """How to reach the server ``label`` of ``servers`` (a response's own; None: the
        session's), if it is there."""
        server = (self._servers if servers is None else servers).get(label)
        return server_of(server.config) if server is not None else None

    # ------------------------------------------------------------------ the LLM's view

    def offered(
        self, taken: set[str], servers: dict[str, ListedServer] | None = None
    ) -> dict[str, tuple[McpTarget, wire.McpTool]]:
        """The tools ``servers`` (a response's own; None: the session's) listed, by the name
        the LLM sees: the tool's own, or, where a function or another server's tool has it
        already, ``<server_label>__<name>``. A server whose ``allowed_callers`` leaves out
        ``direct`` offers none."""
        names: dict[str, tuple[McpTarget, wire.McpTool]] = {}
        used = set(taken)
        for label, server in (self._servers if servers is None else servers).items():
            callers = server.config.allowed_callers
            if callers is not None and "direct" not in callers:
                # Tools only code may call: hark runs no code that calls tools.
                continue
            for tool in server.tools:
                name = tool.name if tool.name not in used else f"{label}__{tool.name}"
                if name in used:
                    continue
                used.add(name)
                names[name] = (McpTarget(label, tool.name), tool)
        return names

    def needs_approval(
        self, target: McpTarget, servers: dict[str, ListedServer] | None = None
    ) -> bool:
        """Whether a call of ``target``, a tool of ``servers`` (a response's own; None: the
        session's), waits for the user (``require_approval``)."""
        server = (self._servers if servers is None else servers).get(target.server_label)
        if server is None:
            return True
        rule = server.config.require_approval
        if rule is None or rule == "always":
            return True
        if rule == "never":
            return False
        tool = next((t for t in server.tools if t.name == target.name), None)
        if rule.always is not None and _matches(rule.always, target.name, tool):
            return True
        # A tool no rule names needs approval, OpenAI's default.
        return rule.never is None or not _matches(rule.never, target.name, tool)

    # ------------------------------------------------------------------ approvals

    def await_approval(self, entry: Entry, server: McpServer | None = None) -> None:
        """The approval request ``entry`` went to the client; ``server``: how to reach a
        response's own server (None: the session's server of that label, when approved)."""
        assert isinstance(entry.mcp, wire.McpApprovalRequestItem)
        self._awaiting[entry.id] = (entry.mcp, server)

    def check_response(self, item: wire.McpApprovalResponseItem, param: str) -> None:
        """A client's approval response must answer a request in the conversation."""
        request = self._conversation.get(item.approval_request_id, f"{param}.approval_request_id")
        if not isinstance(request.mcp, wire.McpApprovalRequestItem):
            raise ProtocolError(
                f"Item {item.approval_request_id[:100]} is not an mcp_approval_request.",
                f"{param}.approval_request_id",
            )

    def take_approved(
        self,
    ) -> list[tuple[str, wire.McpApprovalRequestItem, McpServer | None]]:
        """The requests the conversation now answers, approved ones returned by request id
        (to be called), with how to reach their server (None: the session's server of that
        label, as it is now); denied ones are dropped."""
        approved: list[tuple[str, wire.McpApprovalRequestItem, McpServer | None]] = []
        for entry in self._conversation.entries():
            answer = entry.mcp
            if not isinstance(answer, wire.McpApprovalResponseItem):
                continue
            awaited = self._awaiting.pop(answer.approval_request_id, None)
            if awaited is not None and answer.approve:
                approved.append((answer.approval_request_id, *awaited))
        return approved


def server_of(config: McpToolDef) -> McpServer:
    """The action's view of an MCP tool: where it is and its credentials."""
    assert config.server_url is not None
    return McpServer(
        label=config.server_label,
        url=config.server_url,
        headers=dict(config.headers or {}),
        authorization=config.authorization,
    )


def _read_only(tool: wire.McpTool | None) -> bool | None:
    annotations: Any = tool.annotations if tool is not None else None
    if isinstance(annotations, dict):
        hint = annotations.get("readOnlyHint", annotations.get("read_only_hint"))
        return hint if isinstance(hint, bool) else None
    return None


def _matches(rule: McpToolFilter, name: str, tool: wire.McpTool | None) -> bool:
    """Whether a filter names the tool: every criterion it sets must hold."""
    if rule.tool_names is not None and name not in rule.tool_names:
        return False
    return rule.read_only is None or _read_only(tool) is rule.read_only


def _allowed(rule: list[str] | McpToolFilter | None, tool: wire.McpTool) -> bool:
    if rule is None:
        return True
    if isinstance(rule, list):
        return tool.name in rule
    return _matches(rule, tool.name, tool)

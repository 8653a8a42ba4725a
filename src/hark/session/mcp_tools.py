"""Remote MCP tools: the session's MCP servers, the tools they listed, and the calls that
wait for the user's approval.

Sans-I/O like the rest of the core: listing and calling are actions (``ListMcpTools``,
``CallMcpTool``) that the driver carries out with ``hark.tools.mcp_client``, and the results
come back through the session's ``on_mcp_*`` inputs. A server is listed when a session update
adds it (or changes how it is reached), into an ``mcp_list_tools`` conversation item; the tools
it listed, narrowed by ``allowed_tools``, reach the LLM as function tools. Responses call them
(see ``response_lifecycle``); ``require_approval`` turns a call into an ``mcp_approval_request``
item, which the client's ``mcp_approval_response`` item answers: an approved call runs at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from hark.protocol import items as wire
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import McpToolDef, McpToolFilter, ToolDef
from hark.session.actions import CloseMcpServer, ListMcpTools, McpServer
from hark.session.conversation import Conversation, Entry
from hark.session.ids import IdGenerator
from hark.session.outbox import Outbox


@dataclass(frozen=True, slots=True)
class McpTarget:
    """The MCP tool behind a name the LLM was offered."""

    server_label: str
    name: str


@dataclass(slots=True)
class _Server:
    config: McpToolDef
    item: Entry
    # What the server listed and ``allowed_tools`` lets through; empty until listed.
    tools: list[wire.McpTool]


class McpTools:
    """The session's MCP servers and the approval requests not yet answered.

    ``tools_changed`` is called when a server's tools become known (the LLM's prompt
    changed with them).
    """

    def __init__(
        self,
        outbox: Outbox,
        ids: IdGenerator,
        conversation: Conversation,
        *,
        tools_changed: Callable[[], None],
    ) -> None:
        self._outbox = outbox
        self._ids = ids
        self._conversation = conversation
        self._tools_changed = tools_changed
        self._servers: dict[str, _Server] = {}
        # Approval requests made in this session and not yet answered, by item id.
        self._awaiting: dict[str, wire.McpApprovalRequestItem] = {}

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
        self._servers[config.server_label] = _Server(config, entry, [])
        previous = self._conversation.insert(entry)
        self._outbox.emit(se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire()))
        self._outbox.emit(se.McpListToolsInProgress(item_id=entry.id))
        self._outbox.act(ListMcpTools(entry.id, server_of(config)))

    def listed(self, item_id: str, tools: list[wire.McpTool]) -> None:
        """The server listed ``tools`` into the item ``item_id``."""
        server = self._server_listing(item_id)
        if server is None:
            return
        server.tools = [t for t in tools if _allowed(server.config.allowed_tools, t)]
        assert isinstance(server.item.mcp, wire.McpListToolsItem)
        server.item.mcp = msgspec.structs.replace(server.item.mcp, tools=list(server.tools))
        self._outbox.emit(se.McpListToolsCompleted(item_id=item_id))
        self.item_done(server.item)
        self._tools_changed()

    def list_failed(self, item_id: str, error: wire.McpCallError | None = None) -> None:
        """The server could not be listed: it offers no tools. ``error``, when known, also
        goes to the client as an ``error`` event (why: down, refused by the egress policy…),
        as OpenAI reports a list that failed."""
        server = self._server_listing(item_id)
        if server is None:
            return
        self._outbox.emit(se.McpListToolsFailed(item_id=item_id))
        self.item_done(server.item)
        if error is not None:
            label = server.config.server_label
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

    def _server_listing(self, item_id: str) -> _Server | None:
        # A result for a server since removed or replaced is for nobody.
        return next((s for s in self._servers.values() if s.item.id == item_id), None)

    def item_done(self, entry: Entry) -> None:
        """``conversation.item.done`` for ``entry``, if it is in the conversation."""
        entries = self._conversation.entries()
        if entry not in entries:
            return
        position = entries.index(entry)
        previous = entries[position - 1].id if position else None
        self._outbox.emit(se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire()))

    def server(self, label: str) -> McpServer | None:
        """How to reach the server ``label``, if the session still has it."""
        server = self._servers.get(label)
        return server_of(server.config) if server is not None else None

    # ------------------------------------------------------------------ the LLM's view

    def offered(self, taken: set[str]) -> dict[str, tuple[McpTarget, wire.McpTool]]:
        """The listed tools by the name the LLM sees: the tool's own, or, where a function
        or another server's tool has it already, ``<server_label>__<name>``. A server whose
        ``allowed_callers`` leaves out ``direct`` offers none."""
        names: dict[str, tuple[McpTarget, wire.McpTool]] = {}
        used = set(taken)
        for label, server in self._servers.items():
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

    def needs_approval(self, target: McpTarget) -> bool:
        """Whether a call of ``target`` waits for the user (``require_approval``)."""
        server = self._servers.get(target.server_label)
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

    def await_approval(self, entry: Entry) -> None:
        """The approval request ``entry`` went to the client."""
        assert isinstance(entry.mcp, wire.McpApprovalRequestItem)
        self._awaiting[entry.id] = entry.mcp

    def check_response(self, item: wire.McpApprovalResponseItem, param: str) -> None:
        """A client's approval response must answer a request in the conversation."""
        request = self._conversation.get(item.approval_request_id, f"{param}.approval_request_id")
        if not isinstance(request.mcp, wire.McpApprovalRequestItem):
            raise ProtocolError(
                f"Item {item.approval_request_id[:100]} is not an mcp_approval_request.",
                f"{param}.approval_request_id",
            )

    def take_approved(self) -> list[tuple[str, wire.McpApprovalRequestItem]]:
        """The requests the conversation now answers, approved ones returned by request id
        (to be called); denied ones are dropped."""
        approved: list[tuple[str, wire.McpApprovalRequestItem]] = []
        for entry in self._conversation.entries():
            answer = entry.mcp
            if not isinstance(answer, wire.McpApprovalResponseItem):
                continue
            request = self._awaiting.pop(answer.approval_request_id, None)
            if request is not None and answer.approve:
                approved.append((answer.approval_request_id, request))
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

"""How to reach one of a session's MCP servers: what the session core hands the MCP client.

Kept apart from the client (``hark.tools.mcp_client``), which needs the MCP package and
the network, so that the sans-I/O core can name a server without importing either.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class McpServer:
    """How to reach one of the session's MCP servers (``server_label`` names it).

    The credentials stay out of ``repr``, and so out of any log that prints an action.
    """

    label: str
    url: str
    headers: dict[str, str] = field(default_factory=dict, repr=False, hash=False)
    authorization: str | None = field(default=None, repr=False)

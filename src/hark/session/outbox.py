"""What the session core produced since its driver last looked: server events and actions.

Every input of the core ends with the driver draining the outbox, so it never holds more than
one input's outputs.
"""

from __future__ import annotations

from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.session.actions import Action
from hark.session.ids import IdGenerator

Output = se.ServerEvent | Action


class Outbox:
    """Server events (each given its ``event_id``) and actions, in the order they were made."""

    def __init__(self, ids: IdGenerator) -> None:
        self._ids = ids
        self._items: list[Output] = []

    def emit(self, event: se.ServerEvent) -> None:
        """Send ``event`` to the client."""
        event.event_id = self._ids.new("event")
        self._items.append(event)

    def act(self, action: Action) -> None:
        """Ask the driver for ``action``."""
        self._items.append(action)

    def error(self, error: ProtocolError, event_id: str | None) -> None:
        """Send ``error`` as an ``error`` event (``event_id``: the client event it answers)."""
        self.emit(
            se.Error(
                error=se.ErrorDetail(
                    type=error.type,
                    code=error.code,
                    message=error.message,
                    param=error.param,
                    event_id=event_id,
                )
            )
        )

    def drain(self) -> list[Output]:
        """Everything produced since the last call, in order."""
        out, self._items = self._items, []
        return out

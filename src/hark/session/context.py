"""What the parts of one session share: where its outputs go, its ids, its conversation, its
configuration, the limits it was made with, and the wall time of the input being handled.

The session holds one and hands it to each part it makes; a ``session.update`` replaces
``config`` here, and each input sets ``now``, so every part reads the configuration in force
and the time without calling back into the session.
"""

from __future__ import annotations

from dataclasses import dataclass

from hark.protocol.session_config import SessionConfig
from hark.session.conversation import Conversation
from hark.session.ids import IdGenerator
from hark.session.outbox import Outbox


@dataclass(slots=True)
class SessionContext:
    """One session's outbox, id generator, conversation, current configuration, and the wall
    time (UNIX seconds) handed in with the input being handled.

    ``audio_retention_ms``: how much of the latest conversation audio items keep (older items
    keep only their words). ``takes_images``: whether the LLM reads images (when not, items
    with images are refused)."""

    outbox: Outbox
    ids: IdGenerator
    conversation: Conversation
    config: SessionConfig
    audio_retention_ms: int
    takes_images: bool
    now: float = 0.0


class SessionPart:
    """Base of the parts of a session: each keeps the ``context`` it was made with, and the
    outbox, ids and conversation in it (which never change), as attributes of its own."""

    def __init__(self, context: SessionContext) -> None:
        self._context = context
        self._outbox = context.outbox
        self._ids = context.ids
        self._conversation = context.conversation

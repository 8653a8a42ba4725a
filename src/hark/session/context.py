"""What the parts of one session share: where its outputs go, its ids, its conversation and its
configuration.

The session holds one and hands it to each part it makes; a ``session.update`` replaces
``config`` here, so every part reads the configuration in force without calling back into the
session.
"""

from __future__ import annotations

from dataclasses import dataclass

from hark.protocol.session_config import SessionConfig
from hark.session.conversation import Conversation
from hark.session.ids import IdGenerator
from hark.session.outbox import Outbox


@dataclass(slots=True)
class SessionContext:
    """One session's outbox, id generator, conversation and current configuration."""

    outbox: Outbox
    ids: IdGenerator
    conversation: Conversation
    config: SessionConfig

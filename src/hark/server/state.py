"""What the application holds while it runs: its parts (as typed app keys) and its state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from hark.cluster.forwarding import Forwarder
from hark.cluster.hop_tls import HopTls
from hark.cluster.limits import FleetLimits
from hark.cluster.node import ClusterNode
from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.registry import Engines
from hark.observability.metrics import Metrics
from hark.server.auth import Authenticator
from hark.transports.call import CallHost, CallRegistry
from hark.transports.sip.service import SipService
from hark.transports.webrtc.calls import Calls

# The model name of the Realtime API, and of sessions that name none.
REALTIME_MODEL = "gpt-realtime"


@dataclass(slots=True)
class ServerState:
    """What the app tracks while it runs: engine warm-up and open WebSockets."""

    started_at: int = field(default_factory=lambda: int(time.time()))
    warmup: asyncio.Task[None] | None = None
    # "starting" until the warm-up ends, then "ready" or "failed".
    engines_status: Literal["starting", "ready", "failed"] = "starting"
    websockets: set[web.WebSocketResponse] = field(default_factory=set)
    # The WebSocket sessions running here (sidebands and forwarded sockets are not sessions).
    sessions: set[SessionRunner] = field(default_factory=set)
    # Why each call transport that is unavailable is (its port could not be bound, its TLS
    # files not read), by its registry's name (``webrtc``, ``sip``).
    unavailable: dict[str, str] = field(default_factory=dict)
    # Set on SIGTERM: /readyz turns red and nothing new starts here.
    draining: bool = False
    # Set whenever a session or call ends, so that a drain wakes up to count again.
    session_ended: asyncio.Event = field(default_factory=asyncio.Event)
    # Store updates made in the background when calls end.
    background: set[asyncio.Task[None]] = field(default_factory=set)
    # Sessions and calls admitted here and not yet ended (``max_sessions`` caps them).
    admitted: int = 0
    # The calls here that an ephemeral key opened, and that key's digest: the one call that
    # key may hang up or attach a sideband to.
    opened_by_ephemeral: dict[str, bytes] = field(default_factory=dict)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` in the background, kept until it ends."""
        task = asyncio.create_task(coro, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def engines_ready(self) -> bool:
        """Wait for the engines' warm-up to end; whether they loaded."""
        if self.warmup is not None:
            # wait() rather than await: a client leaving must not cancel the shared warm-up.
            await asyncio.wait([self.warmup])
        return self.engines_status == "ready"


SETTINGS = web.AppKey("settings", Settings)
ENGINES = web.AppKey("engines", Engines)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
STATE = web.AppKey("state", ServerState)
CALLS = web.AppKey("calls", Calls)
# The SIP service, absent with ``--no-sip``.
SIP = web.AppKey("sip", SipService)
# What makes every session's runner, WebSocket sessions and calls alike.
CALL_HOST = web.AppKey("call_host", CallHost)
# Every call transport's registry (WebRTC's ``CALLS``, then ``SIP`` when it is on): what the
# server starts, drains and closes, and where it looks a call up by id.
CALL_REGISTRIES: web.AppKey[list[CallRegistry]] = web.AppKey("call_registries")
METRICS = web.AppKey("metrics", Metrics)
NODE = web.AppKey("node", ClusterNode)
FORWARDER = web.AppKey("forwarder", Forwarder)
# TLS on the worker-to-worker hop, present when the fleet has a hop CA.
HOP_TLS = web.AppKey("hop_tls", HopTls)
LIMITS = web.AppKey("limits", FleetLimits)
# How long a session may last, in seconds.
SESSION_LIMIT = web.AppKey("session_limit", float)

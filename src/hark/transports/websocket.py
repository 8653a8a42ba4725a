"""The WebSocket transport: one session per connection, events as JSON text frames.

A thin driver around the session: a reader loop hands every frame to the session, a writer
task sends whatever the session emits. Either side ending ends both, and the session is
always closed, which cancels its engine work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from aiohttp import WSCloseCode, WSMsgType, web

logger = logging.getLogger(__name__)

# An append may carry 15 MiB of audio, about 20 MiB once base64 and JSON wrap it; larger
# frames close the connection with 1009 (message too big).
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Pings find dead peers (a laptop lid closed, a NAT forgot us) whose sessions would
# otherwise hold engine work until the 60-minute limit.
HEARTBEAT_SECONDS = 20.0
REALTIME_SUBPROTOCOL = "realtime"


class RealtimeSession(Protocol):
    """What the transport drives (``hark.session.runner.SessionRunner``)."""

    async def start(self) -> None:
        """Begin the session (queues ``session.created``)."""
        ...

    def receive_text(self, text: str) -> None:
        """One client text frame; never raises."""
        ...

    def receive_bytes(self, data: bytes) -> None:
        """One client binary frame; never raises."""
        ...

    def outgoing(self) -> AsyncIterator[str]:
        """Serialized server events; ends when the session is over."""
        ...

    async def close(self) -> None:
        """End the session and cancel its engine work; idempotent."""
        ...


def websocket_response(*, offered_realtime: bool) -> web.WebSocketResponse:
    """A response configured for Realtime sessions.

    It selects the ``realtime`` subprotocol only when the client offered it (browsers offer
    it with their key), since answering a subprotocol nobody asked for fails the handshake.
    """
    return web.WebSocketResponse(
        protocols=(REALTIME_SUBPROTOCOL,) if offered_realtime else (),
        max_msg_size=MAX_MESSAGE_BYTES,
        heartbeat=HEARTBEAT_SECONDS,
    )


async def run_session(ws: web.WebSocketResponse, session: RealtimeSession) -> None:
    """Start ``session`` and drive it over the prepared ``ws`` until either side ends.

    Returns once the connection is closed and the session is closed.
    """
    session_over = asyncio.Event()
    writer: asyncio.Task[None] | None = None
    try:
        await session.start()
        writer = asyncio.create_task(_send_events(ws, session, session_over))
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                session.receive_text(msg.data)
            elif msg.type is WSMsgType.BINARY:
                session.receive_bytes(msg.data)
            elif msg.type is WSMsgType.ERROR:
                logger.info("websocket closed on a bad frame: %s", ws.exception())
                break
    finally:
        if writer is not None:
            # A writer that is closing the socket is finishing the closing handshake.
            if not session_over.is_set():
                writer.cancel()
            # wait() rather than await: a cancellation of this task must not be swallowed.
            await asyncio.wait([writer])
            if not writer.cancelled() and writer.exception() is not None:
                logger.error("sending events failed", exc_info=writer.exception())
        await session.close()
        if not ws.closed:
            await ws.close(code=WSCloseCode.GOING_AWAY)


async def _send_events(
    ws: web.WebSocketResponse, session: RealtimeSession, session_over: asyncio.Event
) -> None:
    try:
        async for text in session.outgoing():
            await ws.send_str(text)
    except ConnectionError:
        # The peer went away mid-send; the reader loop sees the close and cleans up.
        return
    # The session is over (e.g. its time limit): closing ends the reader loop too.
    session_over.set()
    await ws.close(code=WSCloseCode.OK)

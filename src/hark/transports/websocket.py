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
# otherwise hold engine work until the 60-minute limit: a connection silent for this long is
# pinged, and closed if it stays silent for half as long again. aiohttp's own heartbeat
# re-arms a timer on every frame, which at 50 audio appends a second costs a third of what
# receiving the frame does; here a frame only records when it came.
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
        # Pings and pongs come to run_session, which answers pings and counts pongs as signs
        # of life.
        autoping=False,
        # Base64 audio barely deflates: per-message compression would cost zlib time on every
        # append and every reply delta for a quarter off their size.
        compress=False,
    )


async def run_session(ws: web.WebSocketResponse, session: RealtimeSession) -> None:
    """Start ``session`` and drive it over the prepared ``ws`` until either side ends.

    Returns once the connection is closed and the session is closed.
    """
    session_over = asyncio.Event()
    writer: asyncio.Task[None] | None = None
    loop = asyncio.get_running_loop()
    heard = _Heard(loop.time())
    keepalive = asyncio.create_task(_keep_alive(ws, heard, HEARTBEAT_SECONDS))
    try:
        await session.start()
        writer = asyncio.create_task(_send_events(ws, session, session_over))
        async for msg in ws:
            heard.at = loop.time()
            if msg.type is WSMsgType.TEXT:
                session.receive_text(msg.data)
            elif msg.type is WSMsgType.BINARY:
                session.receive_bytes(msg.data)
            elif msg.type is WSMsgType.PING:
                await ws.pong(msg.data)
            elif msg.type is WSMsgType.ERROR:
                logger.info("websocket closed on a bad frame: %s", ws.exception())
                break
    finally:
        keepalive.cancel()
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


class _Heard:
    """When the peer was last heard from (loop time)."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


async def _keep_alive(ws: web.WebSocketResponse, heard: _Heard, interval: float) -> None:
    """Ping a peer silent for ``interval``; close the connection if it stays silent."""
    loop = asyncio.get_running_loop()
    while not ws.closed:
        quiet = loop.time() - heard.at
        if quiet < interval:
            await asyncio.sleep(interval - quiet)
            continue
        pinged = loop.time()
        try:
            await ws.ping()
        except ConnectionError:
            return
        await asyncio.sleep(interval / 2)
        if heard.at < pinged and not ws.closed:
            logger.info("websocket peer silent for %.0f s after a ping: closing", interval * 1.5)
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"no answer to ping")
            return


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

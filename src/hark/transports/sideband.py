"""The sideband WebSockets of a call (``/v1/realtime?call_id=…``), WebRTC or SIP alike.

Every server event of the call's session goes to each attached socket, and client events
from any of them go to the session. A socket that stops reading is closed once
``MAX_SIDEBAND_BACKLOG`` events wait for it, rather than buffered for without end; when
the call ends every socket is closed after the events it was already given.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from hark.session.runner import SessionRunner

logger = logging.getLogger(__name__)

MAX_SIDEBAND_BACKLOG = 10000


class Sidebands:
    """The sockets attached to the call ``call_id``."""

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self._queues: set[asyncio.Queue[str | None]] = set()
        self._ended = False

    def __len__(self) -> int:
        return len(self._queues)

    def publish(self, text: str) -> None:
        """Hand a server event to every attached socket."""
        for queue in list(self._queues):
            if queue.qsize() >= MAX_SIDEBAND_BACKLOG:
                logger.warning("call %s: a sideband socket fell behind; closing it", self.call_id)
                self._queues.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(text)

    def end(self) -> None:
        """The call ended: each socket closes once it has sent what it was given."""
        self._ended = True
        for queue in self._queues:
            queue.put_nowait(None)

    async def serve(
        self, ws: web.WebSocketResponse, runner: SessionRunner, first: list[str] | None = None
    ) -> None:
        """Serve ``ws`` until it or the call ends; ``first``: events it gets before any
        published from now on."""
        # One place more than the backlog: the end-of-stream None always fits.
        queue: asyncio.Queue[str | None] = asyncio.Queue(MAX_SIDEBAND_BACKLOG + 1)
        for text in (first or [])[-MAX_SIDEBAND_BACKLOG:]:
            queue.put_nowait(text)
        self._queues.add(queue)
        writer = asyncio.create_task(_send(ws, queue), name=f"{self.call_id} sideband")
        try:
            if self._ended:
                return
            async for msg in ws:
                if msg.type is WSMsgType.TEXT:
                    runner.receive_text(msg.data)
                elif msg.type is WSMsgType.BINARY:
                    runner.receive_bytes(msg.data)
                elif msg.type is WSMsgType.ERROR:
                    break
        finally:
            self._queues.discard(queue)
            if not writer.done():
                writer.cancel()
            await asyncio.wait([writer])
            if not ws.closed:
                await ws.close(code=WSCloseCode.GOING_AWAY)


async def _send(ws: web.WebSocketResponse, queue: asyncio.Queue[str | None]) -> None:
    try:
        while (text := await queue.get()) is not None:
            await ws.send_str(text)
    except ConnectionError:
        return
    await ws.close(code=WSCloseCode.OK, message=b"call ended")

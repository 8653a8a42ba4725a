"""The sideband WebSockets of a call (``/v1/realtime?call_id=…``), WebRTC or SIP alike.

Every server event of the call's session goes to each attached socket, and client events
from any of them go to the session. A socket that stops reading is closed once
``MAX_SIDEBAND_BACKLOG`` events or ``MAX_SIDEBAND_BACKLOG_BYTES`` wait for it, rather than
buffered for without end: what waits is dropped and it gets a 1008 close naming the bound
(``RealtimeWebSocket.close_unread``); the call goes on. When the call ends every socket is
closed after the events it was already given.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from hark.driver.backlog import MAX_BACKLOG_BYTES, MAX_BACKLOG_EVENTS, backlog_reason
from hark.driver.runner import SessionRunner
from hark.transports.websocket import RealtimeWebSocket

logger = logging.getLogger(__name__)

MAX_SIDEBAND_BACKLOG = MAX_BACKLOG_EVENTS
# A call's events are small (its audio goes over RTP), so this is rarely the bound reached.
MAX_SIDEBAND_BACKLOG_BYTES = MAX_BACKLOG_BYTES
BACKLOG_REASON = backlog_reason(MAX_SIDEBAND_BACKLOG, MAX_SIDEBAND_BACKLOG_BYTES)


class _Attached:
    """One socket's events waiting to be written, and the task writing them."""

    def __init__(self, ws: web.WebSocketResponse, name: str) -> None:
        self.ws = ws
        # One place more than the backlog: the end-of-stream None always fits.
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(MAX_SIDEBAND_BACKLOG + 1)
        self.bytes = 0
        self.writer = asyncio.create_task(self._send(), name=name)

    def put(self, text: str) -> bool:
        """Queue ``text``; False, with nothing queued, when that would pass a bound."""
        if (
            self.queue.qsize() >= MAX_SIDEBAND_BACKLOG
            or self.bytes + len(text) > MAX_SIDEBAND_BACKLOG_BYTES
        ):
            return False
        self.bytes += len(text)
        self.queue.put_nowait(text)
        return True

    def overflowed(self) -> None:
        """The peer stopped reading: drop what waits and close it without waiting for it."""
        self.writer.cancel()
        while not self.queue.empty():
            self.queue.get_nowait()
        self.bytes = 0
        # Sidebands are always ``websocket_response()`` sockets (``attach_sideband``).
        if isinstance(self.ws, RealtimeWebSocket):
            self.ws.close_unread([], BACKLOG_REASON)

    async def _send(self) -> None:
        try:
            while (text := await self.queue.get()) is not None:
                self.bytes -= len(text)
                await self.ws.send_str(text)
        except ConnectionError:
            return
        await self.ws.close(code=WSCloseCode.OK, message=b"call ended")


class Sidebands:
    """The sockets attached to the call ``call_id``."""

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self._attached: set[_Attached] = set()
        self._ended = False

    def __len__(self) -> int:
        return len(self._attached)

    def publish(self, text: str) -> None:
        """Hand a server event to every attached socket."""
        for attached in list(self._attached):
            if not attached.put(text):
                logger.warning("call %s: a sideband socket fell behind; closing it", self.call_id)
                self._attached.discard(attached)
                attached.overflowed()

    def end(self) -> None:
        """The call ended: each socket closes once it has sent what it was given."""
        self._ended = True
        for attached in self._attached:
            attached.queue.put_nowait(None)

    async def serve(
        self, ws: web.WebSocketResponse, runner: SessionRunner, first: list[str] | None = None
    ) -> None:
        """Serve ``ws`` until it or the call ends; ``first``: events it gets before any
        published from now on (the latest ``MAX_SIDEBAND_BACKLOG``, as far as they fit)."""
        attached = _Attached(ws, f"{self.call_id} sideband")
        for text in (first or [])[-MAX_SIDEBAND_BACKLOG:]:
            if not attached.put(text):
                break
        self._attached.add(attached)
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
            self._attached.discard(attached)
            if not attached.writer.done():
                attached.writer.cancel()
            await asyncio.wait([attached.writer])
            if not ws.closed:
                await ws.close(code=WSCloseCode.GOING_AWAY)

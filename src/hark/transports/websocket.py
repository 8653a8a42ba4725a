"""The WebSocket transport: one session per connection, events as JSON text frames.

A thin driver around the session: text frames go to the session straight from aiohttp's
frame parser (``RealtimeWebSocket``), a reader loop handles the rest (binary frames, pings,
the close handshake), and the session's events are written as it makes them
(``RealtimeWebSocket.send_now``), with a writer task for what has to wait on a slow reader.
Either side ending ends both, and the session is always closed, which cancels its engine work.
A peer that stops reading is closed once the session's backlog passes its bound: it gets the
session's ``error`` event and a 1008 close naming the bound if it reads within
``STALLED_CLOSE_SECONDS``, and the connection is dropped if it does not. A peer that sends
faster than its share of the event loop is read less often (``hark.transports.input_budget``).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp._websocket.reader import WebSocketDataQueue, WebSocketReader
from aiohttp.helpers import DEFAULT_CHUNK_SIZE
from aiohttp.web_request import BaseRequest

from hark.protocol.limits import MAX_MESSAGE_BYTES
from hark.transports.input_budget import InputBudget, InputGate

logger = logging.getLogger(__name__)

# Pings find dead peers (a laptop lid closed, a NAT forgot us) whose sessions would
# otherwise hold engine work until the 60-minute limit: a connection silent for this long is
# pinged, and closed if it stays silent for half as long again. aiohttp's own heartbeat
# re-arms a timer on every frame, which at 50 audio appends a second costs a third of what
# receiving the frame does; here a frame only records when it came.
HEARTBEAT_SECONDS = 20.0
REALTIME_SUBPROTOCOL = "realtime"
# Events are written at once while less than this waits in the socket's send buffer; beyond
# it they queue for the writer task, which waits for the peer to read (aiohttp's drain).
SEND_NOW_MAX_BUFFERED = 256 * 1024
# How long a peer whose backlog passed the session's bound has to read its last events and
# the close frame before the connection is dropped with them unsent.
STALLED_CLOSE_SECONDS = 5.0


class RealtimeSession(Protocol):
    """What the transport drives (``hark.driver.runner.SessionRunner``)."""

    async def start(self) -> None:
        """Begin the session (queues ``session.created``)."""
        ...

    def catch_up(self) -> None:
        """Hand out the engine results ready for this loop's sessions (any of them) before
        this session's next input is handled, so that its input budget is not charged for
        them."""
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

    def send_with(
        self,
        send: Callable[[str], bool] | None,
        stalled: Callable[[str], None] | None = None,
    ) -> None:
        """Offer events to ``send`` as they are made; those it refuses go to ``outgoing``.
        ``stalled`` (with a reason) when ``outgoing``'s backlog passed its bound: the
        session is ending and ``outgoing`` holds only its last events."""
        ...

    async def close(self) -> None:
        """End the session and cancel its engine work; idempotent."""
        ...


class _TextQueue(WebSocketDataQueue):
    """aiohttp's queue of received messages, except that once ``on_text`` is set, text
    messages go to it straight from the frame parser instead of through the queue.

    A queued message costs a wake-up of the reader's task and a pass through
    ``WebSocketResponse.receive`` for every 20 ms append; handed over from the parser, an
    append is handled within the ``data_received`` that brought it. Other messages (pings,
    pongs, binary frames, the close handshake, errors) still go through the queue, and so
    does text while any of them waits there, to keep the order. While ``gate`` holds input
    (its session's input budget ran dry) every message goes to it, to come back through
    ``deliver`` in order.
    """

    def __init__(self, protocol: Any, limit: int, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(protocol, limit, loop=loop)
        self.on_text: Callable[[str], None] | None = None
        self.gate: InputGate[tuple[Any, int]] | None = None

    def feed_data(self, data: Any, size: int) -> None:
        gate = self.gate
        if gate is not None and gate.holding:
            gate.hold((data, size))
            return
        on_text = self.on_text
        if on_text is not None and data[0] is WSMsgType.TEXT and not self._buffer:
            on_text(data[1])
        else:
            super().feed_data(data, size)

    def deliver(self, message: tuple[Any, int]) -> None:
        """Hand on a message the gate held, as ``feed_data`` would have."""
        data, size = message
        on_text = self.on_text
        if on_text is not None and data[0] is WSMsgType.TEXT and not self._buffer:
            on_text(data[1])
        else:
            super().feed_data(data, size)

    @property
    def empty(self) -> bool:
        """Nothing is waiting in the queue."""
        return not self._buffer


class RealtimeWebSocket(web.WebSocketResponse):
    """A ``WebSocketResponse`` whose text messages can go straight to a session."""

    def _post_start(self, request: BaseRequest, protocol: str | None, writer: Any) -> None:
        # aiohttp's own _post_start (3.14), with a _TextQueue for its queue: the parser can
        # be set only once, so this cannot wrap it. tests/server/test_websocket.py fails if
        # text stops reaching sessions this way, and test_websocket_aiohttp_internals.py if
        # aiohttp's changes. This module is the only one that reaches into aiohttp.
        self._ws_protocol = protocol
        self._writer = writer
        self._transport = writer.transport
        self._http_protocol = request.protocol
        self._reset_heartbeat()
        queue = _TextQueue(request._protocol, DEFAULT_CHUNK_SIZE, loop=request._loop)
        self._reader = queue
        self._parser = WebSocketReader(
            queue,
            self._max_msg_size,
            compress=bool(self._compress),
            decode_text=self._decode_text,
        )
        request.protocol.set_parser(self._parser, data_received_cb=self._on_chunk)
        request.protocol.keep_alive(False)

    def _on_chunk(self) -> None:
        # Called by aiohttp before each read is parsed: a new pass of the loop over this
        # connection, for its input budget's quantum (and aiohttp's heartbeat, if set).
        gate = self._reader.gate if isinstance(self._reader, _TextQueue) else None
        if gate is not None:
            gate.new_pass()
        if self._heartbeat is not None:
            self._on_data_received()

    def send_now(self, text: str) -> bool:
        """Write ``text`` as one text frame now, if the connection is open and its send buffer
        holds under ``SEND_NOW_MAX_BUFFERED``; False, with nothing written, otherwise.

        Frames are written whole, so they never interleave with aiohttp's own (pings, the
        close frame, the writer task's); compression is off on these sockets.
        """
        transport = getattr(self, "_transport", None)
        if (
            transport is None
            or self.closed
            or transport.is_closing()
            or transport.get_write_buffer_size() > SEND_NOW_MAX_BUFFERED
        ):
            return False
        payload = text.encode()
        try:
            transport.writelines((_text_frame_header(len(payload)), payload))
        except (OSError, RuntimeError):
            # The socket failed under us: the writer task and the reader loop see it too.
            return False
        return True

    def close_unread(self, texts: list[str], reason: str) -> None:
        """Close a connection whose peer stopped reading, without waiting for it.

        ``texts`` as text frames and a 1008 close frame with ``reason`` go after what the
        send buffer holds, then the end of the stream; the connection is dropped if the peer
        has not closed it within ``STALLED_CLOSE_SECONDS``. What the peer sends meanwhile is
        still read (and ignored by its closed session): a socket closed with data unread
        would reset the connection and lose what the peer had not read yet.
        """
        transport = getattr(self, "_transport", None)
        if transport is None or transport.is_closing():
            return
        frames: list[bytes] = []
        for text in texts:
            payload = text.encode()
            frames += (_text_frame_header(len(payload)), payload)
        # A control frame's payload is at most 125 bytes: the code and 123 of the reason.
        close = struct.pack("!H", WSCloseCode.POLICY_VIOLATION) + reason.encode()[:123]
        frames += (struct.pack("!BB", 0x88, len(close)), close)
        transport.writelines(frames)
        transport.write_eof()
        asyncio.get_running_loop().call_later(STALLED_CLOSE_SECONDS, transport.abort)

    def throttle_input(
        self, throttled: Callable[[float], None] | None = None
    ) -> InputGate[tuple[Any, int]] | None:
        """An ``InputGate`` on this connection's reading with a fresh ``InputBudget``:
        messages are held by it from the frame parser while the budget is dry (None before
        the response is prepared). ``throttled`` is told each time reading was paused."""
        queue = getattr(self, "_reader", None)
        if not isinstance(queue, _TextQueue):
            return None
        gate: InputGate[tuple[Any, int]] = InputGate(
            InputBudget(time.perf_counter()),
            pause_reading=self._transport.pause_reading,
            resume_reading=self._resume_reading,
            deliver=queue.deliver,
            throttled=throttled,
        )
        queue.gate = gate
        return gate

    def _resume_reading(self) -> None:
        # Not while aiohttp's own flow control holds the connection (its queue of pings,
        # binary frames and the close is full): reading its queue resumes it.
        if not self._http_protocol._reading_paused:
            self._transport.resume_reading()

    def text_to(self, on_text: Callable[[str], None] | None) -> bool:
        """From now on, hand text messages to ``on_text`` as they are parsed (None: queue
        them again); only while nothing is queued, since what came before must be received
        first. True once set."""
        queue = self._reader
        if not isinstance(queue, _TextQueue) or (on_text is not None and not queue.empty):
            return False
        queue.on_text = on_text
        return True


def _text_frame_header(length: int) -> bytes:
    """A final, unmasked text frame's header (RFC 6455 section 5.2) for ``length`` bytes."""
    if length < 126:
        return struct.pack("!BB", 0x81, length)
    if length < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, length)
    return struct.pack("!BBQ", 0x81, 127, length)


def websocket_response(*, offered_realtime: bool) -> RealtimeWebSocket:
    """A response configured for Realtime sessions.

    It selects the ``realtime`` subprotocol only when the client offered it (browsers offer
    it with their key), since answering a subprotocol nobody asked for fails the handshake.
    """
    return RealtimeWebSocket(
        protocols=(REALTIME_SUBPROTOCOL,) if offered_realtime else (),
        max_msg_size=MAX_MESSAGE_BYTES,
        # Pings and pongs come to run_session, which answers pings and counts pongs as signs
        # of life.
        autoping=False,
        # Base64 audio barely deflates: per-message compression would cost zlib time on every
        # append and every reply delta for a quarter off their size.
        compress=False,
    )


async def run_session(
    ws: web.WebSocketResponse,
    session: RealtimeSession,
    *,
    throttled: Callable[[float], None] | None = None,
) -> None:
    """Start ``session`` and drive it over the prepared ``ws`` until either side ends.

    Returns once the connection is closed and the session is closed. With a
    ``RealtimeWebSocket``, text messages go to the session straight from the frame parser
    once those received before the session started have been handled, the session's
    events are written as it makes them, and the time spent on the client's input is
    charged to an input budget, past which the connection is read less often (``throttled``
    is told each time, with how long reading was paused).
    """
    session_over = asyncio.Event()
    writer: asyncio.Task[None] | None = None
    closer: asyncio.Task[None] | None = None
    loop = asyncio.get_running_loop()
    heard = _Heard(loop.time())
    keepalive = asyncio.create_task(_keep_alive(ws, heard, HEARTBEAT_SECONDS))
    clock = time.perf_counter
    gate = ws.throttle_input(throttled) if isinstance(ws, RealtimeWebSocket) else None
    charge = gate.spent if gate is not None else _free

    def on_text(text: str) -> None:
        heard.at = loop.time()
        # Other sessions' VAD results handed out first would be charged to this one: a batch's
        # turn ends (commits, responses) took its input past the quantum, and its reading
        # was paused until the loop's next pass for work that was not its own.
        session.catch_up()
        start = clock()
        session.receive_text(text)
        charge(start)

    def on_stalled(reason: str) -> None:
        nonlocal closer
        if closer is None and writer is not None:
            closer = asyncio.create_task(_close_stalled(ws, session, writer, reason))

    # Text goes straight to the session once what was queued before it started is handled.
    switching = ws if isinstance(ws, RealtimeWebSocket) else None
    try:
        await session.start()
        writer = asyncio.create_task(_send_events(ws, session, session_over))
        session.send_with(ws.send_now if isinstance(ws, RealtimeWebSocket) else None, on_stalled)
        if switching is not None and switching.text_to(on_text):
            switching = None
        async for msg in ws:
            heard.at = loop.time()
            session.catch_up()
            start = clock()
            if msg.type is WSMsgType.TEXT:
                session.receive_text(msg.data)
                if switching is not None and switching.text_to(on_text):
                    switching = None
            elif msg.type is WSMsgType.BINARY:
                session.receive_bytes(msg.data)
            elif msg.type is WSMsgType.PING:
                await ws.pong(msg.data)
            elif msg.type is WSMsgType.ERROR:
                logger.info("websocket closed on a bad frame: %s", ws.exception())
                break
            charge(start)
            if gate is not None:
                # Reading the queue now would let aiohttp resume a connection the budget paused.
                await gate.wait()
    finally:
        if gate is not None:
            gate.close()
        if isinstance(ws, RealtimeWebSocket):
            ws.text_to(None)
        session.send_with(None)
        keepalive.cancel()
        if closer is not None:
            # wait() rather than await, as for the writer below; bounded by its own timeout.
            await asyncio.wait([closer])
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


def _free(start: float) -> None:
    """Charges nothing (a connection without an input budget)."""


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


async def _close_stalled(
    ws: web.WebSocketResponse, session: RealtimeSession, writer: asyncio.Task[None], reason: str
) -> None:
    """Close a peer that stopped reading: its session's last events (the ``error``), then a
    1008 close with ``reason``, if it reads them in time; else drop the connection."""
    # The writer waits for the peer to read; each frame it started is already in the buffer.
    writer.cancel()
    await asyncio.wait([writer])
    logger.info("websocket closed: %s", reason)
    last = [text async for text in session.outgoing()]
    if isinstance(ws, RealtimeWebSocket):
        ws.close_unread(last, reason)
        return
    try:
        async with asyncio.timeout(STALLED_CLOSE_SECONDS):
            for text in last:
                await ws.send_str(text)
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=reason.encode()[:123])
    except (TimeoutError, ConnectionError):
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

"""Twilio Media Streams: a phone number on Twilio talks to hark through ``<Connect><Stream>``.

Twilio opens a WebSocket to the stream's URL and speaks JSON text messages: ``connected``,
``start`` (the stream's and call's ids, the ``<Parameter>`` values as ``customParameters``,
the audio format), ``media`` (20 ms of mu-law at 8 kHz, base64), ``dtmf``, ``mark`` (the
echo of a mark we sent, once the audio sent before it has played, or at once when we
``clear``), and ``stop``. We send ``media``, ``mark`` and ``clear``.

Trust: Twilio signs the upgrade with ``X-Twilio-Signature`` (``hark.transports.
twilio_account``). Without an auth token the endpoint does not exist (the registry is
not registered, so the route answers 404); with one, an upgrade without a valid signature
gets 403 before anything else is read. Behind a proxy the URL Twilio requested is not the
one hark sees, so the operator gives its public base (``twilio_url``). The signature covers
the query too: settings given there are as trusted as the ``<Parameter>`` values.

A stream becomes a ``TwilioCall`` (``rtc_…``) that rings like a SIP call: with the call
webhook, ``realtime.call.incoming`` goes to the backend (Twilio's ids and the parameters
as ``X-Twilio-…`` headers), which accepts or rejects it through
``/v1/realtime/calls/{id}/…`` within the accept timeout; without one, the call is answered
at once with the default session, or with the stored prompt a ``prompt`` parameter names.
A rejected call closes the stream, and Twilio goes on with the TwiML after ``<Connect>``.
An answered call is transferred (``refer``) by redirecting it through Twilio's REST API to a
``<Dial>`` of the target; Twilio then stops the stream.

Reply audio: the session's ``AudioPlayer`` is a ``TwilioMedia``, a ``Playout`` at 8 kHz
paced by the worker's ``Pacer``, which sends each frame with audio ``LEAD_S`` ahead of real
time, followed by a mark. Twilio buffers what it gets, so the lead is what a ``clear``
(barge-in) takes back; what the caller heard of a response is what the last mark Twilio
acknowledged covered, and a cleared response is truncated to it. A response counts as
played out once the mark of its last frame comes back. With echo cancellation, the frames as
they leave are the reference (``hark.transports.echo``) and the caller's audio is cancelled
at 8 kHz before it is resampled for the session; Twilio's media comes on its own clock, so
the reference is paired with the canceller's lead, as a WebRTC call's is.

A call ends on ``stop``, the socket closing, hang-up through the API, a reject, the end of
its session, and server shutdown; ending closes the socket once and releases the session.
``TwilioStreams`` is a ``hark.transports.call.CallRegistry``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from aiohttp import WSCloseCode, WSMsgType, web

from hark.audio.codecs.g711 import ulaw_decode, ulaw_encode
from hark.driver.runner import SessionRunner
from hark.protocol.session_config import SessionConfig, parse_session_config
from hark.transports.call import (
    CALL_ID_PREFIX,
    CallHooks,
    CallHost,
    CallStateError,
    CallTypeError,
    MediaCall,
    Ringing,
    RingingCalls,
)
from hark.transports.echo import CallEcho
from hark.transports.phone_media import RATE, PhoneMedia
from hark.transports.playout import Playout, PlayoutListener
from hark.transports.ticker import Pacer
from hark.transports.twilio_account import TwilioAccount, dial_twiml

logger = logging.getLogger(__name__)

STREAM_PATH = "/twilio/stream"
SIGNATURE_HEADER = "X-Twilio-Signature"
FRAME_MS = 20
# How far ahead of real time reply audio goes to Twilio: enough to ride over a late tick or
# a slow network, little enough that a clear stops the caller's audio at once.
LEAD_S = 0.1
# A media message is about 250 bytes and ``start`` a few KB with its parameters; larger
# messages close the socket (1009).
MAX_MESSAGE_BYTES = 64 * 1024
# How long Twilio may take from the upgrade to ``start``.
START_TIMEOUT_S = 10.0
# Messages waiting for a socket that does not take them (about 5 s of reply audio with its
# marks); beyond, the peer is not reading and the call ends.
MAX_OUTBOX = 500
# Marks sent and not yet acknowledged that are remembered (a minute of audio).
MAX_PENDING_MARKS = 3000
# What Twilio sends, as ``mediaFormat`` says it.
MEDIA_FORMAT = ("audio/x-mulaw", RATE, 1)
_DIGITS = frozenset("0123456789*#ABCD")

# The session of an accepted call, from the accepted config (None: the default) for the
# accepting owner, played by the call's media.
RunnerFor = Callable[["TwilioMedia", SessionConfig | None, str], SessionRunner]


class StreamError(Exception):
    """A message Twilio's protocol does not allow; the socket closes with ``code``."""

    def __init__(self, message: str, code: WSCloseCode = WSCloseCode.INVALID_TEXT) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True, slots=True)
class StreamStart:
    """What a ``start`` message says: Twilio's ids and the ``<Parameter>`` values."""

    stream_sid: str
    call_sid: str
    account_sid: str
    parameters: dict[str, str]

    @classmethod
    def parse(cls, message: dict[str, Any]) -> StreamStart:
        """The ``start`` message's fields; raises ``StreamError``."""
        start = message.get("start")
        if not isinstance(start, dict):
            raise StreamError("'start' has no start object")
        ids = (
            message.get("streamSid", start.get("streamSid")),
            start.get("callSid", ""),
            start.get("accountSid", ""),
        )
        if not all(isinstance(v, str) and 0 < len(v) <= 64 for v in ids[:1]) or not all(
            isinstance(v, str) and len(v) <= 64 for v in ids
        ):
            raise StreamError("'start' has no valid streamSid, callSid or accountSid")
        stream_sid, call_sid, account_sid = (str(v) for v in ids)
        media = start.get("mediaFormat", {})
        found = (media.get("encoding"), media.get("sampleRate"), media.get("channels"))
        if found != MEDIA_FORMAT:
            raise StreamError(f"unsupported media format {found!r}", WSCloseCode.UNSUPPORTED_DATA)
        params = start.get("customParameters") or {}
        if not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in params.items()
        ):
            raise StreamError("'customParameters' must map names to strings")
        return cls(stream_sid, call_sid, account_sid, params)

    def headers(self) -> list[tuple[str, str]]:
        """The stream as the call webhook lists it: Twilio's ids and every parameter."""
        return [
            ("X-Twilio-CallSid", self.call_sid),
            ("X-Twilio-AccountSid", self.account_sid),
            ("X-Twilio-StreamSid", self.stream_sid),
            *((f"X-Twilio-Param-{name}", value) for name, value in self.parameters.items()),
        ]


class TwilioMedia(PhoneMedia):
    """One stream's audio: the caller's in, the session's reply out (its ``AudioPlayer``,
    whose ``clear`` is Twilio's).

    ``send`` queues a message to Twilio. The reply's frames leave ``LEAD_S`` ahead of real
    time, each with a mark; ``acked`` takes Twilio's mark echoes, which say what was heard.
    ``echo_cancellation``: the reply's echo is taken out of the caller's audio.
    """

    def __init__(
        self, send: Callable[[dict[str, Any]], None], pacer: Pacer, echo_cancellation: bool
    ) -> None:
        super().__init__()
        self._send = send
        self._pacer = pacer
        # The reply audio, whose schedule the pacer follows.
        self.playout = playout = Playout(
            RATE, frame_ms=FRAME_MS, clock=asyncio.get_running_loop().time
        )
        self._echo = (
            CallEcho(RATE, self._pass_heard, lambda: playout.frames_skipped)
            if echo_cancellation
            else None
        )
        self._listener: PlayoutListener | None = None
        # Marks are numbered; those up to ``_flushed`` were sent before a clear, and their
        # echoes say nothing about what was heard.
        self._seq = 0
        self._acked = 0
        self._flushed = 0
        # (mark, response, ms of the response heard once that mark comes back)
        self._pending: deque[tuple[int, str, int]] = deque(maxlen=MAX_PENDING_MARKS)
        self._current: str | None = None
        self._frames: dict[str, int] = {}
        self._heard: dict[str, int] = {}
        self._last_mark: dict[str, int] = {}
        # Responses whose audio was all sent, by the mark that says they were heard.
        self._stops: dict[int, str] = {}
        self._stopped_now: list[str] = []
        self._running = False

    def start(self, runner: SessionRunner) -> None:
        """Pass the caller's audio to ``runner`` and play its replies from now on."""
        self._on_audio = runner.receive_audio
        self._input_rate = runner.input_rate
        self._listener = runner
        self.playout.attach(self)
        if self._echo is not None:
            self.playout.tap = self._echo.played
        self._running = True
        self._pacer.add(self, lead_s=LEAD_S)

    def stop(self) -> None:
        """Send nothing more and report nothing more."""
        self._running = False
        self._pacer.remove(self)
        self.playout.stop()
        self._listener = None
        self._on_audio = None
        # Its release is this media's own method: held, the two would keep each other.
        self._echo = None

    # ------------------------------------------------------------------ caller's audio

    def receive(self, payload: str) -> None:
        """A ``media`` message's base64 mu-law: to the session at its input rate."""
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise StreamError("a media payload is not base64") from None
        if self._on_audio is None or not data:
            return
        pcm = ulaw_decode(data)
        if self._echo is not None:
            pcm = self._echo.heard(pcm, RATE)
        self._pass_heard(pcm)

    def acked(self, name: str) -> None:
        """Twilio echoed the mark ``name``: the audio sent before it has played."""
        try:
            seq = int(name)
        except ValueError:
            return
        if seq <= max(self._acked, self._flushed):
            return
        self._acked = seq
        while self._pending and self._pending[0][0] <= seq:
            mark, response_id, heard_ms = self._pending.popleft()
            self._heard[response_id] = heard_ms
            stopped = self._stops.pop(mark, None)
            if stopped is not None:
                self._played_out(stopped)

    # ------------------------------------------------------------------ AudioPlayer

    def clear(self, response_id: str) -> None:
        """Stop the response's audio: Twilio drops what it holds (``clear``) and the rest
        is not sent. Twilio's clear drops every response it holds, so a response sent
        whole and not yet heard to its end is cut too, at what was heard of it."""
        cut = list(self._stops.values())
        if self._seq > max(self._acked, self._flushed):
            self._send({"event": "clear"})
            self._flushed = self._seq
            self._pending.clear()
            self._stops.clear()
        loop = asyncio.get_running_loop()
        for cut_id in cut:
            loop.call_soon(self._cut, cut_id)
        if response_id not in cut:
            self.playout.clear(response_id)

    # ------------------------------------------------------------------ PlayoutListener

    def playout_started(self, response_id: str) -> None:
        """The playout cut the response's first frame."""
        self._current = response_id
        if self._listener is not None:
            self._listener.playout_started(response_id)

    def playout_stopped(self, response_id: str) -> None:
        """The playout cut the response's last frame: it has played once that is heard."""
        self._stopped_now.append(response_id)

    def playout_cleared(self, response_id: str, played_ms: int) -> None:
        """The playout dropped the rest of the response: it keeps what the caller heard."""
        heard = min(played_ms, self._heard.get(response_id, 0))
        self._forget(response_id)
        if self._listener is not None:
            self._listener.playout_cleared(response_id, heard)

    # ------------------------------------------------------------------ frames

    def send_frame(self, due: float) -> None:
        """The next frame, ``LEAD_S`` ahead of its time (the pacer's ``PacedStream``)."""
        frame = self.playout.next_frame()
        if not self._running:
            return
        if frame is not self.playout.silence:
            self._send_frame(frame)
        stopped, self._stopped_now = self._stopped_now, []
        for response_id in stopped:
            mark = self._last_mark.get(response_id, 0)
            if mark <= self._acked:
                self._played_out(response_id)
            else:
                self._stops[mark] = response_id

    def frames_sent(self) -> None:
        """Nothing waits for the tick's frames: the caller's audio is passed on as it comes."""

    def _send_frame(self, frame: npt.NDArray[np.int16]) -> None:
        self._seq += 1
        self._send(
            {"event": "media", "media": {"payload": base64.b64encode(ulaw_encode(frame)).decode()}}
        )
        self._send({"event": "mark", "mark": {"name": str(self._seq)}})
        response_id = self._current
        if response_id is not None:
            frames = self._frames[response_id] = self._frames.get(response_id, 0) + 1
            self._last_mark[response_id] = self._seq
            self._pending.append((self._seq, response_id, frames * FRAME_MS))

    def _played_out(self, response_id: str) -> None:
        self._forget(response_id)
        if self._listener is not None:
            self._listener.playout_stopped(response_id)

    def _cut(self, response_id: str) -> None:
        heard = self._heard.get(response_id, 0)
        self._forget(response_id)
        if self._listener is not None:
            self._listener.playout_cleared(response_id, heard)

    def _forget(self, response_id: str) -> None:
        self._frames.pop(response_id, None)
        self._heard.pop(response_id, None)
        self._last_mark.pop(response_id, None)
        if self._current == response_id:
            self._current = None


class TwilioCall(MediaCall):
    """A Twilio Media Stream (``rtc_…``): rings (``pending``) until accepted or rejected,
    as a SIP call does. ``serve`` reads the stream until it ends; ``runner_for`` makes the
    session of an accepted call. A stream has no event channel: the events made before the
    first sideband attaches are held for it. ``account`` redirects the call for a transfer;
    ``echo_cancellation``: the reply's echo is taken out of the caller's audio."""

    kind = "Twilio"
    actions = frozenset({"accept", "reject", "refer"})

    def __init__(
        self,
        call_id: str,
        ws: web.WebSocketResponse,
        stream: StreamStart,
        runner_for: RunnerFor,
        pacer: Pacer,
        account: TwilioAccount,
        *,
        echo_cancellation: bool = True,
        on_closed: Callable[[TwilioCall], None] | None = None,
    ) -> None:
        super().__init__(call_id, "", on_closed=on_closed, hold_for_sideband=True)
        self.state = "pending"
        self.stream = stream
        self.media = TwilioMedia(self._send, pacer, echo_cancellation)
        self._account = account
        self._ws = ws
        self._runner_for = runner_for
        self._outbox: deque[str] = deque()
        self._wake = asyncio.Event()
        self._spawn(self._write(), "write")

    async def accept(self, config: SessionConfig | None, owner: str) -> None:
        """Answer the stream with a session of ``config`` for ``owner``; raises
        ``CallStateError`` when it no longer rings."""
        if self.state != "pending" or self._closing:
            raise CallStateError(f"The call is {self._public_state()}; it cannot be accepted.")
        self.state = "accepted"
        self.settled.set()
        self.owner = owner
        self.runner = runner = self._runner_for(self.media, config, owner)
        await runner.start()
        self._start_events()
        self.media.start(runner)
        logger.info("call %s answered (session %s)", self.id, runner.id)

    def reject(self, status: int = 603) -> None:
        """Decline the ringing call: its stream closes and Twilio goes on with the TwiML
        after ``<Connect>`` (a stream has no status to carry ``status``)."""
        if self.state != "pending" or self._closing:
            raise CallStateError(f"The call is {self._public_state()}; it cannot be rejected.")
        self.settled.set()
        self._spawn(self.close("rejected"), "close")

    async def refer(self, target_uri: str) -> int:
        """Transfer the answered call to ``target_uri``: Twilio's REST API redirects it to a
        ``<Dial>`` of the target (200 once Twilio took the update; the stream stops then).
        Raises ``CallStateError``, ``CallTypeError`` for a stream that did not say its
        account and call, ``CallReferError`` when Twilio refused, and ``TimeoutError``."""
        if self.state != "accepted" or self._closing:
            raise CallStateError(f"The call is {self._public_state()}; it cannot be referred.")
        stream = self.stream
        if not stream.account_sid or not stream.call_sid:
            raise CallTypeError(
                "This Twilio stream did not say its accountSid and callSid; it cannot be referred."
            )
        await self._account.redirect(stream.account_sid, stream.call_sid, dial_twiml(target_uri))
        logger.info("call %s: Twilio redirected call %s to a transfer", self.id, stream.call_sid)
        return 200

    async def serve(self) -> str:
        """Read the stream until it ends; why it ended."""
        ws = self._ws
        async for message in ws:
            if message.type == WSMsgType.BINARY:
                await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"text only")
                return "binary message"
            if message.type != WSMsgType.TEXT:
                return f"stream error: {ws.exception()}"
            try:
                if self._receive(message.data):
                    return "twilio: stop"
            except StreamError as exc:
                logger.info("call %s: %s; closing the stream", self.id, exc)
                await ws.close(code=exc.code, message=b"protocol error")
                return f"protocol error: {exc}"
        return "stream closed"

    def _receive(self, text: str) -> bool:
        """One message from Twilio; True for ``stop``."""
        message = _json(text)
        event = message.get("event")
        if event == "media":
            media = message.get("media")
            payload = media.get("payload") if isinstance(media, dict) else None
            if not isinstance(payload, str):
                raise StreamError("a media message has no payload")
            if self.state == "accepted":
                self.media.receive(payload)
        elif event == "mark":
            mark = message.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            if isinstance(name, str):
                self.media.acked(name)
        elif event == "dtmf":
            dtmf = message.get("dtmf")
            digit = dtmf.get("digit") if isinstance(dtmf, dict) else None
            if digit in _DIGITS and self.runner is not None and self.state == "accepted":
                self.runner.receive_dtmf(digit)
        elif event == "stop":
            return True
        # Other events (a second ``connected``, new ones) carry nothing a call needs.
        return False

    def _send(self, message: dict[str, Any]) -> None:
        if self._closing:
            return
        if len(self._outbox) >= MAX_OUTBOX:
            logger.warning("call %s: Twilio is not reading the stream; ending the call", self.id)
            self._closing_soon("twilio is not reading")
            return
        message["streamSid"] = self.stream.stream_sid
        self._outbox.append(json.dumps(message, separators=(",", ":")))
        self._wake.set()

    def _closing_soon(self, reason: str) -> None:
        if not self._closing:
            self._spawn(self.close(reason), "close")

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._outbox:
                    await self._ws.send_str(self._outbox.popleft())
        except ConnectionError as exc:
            self._closing_soon(f"stream error: {exc}")

    def _close_begins(self) -> None:
        self.media.stop()

    async def _release(self) -> None:
        self._outbox.clear()
        await self._ws.close()

    def _public_state(self) -> str:
        return "ended" if self._closing else self.state


def _json(text: str) -> dict[str, Any]:
    try:
        message = json.loads(text)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise StreamError("a message is not a JSON object")
    return message


class TwilioStreams(RingingCalls[TwilioCall]):
    """The Twilio streams of one worker, at ``STREAM_PATH``, signed by ``account``.

    ``public_url``: the scheme and host Twilio reaches the server at (``wss://host``; None:
    what the request says). Without a webhook (``ringing.announce``) a call is answered at
    once with the default session, or the stored prompt a ``prompt`` parameter names.
    ``echo_cancellation``: calls take the reply's echo out of the caller's audio.
    """

    name = "twilio"

    def __init__(
        self,
        host: CallHost,
        hooks: CallHooks,
        ringing: Ringing,
        *,
        account: TwilioAccount,
        public_url: str | None = None,
        echo_cancellation: bool = True,
    ) -> None:
        super().__init__(host, hooks, ringing)
        self.account = account
        self.public_url = public_url.rstrip("/") if public_url else None
        self.echo_cancellation = echo_cancellation

    def __repr__(self) -> str:
        return f"TwilioStreams(path={STREAM_PATH!r}, calls={len(self._calls)})"

    @property
    def listening(self) -> str:
        """The stream endpoint, in words."""
        return f"HTTP path {STREAM_PATH}"

    async def start(self) -> None:
        """Nothing to bind: streams come through the HTTP server."""
        logger.info(
            "Twilio streams at %s; %s",
            STREAM_PATH,
            "calls raise a webhook" if self.ringing.announce else "calls are answered at once",
        )

    async def stop(self) -> None:
        """End every stream and what was waiting on one."""
        await self._stop_calls()

    def routes(self) -> list[web.RouteDef]:
        """The stream endpoint Twilio's ``<Stream url>`` names."""
        return [web.get(STREAM_PATH, self.stream)]

    # ------------------------------------------------------------------ streams

    def signed(self, request: web.Request) -> bool:
        """Whether the request carries Twilio's signature of the URL it was sent to."""
        given = request.headers.get(SIGNATURE_HEADER, "")
        base = self.public_url or f"{'wss' if request.secure else 'ws'}://{request.host}"
        return self.account.signed(base + request.raw_path, given)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """A Twilio Media Stream: refused (403) unless signed, then served as a call."""
        if not self.signed(request):
            logger.info("refused a Twilio stream from %s: bad signature", request.remote)
            return _refusal(403, "The request is not signed by Twilio.", "invalid_signature")
        if self._turns_away():
            return _refusal(503, "This server is not taking calls now.", "unavailable")
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES)
        if not ws.can_prepare(request).ok:
            return _refusal(400, "Expected a WebSocket upgrade request.", "invalid_request")
        await ws.prepare(request)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                stream = await _read_start(ws)
        except (StreamError, TimeoutError) as exc:
            code = exc.code if isinstance(exc, StreamError) else WSCloseCode.POLICY_VIOLATION
            logger.info("a Twilio stream ended before it started: %s", exc or "no start")
            await ws.close(code=code, message=b"expected start")
            return ws
        if stream is None:
            return ws
        # Settings may come in the URL too (signed with it), for clients other than Twilio.
        stream = dataclasses.replace(stream, parameters=dict(request.query) | stream.parameters)
        call = TwilioCall(
            self._ids.new(CALL_ID_PREFIX),
            ws,
            stream,
            self._runner_for,
            self.host.pacer,
            self.account,
            echo_cancellation=self.echo_cancellation,
            on_closed=self._forget,
        )
        logger.info("call %s rings (Twilio call %s)", call.id, stream.call_sid)
        self._add(call)
        reason = "stream closed"
        try:
            reason = await call.serve()
        finally:
            await call.close(call.close_reason or reason)
        return ws

    def _announce(self, call: TwilioCall) -> Awaitable[bool] | None:
        """``realtime.call.incoming`` with Twilio's ids and the parameters as headers."""
        announce = self.ringing.announce
        return None if announce is None else announce(call.id, call.stream.headers(), None)

    def _session_of(self, call: TwilioCall) -> SessionConfig | None:
        """The session a ``prompt`` parameter names (the default without one)."""
        prompt = call.stream.parameters.get("prompt")
        default = self.ringing.default_session
        if prompt is None:
            return default
        return parse_session_config({"prompt": {"id": prompt}}, base=default)


async def _read_start(ws: web.WebSocketResponse) -> StreamStart | None:
    """The stream's ``start``, after ``connected``; None when the socket closed first."""
    async for message in ws:
        if message.type != WSMsgType.TEXT:
            raise StreamError("expected text messages", WSCloseCode.UNSUPPORTED_DATA)
        parsed = _json(message.data)
        if parsed.get("event") == "start":
            return StreamStart.parse(parsed)
        if parsed.get("event") != "connected":
            raise StreamError(f"expected start, got {str(parsed.get('event'))[:40]!r}")
    return None


def _refusal(status: int, message: str, code: str) -> web.Response:
    """An error in OpenAI's shape, before any upgrade."""
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return web.json_response({"error": error}, status=status)

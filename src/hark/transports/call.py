"""What every media call has in common, whatever carries its audio (WebRTC, SIP, …).

A ``MediaCall`` owns the call's session runner once it has one, the sideband WebSockets
attached with ``?call_id=``, the fan-out of the session's events to them (and to the call's
own event channel where it has one, as WebRTC's data channel), and ending and closing.
A transport's call adds its media and signalling through three hooks that ``close`` calls
in order: ``_close_begins`` (before the session closes), ``_release`` (after the call's
tasks are cancelled) and ``_released`` (always, even when releasing failed).

A ``CallHost``, built once by the server, makes every session's runner: WebSocket sessions
and calls of every transport alike.

A ``CallRegistry`` is a transport's calls on one worker: the server loops over its
registries to start them, find calls by id, count, drain and close them, and adds the routes
a registry brings (Twilio's stream endpoint). What the API may do with a call besides
hanging it up (accept, reject, refer) the call says (``actions``) and does itself, so the
call routes name no transport.

Ending always releases the same things in the same order: the session (its engine work),
the call's tasks, the transport's media, and last the sideband sockets.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

from aiohttp import WSCloseCode, web

from hark.driver.runner import AudioPlayer, SessionRunner
from hark.engines.registry import Engines
from hark.observability.metrics import Metrics
from hark.protocol.errors import ProtocolError
from hark.protocol.limits import SESSION_LIMIT_S
from hark.protocol.session_config import SessionConfig
from hark.session.ids import IdGenerator
from hark.transports.beta import Dialect
from hark.transports.sideband import Sidebands
from hark.transports.ticker import Pacer

logger = logging.getLogger(__name__)

CALL_ID_PREFIX = "rtc"
# How long a call ended by the server waits for its last events to leave.
END_FLUSH_TIMEOUT_S = 1.0
# Events held until the first sideband attaches, for a call with no event channel of its
# own (a phone); beyond that the oldest are dropped.
MAX_HELD_EVENTS = 1000
# Why a ringing call is declined, as SIP final statuses (the API's reject speaks SIP's too):
# nobody accepted it in time, or its webhook went nowhere; the worker cannot take it
# (draining, full, engines failed); its owner's session limit is reached.
NOT_ACCEPTED_STATUS = 480
UNAVAILABLE_STATUS = 503
BUSY_STATUS = 486

# A call that rings waits ``pending`` for the API's accept or reject; every call is
# ``accepted`` once it has a session, and ``ended`` once it closed.
CallState = Literal["pending", "accepted", "ended"]


@dataclass(frozen=True, slots=True)
class CallHost:
    """What every session of a worker runs on: its engines, its metrics and how long a
    session may last. ``runner`` is the one place a ``SessionRunner`` is made; ``pacer``
    (one timer) sends the reply audio of every call of the worker, whatever its transport."""

    engines: Engines
    metrics: Metrics | None = None
    session_limit_s: float = SESSION_LIMIT_S
    pacer: Pacer = field(default_factory=Pacer)

    def runner(
        self,
        *,
        transport: str,
        model: str,
        config: SessionConfig | None,
        player: AudioPlayer | None = None,
        on_usage: Callable[[int], None] | None = None,
    ) -> SessionRunner:
        """A session over ``transport`` (``websocket``, ``webrtc``, ``sip``: its metrics'
        label), starting from ``config``, its reply played by ``player`` (None: sent as
        audio deltas), its tokens counted by ``on_usage``."""
        return SessionRunner(
            self.engines,
            model=model,
            initial_config=config,
            transport=transport,
            player=player,
            metrics=self.metrics,
            on_usage=on_usage,
            max_duration_s=self.session_limit_s,
        )


# Raises the call webhook's ``realtime.call.incoming`` for a call that rings: its id, the
# headers the event lists, its media security (``rtp``, ``srtp``; None: not said); whether
# the webhook was delivered.
Announce = Callable[[str, list[tuple[str, str]], str | None], Awaitable[bool]]

DEFAULT_ACCEPT_TIMEOUT_S = 30.0
# Calls at once on this worker, ringing or answered; one more is turned away (SIP 503).
DEFAULT_MAX_CALLS = 100


@dataclass(frozen=True, slots=True)
class Ringing:
    """How a registry's calls ring and are answered (``RingingCalls``).

    ``announce`` raises the call webhook (None: calls are answered at once), whose accept
    must come within ``accept_timeout_s`` of the ring; sessions get ``model`` where their
    config names none, and ``default_session`` where a call is given none. At most
    ``max_calls`` calls ring or talk at once.
    """

    model: str
    announce: Announce | None = None
    default_session: SessionConfig | None = None
    accept_timeout_s: float = DEFAULT_ACCEPT_TIMEOUT_S
    max_calls: int = DEFAULT_MAX_CALLS


@dataclass(frozen=True, slots=True)
class CallHooks:
    """What a registry of calls that ring (SIP, Twilio) needs from the server around it.

    ``register``: the cluster learns a call (id, owner); ``admit``: count a new session of
    an owner against its limits (False: refused); ``usage``: what counts an owner's tokens;
    ``ready``: wait for the engines, whether they loaded; ``accepting``: False while the
    worker drains. (A call that ended is told to the registry's ``on_closed``.)
    """

    register: Callable[[str, str], Awaitable[None]]
    admit: Callable[[str], Awaitable[bool]]
    usage: Callable[[str], Callable[[int], None] | None]
    ready: Callable[[], Awaitable[bool]]
    accepting: Callable[[], bool]


class CallStateError(Exception):
    """The call is not in a state that allows the request (accept twice, refer unanswered,
    a sideband before the call is answered)."""


class CallOfferError(Exception):
    """What the caller offered cannot be answered (a SIP call's SDP: no common codec, SRTP
    without TLS); the call is declined."""


class CallReferError(Exception):
    """The transfer could not be asked for: the carrier's API (Twilio's) refused it or could
    not be reached; the message says why."""


class CallTypeError(Exception):
    """The call's transport does not allow the request at all (accepting a WebRTC call)."""


class MediaCall:
    """A call (``rtc_…``) owned by ``owner`` (``""``: nobody yet, a ringing phone call).

    ``runner`` is the session, once the call has one. ``admitted``: the call counts against
    its owner's session limits, released when it ends. ``on_closed`` is called once, at the
    end of ``close``. ``hold_for_sideband``: the call has no event channel of its own, so
    the events made before the first sideband attaches are held for it.
    """

    runner: SessionRunner | None
    # Whether the call has an event channel of its own (``_send_to_channel``), as WebRTC's
    # data channel, besides its sidebands.
    has_channel: ClassVar[bool] = False
    # The transport in the API's words, for refusals ("WebRTC", "SIP").
    kind: ClassVar[str] = "media"
    # What the API may do with the call besides hanging it up: ``accept`` and ``reject``
    # (a call that rings), ``refer`` (a transfer).
    actions: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        call_id: str,
        owner: str,
        *,
        on_closed: Callable[[Any], None] | None = None,
        hold_for_sideband: bool = False,
    ) -> None:
        self.id = call_id
        self.owner = owner
        self.runner = None
        self.state: CallState = "accepted"
        # Set once a call that rang no longer does (answered, declined or ended).
        self.settled = asyncio.Event()
        self.admitted = False
        # Which of its registry's calls this is, in the order they were opened (1, 2, …).
        self.opened_as = 0
        self.closed = asyncio.Event()
        self.close_reason: str | None = None
        self._on_closed = on_closed
        self._sidebands = Sidebands(call_id)
        self._held: deque[str] | None = deque(maxlen=MAX_HELD_EVENTS) if hold_for_sideband else None
        # The dialect of the call's own event channel, where it has one.
        self._channel_dialect = Dialect(beta=False)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fan_out_task: asyncio.Task[None] | None = None
        # Why the server is ending the call, once it is (``end``).
        self._end_reason: str | None = None
        self._closing = False

    # ------------------------------------------------------------------ life cycle

    def _start_events(self) -> None:
        """Hand the session's events out from now on (the runner has started)."""
        self._fan_out_task = self._spawn(self._fan_out(), "events")

    async def end(self, message: str, code: str, reason: str) -> None:
        """End the call from the server's side (drain, shutdown): the client is told why in
        an ``error`` event (on the call's channel and its sidebands), then the call closes."""
        if not self._closing and self.runner is not None:
            self._end_reason = reason
            await self.runner.end(message, code, reason)
            if self._fan_out_task is not None:
                # The fan-out ends once it has handed out the session's last events.
                await asyncio.wait([self._fan_out_task], timeout=END_FLUSH_TIMEOUT_S)
            await self._flush()
        await self.close(reason)

    async def close(self, reason: str) -> None:
        """End the call and release everything it holds. Idempotent."""
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        self.close_reason = reason
        logger.info("call %s ends: %s", self.id, reason)
        try:
            self._close_begins()
            if self.runner is not None:
                await self.runner.close()
            current = asyncio.current_task()
            tasks = [t for t in self._tasks if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # A cancelled task keeps its traceback, whose frames refer back to this call: held
            # here, that cycle would keep the call, its session and audio until a collection.
            self._fan_out_task = None
            await self._release()
        except Exception:
            logger.exception("call %s: error while closing", self.id)
        finally:
            self._released()
            self.state = "ended"
            self.settled.set()
            self._sidebands.end()
            self.closed.set()
            if self._on_closed is not None:
                self._on_closed(self)

    async def accept(self, config: SessionConfig | None, owner: str) -> None:
        """Answer the ringing call with a session of ``config`` (None: the transport's
        default) owned by ``owner``. Raises ``CallTypeError`` where ``accept`` is not one of
        ``actions``, ``CallStateError`` for a call no longer ringing."""
        raise CallTypeError(self.refusal("accepted"))

    def reject(self, status: int = 603) -> None:
        """Decline the ringing call with ``status`` (a SIP final status); raises as
        ``accept`` does."""
        raise CallTypeError(self.refusal("rejected"))

    async def refer(self, target_uri: str) -> int:
        """Transfer the answered call to ``target_uri``; the transfer's final SIP status.
        Raises as ``accept`` does, ``CallReferError`` and ``TimeoutError``."""
        raise CallTypeError(self.refusal("referred"))

    def refusal(self, done: str) -> str:
        """Why the call cannot be ``done`` ("accepted"), in the API's words."""
        return f"This is a {self.kind} call; it cannot be {done}."

    async def _flush(self) -> None:
        """Wait (boundedly) until the call's own channel has sent its last events."""

    def _close_begins(self) -> None:
        """The call starts to close; its session is still open."""

    async def _release(self) -> None:
        """Release the transport's media and signalling (the session is closed)."""

    def _released(self) -> None:
        """The last of closing, run even when releasing failed."""

    # ------------------------------------------------------------------ sidebands

    async def attach(self, ws: web.WebSocketResponse) -> None:
        """Serve a sideband WebSocket until it or the call ends; raises ``CallStateError``
        while the call has no session. The first sideband of a call that holds events gets
        those made before it attached."""
        runner = self.runner
        if runner is None:
            raise CallStateError("The call has not been accepted.")
        if self._closing:
            await ws.close(code=WSCloseCode.GOING_AWAY)
            return
        held: list[str] | None = None
        if self._held is not None:
            held = [] if self._sidebands else list(self._held)
            self._held.clear()
        await self._sidebands.serve(ws, runner, held)

    @property
    def sidebands(self) -> int:
        """How many sideband sockets are attached."""
        return len(self._sidebands)

    async def _fan_out(self) -> None:
        runner = self.runner
        assert runner is not None
        sidebands, held = self._sidebands, self._held
        dialect = self._channel_dialect
        send = self._send_to_channel if self.has_channel else None
        async for text in runner.outgoing():
            if send is not None:
                for out in dialect.outgoing(text):
                    send(out)
            if held is None or sidebands:
                sidebands.publish(text)
            else:
                held.append(text)
        # The session ended (its time limit, or the server ending it): the call ends with it.
        self._spawn(self.close(self._end_reason or "session ended"), "close")

    def _send_to_channel(self, text: str) -> None:
        """Send a server event on the call's own event channel (``has_channel``)."""

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=f"{self.id} {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class CallRegistry(Protocol):
    """A transport's live calls on one worker, as the server sees them: it starts and stops
    the registry, finds calls in it by id, counts them, and ends and closes them, without
    naming the transport.

    ``name`` says which transport (``webrtc``, ``sip``: the key under which ``/readyz``
    says why it could not start); ``listening`` what it listens on, for that message;
    ``media_address`` where its media arrives (``host:port``) once started, if it has one
    address for all calls; ``on_closed`` is told of every call that ended; ``routes`` are
    the HTTP routes it serves itself (none for most).
    """

    name: str
    on_closed: Callable[[MediaCall], None] | None

    @property
    def listening(self) -> str:
        """What it listens on, in words ("UDP 0.0.0.0 port 3478")."""
        ...

    @property
    def media_address(self) -> str | None:
        """The address all its calls' media arrives at, once started (None: none such)."""
        ...

    async def start(self) -> None:
        """Start taking calls; raises ``OSError`` when its port cannot be bound."""
        ...

    async def close_all(self, reason: str = "server shutdown") -> None:
        """End every call."""
        ...

    async def stop(self) -> None:
        """Stop taking calls and release what it listens on (after ``close_all``)."""
        ...

    def get(self, call_id: str) -> MediaCall | None:
        """The live call with this id, if any."""
        ...

    def routes(self) -> list[web.RouteDef]:
        """Routes of its own the server adds (a media WebSocket); usually none."""
        ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[MediaCall]: ...


_Call = TypeVar("_Call", bound=MediaCall)


@dataclass(eq=False)
class CallTable(Generic[_Call]):
    """A registry's live calls by id, as every transport keeps them: found by id, counted,
    ended together, and forgotten (``on_closed`` told) when one closes."""

    # Told of every call that ended (the cluster forgets it, the limits release it).
    on_closed: Callable[[MediaCall], None] | None = field(default=None, init=False)
    _calls: dict[str, _Call] = field(default_factory=dict, init=False, repr=False)
    _ids: IdGenerator = field(default_factory=IdGenerator, init=False, repr=False)

    def get(self, call_id: str) -> _Call | None:
        """The live call with this id, if any."""
        return self._calls.get(call_id)

    @property
    def media_address(self) -> str | None:
        """None: each call's media comes its own way (an RTP port, a WebSocket)."""
        return None

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[_Call]:
        return iter(list(self._calls.values()))

    async def close_all(self, reason: str = "server shutdown") -> None:
        """End every call (one still ringing is declined)."""
        await asyncio.gather(
            *(call.close(reason) for call in list(self._calls.values())), return_exceptions=True
        )

    def _forget(self, call: _Call) -> None:
        if self._calls.get(call.id) is call:
            del self._calls[call.id]
            if self.on_closed is not None:
                self.on_closed(call)


class RingingCalls(CallTable[_Call]):
    """What the registries of calls that ring (SIP, Twilio) share: their calls by id, and
    each call's way from ringing to answered or declined.

    A new call is handed to ``_add``: the cluster learns it; with the call webhook
    (``_announce`` gives its delivery) it waits for the API's accept or reject, and is
    declined if its webhook went nowhere or nobody answered within ``accept_timeout_s`` of
    the ring; without one it is answered at once with ``_session_of(call)``, once the
    engines are up and its session admitted. ``host`` makes the sessions; ``ringing`` says
    how calls ring.
    """

    # The transport, as the registry's ``name`` and its sessions' metrics label say it.
    name: str

    def __init__(
        self,
        host: CallHost,
        hooks: CallHooks,
        ringing: Ringing,
    ) -> None:
        super().__init__()
        self.host = host
        self.hooks = hooks
        self.ringing = ringing
        self._tasks: set[asyncio.Task[None]] = set()

    def _turns_away(self) -> bool:
        """Whether a new call is refused: the worker takes none now (it drains), or it has
        ``max_calls`` already."""
        return not self.hooks.accepting() or len(self._calls) >= self.ringing.max_calls

    async def _stop_calls(self) -> None:
        """End every call and what waits on one."""
        await self.close_all()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _add(self, call: _Call) -> None:
        """Keep the new ringing ``call`` and set it on its way."""
        self._calls[call.id] = call
        self._spawn(self._ring(call), f"{call.id} route")

    def _runner_for(
        self, player: AudioPlayer, config: SessionConfig | None, owner: str
    ) -> SessionRunner:
        """The session of an accepted call: ``config`` (the default session when None) for
        ``owner``, its reply played by ``player``."""
        config = config if config is not None else self.ringing.default_session
        return self.host.runner(
            transport=self.name,
            model=(config.model if config is not None else None) or self.ringing.model,
            config=config,
            player=player,
            on_usage=self.hooks.usage(owner),
        )

    def _announce(self, call: _Call) -> Awaitable[bool] | None:
        """Raise the call webhook for ``call``: whether it was delivered (None: no webhook)."""
        return None

    def _session_of(self, call: _Call) -> SessionConfig | None:
        """The session of a call answered at once (None: the transport's default); raises
        ``ProtocolError`` for a call that asks for one that cannot be."""
        return None

    async def _ring(self, call: _Call) -> None:
        await self.hooks.register(call.id, call.owner)
        announced = self._announce(call)
        if announced is None:
            await self._answer_at_once(call)
            return
        delivery = asyncio.ensure_future(announced)
        settled = asyncio.create_task(call.settled.wait())
        # The timeout runs from the ring, not from the delivery: retries of a webhook that
        # fails (backoff, and up to a minute for a receiver that hangs) must not keep the
        # phone ringing past it. The delivery goes on; a late accept finds the call gone.
        try:
            async with asyncio.timeout(self.ringing.accept_timeout_s):
                await asyncio.wait({delivery, settled}, return_when=asyncio.FIRST_COMPLETED)
                if delivery.done() and not delivery.result():
                    self._decline(call, "its webhook could not be delivered")
                    return
                await settled
        except TimeoutError:
            pass
        finally:
            settled.cancel()
        self._decline(call, f"not accepted within {self.ringing.accept_timeout_s:g} s")

    async def _answer_at_once(self, call: _Call) -> None:
        try:
            config = self._session_of(call)
        except ProtocolError as exc:
            self._decline(call, f"it asks for a session that cannot be: {exc}")
            return
        if not await self.hooks.ready():
            self._decline(call, "the engines failed to load", UNAVAILABLE_STATUS)
            return
        if not await self.hooks.admit(call.owner):
            self._decline(call, "the session limit is reached", BUSY_STATUS)
            return
        call.admitted = True
        try:
            await call.accept(config, call.owner)
            await self.hooks.register(call.id, call.owner)
        except Exception as exc:
            logger.warning("call %s could not be answered: %s", call.id, exc)

    def _decline(self, call: _Call, why: str, status: int = NOT_ACCEPTED_STATUS) -> None:
        """Reject ``call`` with ``status`` if it still rings."""
        if call.state != "pending" or call.closed.is_set():
            return
        logger.info("call %s rejected (%d): %s", call.id, status, why)
        call.reject(status)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

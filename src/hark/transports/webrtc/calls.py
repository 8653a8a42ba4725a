"""The calls of one worker: creating them from offers, finding them by id, ending them all.

All calls share one ``UdpMux`` (one UDP port) and the server's ``CallHost``, which makes
their sessions and whose ``Pacer`` sends their reply audio. ``Calls`` is a
``hark.transports.call.CallRegistry``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from aiohttp import web

from hark.protocol.session_config import SessionConfig
from hark.transports.beta import Dialect
from hark.transports.call import CALL_ID_PREFIX, CallHost, CallTable
from hark.transports.webrtc.call import SETUP_TIMEOUT_SECONDS, Call
from hark.transports.webrtc.playout import PlayoutTrack
from hark.transports.webrtc.udp_mux import UdpMux

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Calls(CallTable[Call]):
    """The registry of live calls; ``mux`` must be started (``start``) before ``create``.

    ``host`` makes the calls' sessions; ``setup_timeout_s``: a call not connected this long
    after its answer is ended; ``echo_cancellation``: whether calls take the reply's echo
    out of the caller's audio.
    """

    host: CallHost
    mux: UdpMux
    _: KW_ONLY
    setup_timeout_s: float = SETUP_TIMEOUT_SECONDS
    echo_cancellation: bool = True
    # Calls this registry ever opened: a heartbeat that reports this figure with the
    # session count tells placement which calls that count includes.
    opened: int = field(default=0, init=False)

    name = "webrtc"

    @property
    def listening(self) -> str:
        """The UDP port of every call's media, in words."""
        return f"UDP {self.mux.host} port {self.mux.port}"

    @property
    def media_address(self) -> str | None:
        """The advertised ``host:port`` of the mux, once it listens."""
        if not self.mux.started:
            return None
        host, port = self.mux.advertised
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def start(self) -> None:
        """Listen on the mux's UDP port; raises ``OSError`` when it is taken."""
        await self.mux.start()

    async def stop(self) -> None:
        """Close the mux (after ``close_all``)."""
        await self.mux.close()

    async def create(
        self,
        offer: str,
        *,
        owner: str,
        model: str,
        config: SessionConfig | None,
        on_usage: Callable[[int], None] | None = None,
        beta: bool = False,
    ) -> tuple[Call, str]:
        """Answer ``offer`` and start its session; returns the call and the SDP answer.

        Raises ``hark.transports.webrtc.sdp.OfferError`` for an offer that cannot be
        answered. ``beta``: the data channel speaks the beta dialect.
        """
        track = PlayoutTrack()
        runner = self.host.runner(
            transport="webrtc", model=model, config=config, player=track, on_usage=on_usage
        )
        call = Call(
            self._ids.new(CALL_ID_PREFIX),
            owner,
            runner,
            track,
            pacer=self.host.pacer,
            on_closed=self._forget,
            setup_timeout_s=self.setup_timeout_s,
            dialect=Dialect(beta=beta),
            echo_cancellation=self.echo_cancellation,
        )
        self._calls[call.id] = call
        self.opened += 1
        call.opened_as = self.opened
        try:
            answer = await call.negotiate(offer, self.mux)
            await call.start()
        except BaseException:
            # Also when the request is cancelled: a half-built call still holds a peer.
            await asyncio.shield(call.close("setup failed"))
            raise
        logger.info("call %s started for %s (session %s)", call.id, owner, runner.id)
        return call, answer

    def routes(self) -> list[web.RouteDef]:
        """None: offers come to ``POST /v1/realtime/calls``, the API's own route."""
        return []

"""The internal hop: a request that belongs to another worker is passed to it unchanged.

A hangup, a sideband WebSocket or any later per-call request that reaches a worker not
owning the call goes to the owner over HTTP (or a WebSocket piped both ways), and so does a
new call's offer that placement sends elsewhere. The client's own credentials travel with
the request and the owner checks them again: keys live in the shared store, so they are
valid on every worker, and no fleet secret is needed for the hop. A forwarded request
carries ``FORWARDED_HEADER`` and is never forwarded again, so a stale registry cannot make
requests go round in circles; a client that sets the header itself only gets the answer of
the worker it reached.

The hop is plain HTTP to the URL in the signed registry, unless the fleet has a hop CA
(``hark.cluster.hop_tls``): then it goes only over TLS, to ``https`` URLs, both ends
proving a certificate the CA signed, and a worker that advertises plain HTTP is not
forwarded to at all.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from yarl import URL

from hark.cluster.store import WorkerInfo
from hark.protocol.limits import MAX_MESSAGE_BYTES

logger = logging.getLogger(__name__)

FORWARDED_HEADER = "X-Hark-Forwarded"
# On every answer: the worker that made it (a forwarded answer keeps its maker's).
WORKER_HEADER = "X-Hark-Worker"
# On a forwarded answer: the worker the client reached, which passed the request on.
VIA_HEADER = "X-Hark-Via"
# On a forwarded offer's answer: how many calls the owner had opened once it opened this one,
# so the worker that placed it knows which of the owner's heartbeats count it (placement).
CALLS_OPENED_HEADER = "X-Hark-Calls-Opened"
# Headers a worker needs to answer the request as the first one would have.
_PASSED_HEADERS = ("Authorization", "Content-Type", "Accept", "OpenAI-Beta", "User-Agent")
# Headers of the owner's answer the client needs (the call id travels in Location).
_RETURNED_HEADERS = (
    "Content-Type",
    "Location",
    "WWW-Authenticate",
    WORKER_HEADER,
    CALLS_OPENED_HEADER,
)
CONNECT_TIMEOUT_S = 2.0
# An answer to an offer or a hangup comes in well under this; past it the owner is stuck.
RESPONSE_TIMEOUT_S = 30.0


class ForwardError(Exception):
    """The other worker could not be reached or did not answer."""


def is_forwarded(request: web.Request) -> bool:
    """Whether another worker sent this request here."""
    return FORWARDED_HEADER in request.headers


class Forwarder:
    """Passes requests to other workers over a pool of keep-alive connections.

    ``tls``: the hop's client context (``HopTls.client``); with it, requests go only to
    ``https`` URLs, over it.
    """

    def __init__(self, worker_id: str, tls: ssl.SSLContext | None = None) -> None:
        self.worker_id = worker_id
        self.tls = tls
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=RESPONSE_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S
                ),
                # The hop must not pick up proxies from the environment.
                trust_env=False,
                connector=aiohttp.TCPConnector(ssl=self.tls if self.tls is not None else True),
            )
        return self._session

    def _url(self, target: WorkerInfo, request: web.Request) -> URL:
        """Where ``request`` goes on ``target``; raises ``ForwardError`` for a plain URL when
        the hop must be TLS (the client's key would cross in clear)."""
        url = _target_url(target, request)
        if self.tls is not None and url.scheme != "https":
            raise ForwardError(
                f"worker {target.id} advertises a plain {url.scheme} URL; this fleet's hops "
                "go over TLS only (--hop-tls-ca)"
            )
        return url

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, request: web.Request) -> dict[str, str]:
        headers = {k: v for k in _PASSED_HEADERS if (v := request.headers.get(k)) is not None}
        headers[FORWARDED_HEADER] = self.worker_id
        return headers

    async def http(self, request: web.Request, target: WorkerInfo, body: bytes) -> web.Response:
        """``request`` (whose body was read as ``body``) answered by ``target``.

        Raises ``ForwardError`` when ``target`` cannot be reached or does not answer.
        """
        url = self._url(target, request)
        try:
            async with self._client().request(
                request.method, url, data=body, headers=self._headers(request)
            ) as answer:
                payload = await answer.read()
                headers = _returned(answer.headers)
                headers[VIA_HEADER] = self.worker_id
                return web.Response(status=answer.status, body=payload, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ForwardError(f"worker {target.id} did not answer: {exc!r}") from exc

    async def websocket(
        self, request: web.Request, target: WorkerInfo, client: web.WebSocketResponse
    ) -> web.StreamResponse:
        """Open the same WebSocket on ``target``, then pipe frames both ways until either side
        closes; ``client`` is the (unprepared) response for the client's side.

        Raises ``ForwardError`` (before anything was sent to the client) when ``target``
        cannot be reached or refuses the upgrade.
        """
        offered = [
            p.strip()
            for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if p.strip()
        ]
        url = self._url(target, request)
        try:
            upstream = await self._client().ws_connect(
                url,
                headers=self._headers(request),
                protocols=offered,
                max_msg_size=MAX_MESSAGE_BYTES,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                heartbeat=None,
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise ForwardError(f"worker {target.id} refused the WebSocket: {exc.status}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ForwardError(f"worker {target.id} did not answer: {exc!r}") from exc
        try:
            await client.prepare(request)
            await _pipe(client, upstream)
        finally:
            await upstream.close()
        return client


def _target_url(target: WorkerInfo, request: web.Request) -> URL:
    return URL(target.url).with_path(request.path).with_query(request.query)


def _returned(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k in _RETURNED_HEADERS if (v := headers.get(k)) is not None}


_WebSocket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


async def _copy(source: _WebSocket, sink: _WebSocket) -> None:
    """Text and binary frames from ``source`` to ``sink`` until anything else comes."""
    async for message in source:
        if message.type == WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        else:
            break


async def _pipe(client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse) -> None:
    """Frames both ways; awaiting each send is the backpressure, so nothing queues here."""

    async def down() -> None:
        await _copy(upstream, client)
        code = upstream.close_code or WSCloseCode.OK
        await client.close(code=code, message=b"")

    async def up() -> None:
        await _copy(client, upstream)
        await upstream.close()

    tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception) and not isinstance(
                result, (aiohttp.ClientError, ConnectionError)
            ):
                logger.warning("forwarded WebSocket ended with %r", result)
        if not client.closed:
            await client.close(code=WSCloseCode.GOING_AWAY, message=b"")

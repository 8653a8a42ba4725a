"""A customer's webhook endpoint for tests: a real aiohttp server on loopback that records
every delivery and answers with the statuses it is told to."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Received:
    """One delivery as it arrived."""

    body: bytes
    headers: dict[str, str]


@dataclass
class WebhookReceiver:
    """Answers the first deliveries with ``statuses`` in turn, then 200."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Queue[Received] = field(default_factory=lambda: asyncio.Queue(1000))

    async def handle(self, request: web.Request) -> web.Response:
        """Record the delivery and answer it."""
        delivery = Received(await request.read(), dict(request.headers))
        self.received.append(delivery)
        self.arrived.put_nowait(delivery)
        status = self.statuses.pop(0) if self.statuses else 200
        return web.Response(status=status, text="ok" if status < 300 else "try again")

    async def next(self, timeout_s: float = 30.0) -> Received:
        """The next delivery to arrive."""
        return await asyncio.wait_for(self.arrived.get(), timeout_s)


@contextlib.asynccontextmanager
async def webhook_receiver(statuses: list[int] | None = None) -> AsyncIterator[WebhookReceiver]:
    """A running receiver at ``receiver.url`` (``/webhook`` on an ephemeral port)."""
    receiver = WebhookReceiver(statuses=list(statuses or []))
    app = web.Application()
    app.router.add_post("/webhook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    receiver.url = f"http://{host}:{port}/webhook"
    try:
        yield receiver
    finally:
        await runner.cleanup()

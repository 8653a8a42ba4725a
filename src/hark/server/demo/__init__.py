"""The browser demo at ``/``: press Talk, speak, hear the answer, read both transcripts.

The page makes its call exactly as OpenAI's WebRTC guide shows, and never holds an API key:
it asks ``POST /demo/client_secret`` for an ephemeral key that lives ``DEMO_KEY_SECONDS``.
That endpoint hands a key to whoever can load the page, so the demo is on by default only
where that grants nothing new: a server on loopback without API keys (it accepts any key
anyway). Anywhere else it takes ``--demo``.
"""

from __future__ import annotations

import collections
import secrets
import time
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from hark.cluster.store import ClusterUnavailableError
from hark.config import Settings, is_loopback_host
from hark.protocol.client_secrets import encode_client_secret
from hark.protocol.session_config import parse_session_config
from hark.server.access import PUBLIC, requires
from hark.server.auth import Authenticator, Principal
from hark.server.errors import cluster_unavailable, error_response
from hark.session.ids import IdGenerator

PAGE_DIR = Path(__file__).parent
ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}
# Long enough to post the offer (and hang up a short call); the call itself outlives the key.
DEMO_KEY_SECONDS = 60
# A page mints one key per call; this caps the keys a flood of requests can pile up.
MAX_KEYS_PER_MINUTE = 60
# The page's session: transcripts of both sides and the server's stage timings per turn.
DEMO_SESSION = {
    "type": "realtime",
    "audio": {"input": {"transcription": {"model": "whisper-1"}}},
    "include": ["hark.turn_timings"],
}
# Only what the page itself loads: its script, its style, and the call to this origin.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "media-src 'self' blob: mediastream:; img-src 'self' data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
DISABLED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hark</title></head>
<body><h1>hark</h1>
<p>hark serves OpenAI's Realtime API at <code>/v1/realtime</code> (WebSocket) and
<code>/v1/realtime/calls</code> (WebRTC).</p>
<p>The browser demo is off on this server. It gives a short-lived key to anyone who can load
this page, so it is only on by default when hark listens on loopback without API keys.
To turn it on, start hark with <code>--demo</code> (or set <code>HARK_DEMO=true</code>).</p>
</body></html>
"""


def demo_enabled(settings: Settings) -> bool:
    """``settings.demo`` when given, else on only for a loopback server without API keys."""
    if settings.demo is not None:
        return settings.demo
    return is_loopback_host(settings.host) and not settings.api_keys


class DemoPage:
    """The demo's routes; ``enabled`` False leaves ``/`` saying how to turn it on.

    On a server without API keys, DNS rebinding (a foreign site's name pointed at loopback)
    is refused for every route alike, the demo's included (``hark.server.access``).
    """

    def __init__(self, authenticator: Authenticator, *, enabled: bool) -> None:
        self.authenticator = authenticator
        self.enabled = enabled
        self._ids = IdGenerator()
        self._minted: collections.deque[float] = collections.deque()

    @classmethod
    def for_settings(cls, authenticator: Authenticator, settings: Settings) -> DemoPage:
        """The demo as ``settings`` configure it (see ``demo_enabled``)."""
        return cls(authenticator, enabled=demo_enabled(settings))

    def routes(self) -> list[web.RouteDef]:
        """``GET /``, ``GET /demo/{name}`` and ``POST /demo/client_secret``."""
        return [
            web.get("/", self._index),
            web.get("/demo/{name}", self._asset),
            web.post("/demo/client_secret", self._client_secret),
        ]

    @requires(PUBLIC)
    async def _index(self, request: web.Request) -> web.Response:
        if not self.enabled:
            return web.Response(text=DISABLED_PAGE, content_type="text/html")
        return web.Response(
            body=(PAGE_DIR / "index.html").read_bytes(),
            content_type="text/html",
            charset="utf-8",
            headers={"Content-Security-Policy": PAGE_POLICY},
        )

    @requires(PUBLIC)
    async def _asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not self.enabled or name not in ASSETS:
            raise web.HTTPNotFound()
        return web.Response(
            body=(PAGE_DIR / name).read_bytes(), content_type=ASSETS[name], charset="utf-8"
        )

    @requires(PUBLIC)
    async def _client_secret(self, request: web.Request) -> web.Response:
        """An ephemeral key for the page, shaped like ``/v1/realtime/client_secrets``'s."""
        if not self.enabled:
            return error_response(
                403, "The demo is off on this server; start hark with --demo.", code="demo_off"
            )
        refusal = self._refusal(request)
        if refusal is not None:
            return error_response(403, refusal, code="forbidden_origin")
        now = time.monotonic()
        while self._minted and self._minted[0] <= now - 60:
            self._minted.popleft()
        if len(self._minted) >= MAX_KEYS_PER_MINUTE:
            return error_response(
                429,
                "Too many demo keys were asked for; try again in a minute.",
                type="rate_limit_error",
                code="rate_limit_exceeded",
            )
        self._minted.append(now)
        # One owner per key: a page can hang up its own call and no other page's.
        owner = Principal(owner="demo_" + secrets.token_hex(8))
        session = parse_session_config(DEMO_SESSION)
        session_id = self._ids.new("sess")
        try:
            value, record = await self.authenticator.mint(
                owner, session, session_id, DEMO_KEY_SECONDS
            )
        except ClusterUnavailableError:
            return cluster_unavailable()
        return web.Response(
            body=encode_client_secret(value, record.expires_at, session, session_id),
            content_type="application/json",
        )

    def _refusal(self, request: web.Request) -> str | None:
        """Why a key request may not come from where it comes from, or None."""
        origin = request.headers.get("Origin")
        # Browsers send Origin with every POST; another site's page must not get a key.
        if origin is not None and urlsplit(origin).netloc.lower() != request.host.lower():
            return "Demo keys are only for the demo page served by this server."
        return None

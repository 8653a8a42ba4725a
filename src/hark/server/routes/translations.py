"""``GET /v1/realtime/translations``: a Realtime translation session over a WebSocket."""

from __future__ import annotations

import logging
import secrets
import time

from aiohttp import web

from hark.protocol.limits import MAX_MESSAGE_BYTES
from hark.protocol.translation import TranslationConfig
from hark.server.access import WEBSOCKET_KEY, principal, requires
from hark.server.admission import admit_websocket_session, websocket_session
from hark.server.auth import offered_subprotocols
from hark.server.errors import error_response
from hark.server.state import ENGINES, SESSION_LIMIT
from hark.session.translation import TranslationSession
from hark.transports.translation import run_translation
from hark.transports.websocket import REALTIME_SUBPROTOCOL

logger = logging.getLogger(__name__)

# The model a translation session names when the client names none.
TRANSLATION_MODEL = "gpt-realtime-translate"


def routes() -> list[web.RouteDef]:
    """The translation WebSocket route."""
    return [web.get("/v1/realtime/translations", translation_websocket)]


@requires(WEBSOCKET_KEY)
async def translation_websocket(request: web.Request) -> web.StreamResponse:
    """Run a translation session on the upgraded WebSocket until either side ends it."""
    caller = principal(request)
    if caller.ephemeral is not None:
        # A client secret is minted for a Realtime session (or a transcription one).
        return error_response(
            403,
            "This client secret is not for a translation session.",
            code="invalid_api_key",
        )
    offered = REALTIME_SUBPROTOCOL in offered_subprotocols(request.headers)
    ws = web.WebSocketResponse(
        protocols=(REALTIME_SUBPROTOCOL,) if offered else (),
        max_msg_size=MAX_MESSAGE_BYTES,
        compress=False,
    )
    refusal = await admit_websocket_session(request, ws, caller.owner)
    if refusal is not None:
        return refusal
    async with websocket_session(request, ws, caller.owner, "translation session") as ready:
        if not ready:
            return ws
        config = TranslationConfig(
            id=f"sess_{secrets.token_hex(12)}",
            model=request.query.get("model") or TRANSLATION_MODEL,
            expires_at=int(time.time() + request.app[SESSION_LIMIT]),
        )
        await run_translation(
            ws,
            TranslationSession(config),
            request.app[ENGINES],
            max_duration_s=request.app[SESSION_LIMIT],
        )
    return ws

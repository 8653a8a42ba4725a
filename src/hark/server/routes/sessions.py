"""``GET /v1/realtime``: a Realtime session over a WebSocket (or, with ``call_id``, a
sideband to a WebRTC call)."""

from __future__ import annotations

import logging

from aiohttp import web

from hark.protocol.session_config import transcription_defaults
from hark.server.access import WEBSOCKET_KEY, principal, requires
from hark.server.admission import admit_websocket_session, usage_counter, websocket_session
from hark.server.auth import offered_subprotocols
from hark.server.errors import error_response
from hark.server.routes.calls import attach_sideband
from hark.server.state import CALL_HOST, LIMITS, REALTIME_MODEL, STATE
from hark.transports.beta import in_dialect
from hark.transports.websocket import REALTIME_SUBPROTOCOL, run_session, websocket_response

logger = logging.getLogger(__name__)


def routes() -> list[web.RouteDef]:
    """The WebSocket route."""
    return [web.get("/v1/realtime", realtime_websocket)]


@requires(WEBSOCKET_KEY)
async def realtime_websocket(request: web.Request) -> web.StreamResponse:
    """Run a session on the upgraded WebSocket until either side ends it."""
    caller = principal(request)
    query = request.query
    if "call_id" in query:
        return await attach_sideband(request, query["call_id"])
    initial = caller.ephemeral.session if caller.ephemeral is not None else None
    intent = query.get("intent")
    if intent not in (None, "realtime", "transcription"):
        return error_response(
            400,
            f"Invalid value for 'intent': '{intent[:100]}'. Supported values are 'realtime' "
            "and 'transcription'.",
            param="intent",
            code="invalid_value",
        )
    if intent is not None and initial is not None and initial.type != intent:
        return error_response(
            400,
            f"The client secret is for a {initial.type} session, but 'intent' asks for a "
            f"{intent} session.",
            param="intent",
            code="invalid_value",
        )
    if intent == "transcription" and initial is None:
        initial = transcription_defaults()
    ws = websocket_response(
        offered_realtime=REALTIME_SUBPROTOCOL in offered_subprotocols(request.headers)
    )
    refusal = await admit_websocket_session(request, ws, caller.owner)
    if refusal is not None:
        return refusal
    state = request.app[STATE]
    model = query.get("model") or (initial.model if initial is not None else REALTIME_MODEL)
    async with websocket_session(request, ws, caller.owner, f"session (model {model!r})") as ready:
        if not ready:
            return ws
        runner = request.app[CALL_HOST].runner(
            transport="websocket",
            model=model,
            config=initial,
            on_usage=usage_counter(request.app[LIMITS], caller.owner),
        )
        state.sessions.add(runner)
        try:
            # The dialect (GA, or beta for clients of the preview) is the upgrade's.
            await run_session(
                ws,
                in_dialect(runner, request.headers),
                throttled=runner.metrics.input_throttled,
            )
        finally:
            state.sessions.discard(runner)
            state.session_ended.set()
    return ws

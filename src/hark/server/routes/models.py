"""``GET /v1/models``: the Realtime model and the LLM behind it."""

from __future__ import annotations

from aiohttp import web

from hark.server.access import KEY, requires
from hark.server.state import REALTIME_MODEL, SETTINGS, STATE


def routes() -> list[web.RouteDef]:
    """The models route."""
    return [web.get("/v1/models", models)]


@requires(KEY)
async def models(request: web.Request) -> web.Response:
    """The model list, in OpenAI's shape."""
    created = request.app[STATE].started_at
    names = dict.fromkeys([REALTIME_MODEL, request.app[SETTINGS].llm_model_name])
    data = [{"id": n, "object": "model", "created": created, "owned_by": "hark"} for n in names]
    return web.json_response({"object": "list", "data": data})

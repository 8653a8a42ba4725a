"""``POST /v1/realtime/client_secrets``: mint an ephemeral key for a browser or a phone."""

from __future__ import annotations

import logging

from aiohttp import web

from hark.cluster.store import ClusterUnavailableError
from hark.protocol.client_secrets import encode_client_secret, parse_client_secret_request
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import SessionConfig
from hark.server.access import api_key_only, principal, requires
from hark.server.admission import admit_request
from hark.server.auth import EphemeralKey
from hark.server.errors import cluster_unavailable, invalid_request
from hark.server.state import AUTHENTICATOR, LIMITS
from hark.session.ids import IdGenerator

logger = logging.getLogger(__name__)

_ids = IdGenerator()


def routes() -> list[web.RouteDef]:
    """The client secrets route."""
    return [web.post("/v1/realtime/client_secrets", create_client_secret)]


@requires(api_key_only("Ephemeral keys cannot create client secrets; use an API key."))
async def create_client_secret(request: web.Request) -> web.Response:
    """Mint a key that opens sessions with the body's session config until it expires."""
    try:
        seconds, session = parse_client_secret_request(await request.read())
    except ProtocolError as exc:
        return invalid_request(exc)
    minted = await mint_key(request, session, seconds)
    if isinstance(minted, web.Response):
        return minted
    value, record, session_id = minted
    return web.Response(
        body=encode_client_secret(value, record.expires_at, session, session_id),
        content_type="application/json",
    )


async def mint_key(
    request: web.Request, session: SessionConfig, seconds: int
) -> tuple[str, EphemeralKey, str] | web.Response:
    """The key's value, its record and the new session id; or the answer that refuses it
    (the caller over its limits, or a cluster that cannot store the key)."""
    owner = principal(request)
    refusal = await admit_request(request.app[LIMITS], owner.owner)
    if refusal is not None:
        return refusal
    session_id = _ids.new("sess")
    try:
        value, record = await request.app[AUTHENTICATOR].mint(owner, session, session_id, seconds)
    except ClusterUnavailableError as exc:
        logger.warning("could not mint a key: %s", exc)
        return cluster_unavailable()
    return value, record, session_id

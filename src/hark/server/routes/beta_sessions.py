"""``POST /v1/realtime/sessions`` and ``POST /v1/realtime/transcription_sessions``: the beta
dialect's way to mint an ephemeral key (a flat session in, the flat session and its
``client_secret`` out). The keys are the ones ``POST /v1/realtime/client_secrets`` mints."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web
from msgspec import Struct

from hark.protocol.client_secrets import ExpiresAfter, check_expiry_seconds
from hark.protocol.errors import ProtocolError, decode_body, from_validation_error
from hark.protocol.session_config import session_config_to_dict
from hark.server.access import api_key_only, requires
from hark.server.errors import invalid_request
from hark.server.routes.client_secrets import mint_key
from hark.transports.beta import flat_session, parse_flat_session

# The beta's keys lived a minute unless the request said otherwise.
BETA_EXPIRY_SECONDS = 60


class _Expiry(ExpiresAfter):
    seconds: int = BETA_EXPIRY_SECONDS


class _ClientSecretRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    # ``expires_at`` is how the SDK's beta types spell it for transcription sessions.
    expires_after: _Expiry | None = None
    expires_at: _Expiry | None = None


_decode_body = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode


def routes() -> list[web.RouteDef]:
    """The beta key routes."""
    return [
        web.post("/v1/realtime/sessions", create_session),
        web.post("/v1/realtime/transcription_sessions", create_transcription_session),
    ]


@requires(api_key_only("Ephemeral keys cannot create sessions; use an API key."))
async def create_session(request: web.Request) -> web.Response:
    """Mint a key for a realtime session configured by the body's flat session."""
    return await _mint(request, transcription=False)


@requires(api_key_only("Ephemeral keys cannot create sessions; use an API key."))
async def create_transcription_session(request: web.Request) -> web.Response:
    """Mint a key for a transcription session configured by the body's flat session."""
    return await _mint(request, transcription=True)


async def _mint(request: web.Request, *, transcription: bool) -> web.Response:
    raw = await request.read()
    try:
        body = decode_body(_decode_body, raw) if raw.strip() else {}
        seconds = _expiry_seconds(body.pop("client_secret", None))
        session = parse_flat_session(body, transcription=transcription)
    except ProtocolError as exc:
        return invalid_request(_top_level(exc))
    minted = await mint_key(request, session, seconds)
    if isinstance(minted, web.Response):
        return minted
    value, record, session_id = minted
    ga = session_config_to_dict(session, session_id=session_id, expires_at=record.expires_at)
    answer = {
        **flat_session(ga),
        "client_secret": {"value": value, "expires_at": record.expires_at},
    }
    return web.Response(body=_encode(answer), content_type="application/json")


def _expiry_seconds(client_secret: object) -> int:
    """How long the key lives, from the body's ``client_secret``; ProtocolError if out of
    bounds."""
    if client_secret is None:
        return BETA_EXPIRY_SECONDS
    try:
        request = msgspec.convert(client_secret, _ClientSecretRequest)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc, "client_secret") from None
    expiry = request.expires_after or request.expires_at or _Expiry()
    check_expiry_seconds(expiry.seconds, "client_secret.expires_after.seconds")
    return expiry.seconds


def _top_level(error: ProtocolError) -> ProtocolError:
    """The session's fields are the body's own here: ``voice``, not ``session.voice``."""
    param = error.param
    if param is None or not param.startswith("session."):
        return error
    field = param.removeprefix("session.")
    return ProtocolError(error.message.replace(param, field), field, error.code, error.type)

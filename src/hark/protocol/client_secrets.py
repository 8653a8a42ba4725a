"""``POST /v1/realtime/client_secrets``: the request body and the minted secret (GA shape)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct, field

from hark.protocol.errors import ProtocolError, decode_body
from hark.protocol.session_config import (
    SessionConfig,
    parse_session_config,
    session_config_to_dict,
)

MIN_EXPIRY_SECONDS = 10
MAX_EXPIRY_SECONDS = 7200
DEFAULT_EXPIRY_SECONDS = 600


class ExpiresAfter(Struct, forbid_unknown_fields=True, kw_only=True):
    """When the key expires: ``seconds`` after it is created."""

    anchor: Literal["created_at"] = "created_at"
    # Bounds are checked after decoding, to answer with OpenAI's integer_*_value codes.
    seconds: int = DEFAULT_EXPIRY_SECONDS


class ClientSecretRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """The request body; ``session`` is validated as a session config over the defaults."""

    expires_after: ExpiresAfter | None = None
    session: dict[str, Any] = field(default_factory=dict)


class ClientSecret(Struct, kw_only=True):
    """The minted key, its expiry and the session it opens."""

    value: str
    expires_at: int
    session: dict[str, Any]


_decode_request = msgspec.json.Decoder(ClientSecretRequest).decode
_encode = msgspec.json.Encoder().encode


def parse_client_secret_request(raw: bytes) -> tuple[int, SessionConfig]:
    """``(seconds, session)`` of a request body (empty means all defaults).

    Raises ProtocolError naming the offending parameter.
    """
    if not raw.strip():
        return DEFAULT_EXPIRY_SECONDS, parse_session_config({})
    request = decode_body(_decode_request, raw)
    expires_after = request.expires_after or ExpiresAfter()
    seconds = expires_after.seconds
    check_expiry_seconds(seconds, "expires_after.seconds")
    return seconds, parse_session_config(request.session, param_prefix="session")


def check_expiry_seconds(seconds: int, param: str) -> None:
    """Raise ProtocolError naming ``param`` if a key's lifetime is out of bounds."""
    if not MIN_EXPIRY_SECONDS <= seconds <= MAX_EXPIRY_SECONDS:
        raise ProtocolError(
            f"Invalid '{param}': must be between {MIN_EXPIRY_SECONDS} and {MAX_EXPIRY_SECONDS}.",
            param=param,
            code="integer_below_min_value"
            if seconds < MIN_EXPIRY_SECONDS
            else "integer_above_max_value",
        )


def encode_client_secret(
    value: str, expires_at: int, session: SessionConfig, session_id: str
) -> bytes:
    """The JSON answer for a minted key (its session carries the id and expiry too)."""
    secret = ClientSecret(
        value=value,
        expires_at=expires_at,
        session=session_config_to_dict(session, session_id=session_id, expires_at=expires_at),
    )
    return _encode(secret)

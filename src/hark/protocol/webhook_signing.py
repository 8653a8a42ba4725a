"""Webhooks signed as OpenAI signs them (the Standard Webhooks way): the key a secret
stands for, and the signature each delivery attempt carries.

``webhook-signature: v1,<base64 HMAC-SHA256>`` over ``"{id}.{timestamp}.{body}"``, keyed
with the secret's bytes (base64-decoded after ``whsec_``, as the ``openai`` SDK's
``client.webhooks.unwrap`` expects). Below the settings, which refuse a secret that cannot
be used before the server starts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

SECRET_PREFIX = "whsec_"
# The shortest signing key taken: a shorter one could be guessed (OpenAI's are 32 bytes).
MIN_SECRET_BYTES = 24


class WebhookSecretError(ValueError):
    """The webhook secret cannot be used (a ``whsec_`` secret that is not base64)."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of ``secret``: the base64-decoded rest of a ``whsec_`` secret, or the
    secret's own bytes (as the SDK reads it), at least ``MIN_SECRET_BYTES`` long. Raises
    ``WebhookSecretError``."""
    if not secret.startswith(SECRET_PREFIX):
        key = secret.encode()
    else:
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except binascii.Error:
            raise WebhookSecretError(
                "a whsec_ webhook secret must be base64 after whsec_"
            ) from None
    if len(key) < MIN_SECRET_BYTES:
        raise WebhookSecretError(
            f"the webhook secret holds {len(key)} bytes; it needs at least {MIN_SECRET_BYTES} "
            "(whsec_ and 32 random bytes in base64, as OpenAI's)"
        )
    return key


def signature(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value (``v1,<base64>``) of one attempt."""
    signed = b"%s.%d.%s" % (webhook_id.encode(), timestamp, body)
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one delivery attempt."""
    return {
        "Content-Type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(key, webhook_id, timestamp, body),
    }

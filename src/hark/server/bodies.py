"""Reading request bodies within a size limit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from hark.protocol.errors import ProtocolError
from hark.server.errors import too_large

_READ_BYTES = 64 * 1024


async def read_limited(read: Callable[[int], Awaitable[bytes]], limit: int) -> bytes:
    """All that ``read`` (a body's ``read``, a multipart part's ``read_chunk``) gives until it
    gives nothing; raises ProtocolError (``request_too_large``) past ``limit`` bytes."""
    data = bytearray()
    while chunk := await read(_READ_BYTES):
        data += chunk
        if len(data) > limit:
            raise too_large(limit)
    return bytes(data)


def decode_text(raw: bytes, param: str) -> str:
    """``raw`` as UTF-8; raises ProtocolError naming ``param`` when it is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(
            f"'{param}' is not valid UTF-8 text.", param=param, code="invalid_value"
        ) from None

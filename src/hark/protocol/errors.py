"""Errors that become an ``error`` event in OpenAI's shape; the session always goes on."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

T = TypeVar("T")


# ``eq=False``: exceptions compare, and hash, by identity.
@dataclass(eq=False)
class ProtocolError(Exception):
    """A client mistake: reported as one ``error`` event, never fatal to the session."""

    message: str
    param: str | None = None
    code: str = "invalid_value"
    type: str = "invalid_request_error"

    def __post_init__(self) -> None:
        # The message alone is the exception's text, as for any exception.
        super().__init__(self.message)


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>[^`]+)`")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")


def from_validation_error(exc: msgspec.ValidationError, prefix: str | None) -> ProtocolError:
    """Turn msgspec's message ("Expected `int`, got `str` - at `$.a.b`") into a ProtocolError.

    ``param`` is the dotted path of the offending field, under ``prefix`` when given.
    """
    text = str(exc)
    path = ""
    match = _PATH.search(text)
    if match:
        path = match.group("path")
        text = text[: match.start()]
    code = "invalid_type" if text.startswith("Expected") and ", got `" in text else "invalid_value"
    unknown = _UNKNOWN.match(text)
    missing = _MISSING.match(text)
    if unknown:
        path = f"{path}.{unknown.group('field')}"
        code = "unknown_parameter"
        text = f"Unknown parameter: '{_join(prefix, path)}'."
    elif missing:
        path = f"{path}.{missing.group('field')}"
        code = "missing_required_parameter"
        text = f"Missing required parameter: '{_join(prefix, path)}'."
    else:
        text = f"Invalid value for '{_join(prefix, path)}': {text}."
    return ProtocolError(text, param=_join(prefix, path) or None, code=code)


def decode_body(decode: Callable[[bytes], T], raw: bytes) -> T:
    """``raw``, a JSON request body, decoded by the msgspec ``decode``; raises ProtocolError
    naming the offending parameter, or saying that the body is no JSON object."""
    try:
        return decode(raw)
    except msgspec.ValidationError as exc:
        error = from_validation_error(exc, None)
        if error.param is None:
            error = ProtocolError("The request body must be a JSON object.", code="invalid_type")
        raise error from None
    except msgspec.DecodeError:
        raise ProtocolError(
            "We could not parse the JSON body of your request.", code="invalid_json"
        ) from None


def _join(prefix: str | None, path: str) -> str:
    path = path.lstrip(".")
    if prefix and path:
        return f"{prefix}.{path}" if not path.startswith("[") else f"{prefix}{path}"
    return prefix or path

"""Speech synthesis by any OpenAI audio API: ``POST {url}/audio/speech``.

OpenAI itself, Kokoro-FastAPI, speaches, or another hark. The request asks for
``response_format: "pcm"``, which OpenAI's API defines as raw 24 kHz 16-bit little-endian
mono, and the audio is yielded as its bytes arrive, so that the first words play while the
rest is still being made. ``slack_s`` has no use here: the remote server schedules its own
model.

The API key travels only in the ``Authorization`` header; it is scrubbed from error messages
in case a server echoes it back, and URLs in messages lose their credentials and query.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
from yarl import URL

_LOG = logging.getLogger(__name__)

DEFAULT_MODEL = "tts-1"
# The voice when the client names none; the client's names go to the server unchanged.
DEFAULT_VOICE = "alloy"
# OpenAI's "pcm" format.
SAMPLE_RATE = 24000
# The speeds OpenAI's API takes; others are brought into this range rather than refused.
MIN_SPEED = 0.25
MAX_SPEED = 4.0
_ERROR_BODY_LIMIT = 4096


class TtsEndpointError(RuntimeError):
    """The endpoint failed one synthesis: unreachable, an HTTP error, or a broken answer."""


class OpenAITts:
    """Speaks text with a remote OpenAI audio API; a ``TtsEngine`` at 24 kHz.

    ``base_url`` includes the version prefix (``http://host:8000/v1``). ``timeout_s`` bounds
    connecting and each wait for the next bytes of audio. Call :meth:`aclose` when done.
    """

    sample_rate: int = SAMPLE_RATE

    def __init__(
        self,
        base_url: str,
        *,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        base = URL(base_url)
        # Kept: a query on the base URL (an API version, say) is part of every endpoint's URL.
        self._url = base.with_path(base.path.rstrip("/") + "/audio/speech").with_query(base.query)
        self.model = model
        self.timeout_s = timeout_s
        self._api_key = api_key
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"OpenAITts(base_url={_safe_url(self.base_url)!r}, model={self.model!r})"

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncGenerator[npt.NDArray[np.int16], None]:
        """Speak ``text``; yields int16 chunks at 24 kHz as the server sends them.

        ``voice`` goes to the server as it is (``alloy`` when ``None``). Cancelling closes
        the connection. Raises ``TtsEndpointError`` when the request fails.
        """
        if not text.strip():
            return
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        body = {
            "model": self.model,
            "input": text,
            "voice": voice or DEFAULT_VOICE,
            "response_format": "pcm",
            "speed": min(MAX_SPEED, max(MIN_SPEED, speed)),
        }
        try:
            response = await self._http().post(self._url, json=body, headers=self._headers())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TtsEndpointError(
                f"TTS endpoint {_safe_url(str(self._url))} is unreachable: {self._scrub(repr(exc))}"
            ) from None
        finished = False
        try:
            if response.status >= 400:
                raise await self._http_error(response)
            # A sample's two bytes may arrive in different reads.
            odd = b""
            try:
                async for data in response.content.iter_any():
                    data = odd + data
                    whole = len(data) // 2 * 2
                    odd = data[whole:]
                    if whole:
                        yield np.frombuffer(data[:whole], dtype="<i2").astype(np.int16)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TtsEndpointError(
                    f"the TTS audio broke off: {self._scrub(repr(exc))}"
                ) from None
            if odd:
                _LOG.warning("TTS endpoint sent an odd number of bytes; the last one is dropped")
            finished = True
        finally:
            # Speech given up midway (a barge-in) must not leave the server sending into a
            # connection kept for reuse: closing it tells the server to stop.
            if finished:
                response.release()
            else:
                response.close()

    async def warmup(self) -> None:
        """Speak a word: the endpoint answers, and takes the model and the key."""
        async for _ in self.synthesize("Hello."):
            pass

    async def aclose(self) -> None:
        """Close the HTTP session (its connections)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s
            )
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "audio/pcm, application/octet-stream, */*"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def _http_error(self, response: aiohttp.ClientResponse) -> TtsEndpointError:
        raw = await response.content.read(_ERROR_BODY_LIMIT)
        text = raw.decode("utf-8", errors="replace").strip()
        try:
            message = _error_message(json.loads(text)) or text
        except ValueError:
            message = text
        return TtsEndpointError(
            f"TTS endpoint {_safe_url(str(response.url))} answered HTTP {response.status}: "
            f"{self._scrub(message) or response.reason}"
        )

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "[api key]") if self._api_key else text


def _safe_url(url: str) -> str:
    return str(URL(url).with_user(None).with_query(None))


def _error_message(body: Any) -> str:
    """The human message of an error body in the usual OpenAI and FastAPI shapes."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error", body.get("detail"))
    if isinstance(error, dict):
        message = error.get("message")
        return message if isinstance(message, str) else json.dumps(error)[:500]
    if isinstance(error, str):
        return error
    return json.dumps(body)[:500]

"""The HTTP side of the engines that call an OpenAI-style API (ASR, TTS, chat LLM).

Each engine keeps one :class:`OpenAIHttp`: a lazily opened aiohttp session whose timeouts
bound connecting and each wait for the next bytes (a stream may run long, so no total), and
the request headers. The API key travels only in the ``Authorization`` header; it is
scrubbed from messages in case a server echoes it back, and URLs in messages lose their
credentials and query. An error answer is read only up to ``ERROR_BODY_LIMIT`` bytes (a
misbehaving server may send a lot) and reduced to the message of its OpenAI or FastAPI JSON.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from yarl import URL

ERROR_BODY_LIMIT = 4096


class OpenAIHttp:
    """The session, headers and error messages of one engine's OpenAI-style endpoint.

    ``service`` names the endpoint in messages (``ASR`` gives "ASR endpoint … answered HTTP
    401: …"); ``accept`` is the ``Accept`` header of every request.
    """

    def __init__(self, service: str, *, api_key: str | None, timeout_s: float, accept: str) -> None:
        self.service = service
        self.timeout_s = timeout_s
        self._api_key = api_key
        self._accept = accept
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The open session, made anew when there is none or it was closed."""
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s
            )
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    def headers(self) -> dict[str, str]:
        """``Accept`` and, with a key, ``Authorization``."""
        headers = {"Accept": self._accept}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def scrub(self, text: str) -> str:
        """``text`` with the API key replaced by ``[api key]``."""
        return text.replace(self._api_key, "[api key]") if self._api_key else text

    def unreachable(self, url: str | URL, exc: BaseException, after: str = "") -> str:
        """The message for a request to ``url`` that failed to connect with ``exc``;
        ``after`` follows "is unreachable" (`` after 3 attempts``)."""
        return (
            f"{self.service} endpoint {safe_url(url)} is unreachable{after}: "
            f"{self.scrub(repr(exc))}"
        )

    async def http_error(self, response: aiohttp.ClientResponse) -> str:
        """The message for an HTTP error ``response``: its status and the message of its
        bounded body (the reason phrase when the body says nothing)."""
        raw = b""
        while len(raw) < ERROR_BODY_LIMIT:
            part = await response.content.read(ERROR_BODY_LIMIT - len(raw))
            if not part:
                break
            raw += part
        text = raw.decode("utf-8", errors="replace").strip()
        try:
            message = error_message(json.loads(text)) or text
        except ValueError:
            message = text
        return (
            f"{self.service} endpoint {safe_url(response.url)} answered HTTP "
            f"{response.status}: {self.scrub(message) or response.reason}"
        )

    @asynccontextmanager
    async def post(
        self,
        url: URL,
        error: type[Exception],
        *,
        json: Any = None,
        data: aiohttp.FormData | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The successful response to a POST of ``json`` or ``data`` to ``url``; raises
        ``error`` with the message when the endpoint is unreachable or answers an HTTP
        error."""
        try:
            response = await self.session().post(url, json=json, data=data, headers=self.headers())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise error(self.unreachable(url, exc)) from None
        finished = False
        try:
            if response.status >= 400:
                raise error(await self.http_error(response))
            yield response
            finished = True
        finally:
            # An answer given up midway (a barge-in, a cancelled transcription) must not leave
            # the server sending into a connection kept for reuse: closing it tells the server
            # to stop.
            if finished:
                response.release()
            else:
                response.close()

    async def aclose(self) -> None:
        """Close the session (its connections)."""
        if self._session is not None:
            await self._session.close()
            self._session = None


class OpenAIEndpoint:
    """What every engine that calls an OpenAI-style API is made of: its ``base_url`` (with
    the version prefix, ``http://host:8000/v1``), its ``model``, one :class:`OpenAIHttp`
    (``service``, ``api_key``, ``timeout_s``, ``accept``) and a ``repr`` that shows neither
    credentials nor query. Call :meth:`aclose` when done."""

    def __init__(
        self,
        service: str,
        base_url: str,
        *,
        model: str,
        api_key: str | None,
        timeout_s: float,
        accept: str,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self._endpoint = OpenAIHttp(service, api_key=api_key, timeout_s=timeout_s, accept=accept)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.safe_base_url!r}, model={self.model!r})"

    @property
    def safe_base_url(self) -> str:
        """``base_url`` without credentials or query: fit for logs and metric labels."""
        return safe_url(self.base_url)

    async def aclose(self) -> None:
        """Close the HTTP session (its connections)."""
        await self._endpoint.aclose()


def endpoint_url(base_url: str, path: str) -> URL:
    """``base_url`` with ``path`` appended to its path; a query on ``base_url`` (an API
    version, say) is part of every endpoint's URL and is kept."""
    base = URL(base_url)
    return base.with_path(base.path.rstrip("/") + path).with_query(base.query)


def safe_url(url: str | URL) -> str:
    """``url`` without credentials or query: fit for messages, logs and metric labels."""
    return str(URL(url).with_user(None).with_query(None))


def error_message(body: Any) -> str:
    """The human message of an error body in the usual OpenAI and FastAPI shapes
    (``{"error": {"message": …}}``, ``{"detail": …}``); ``""`` when ``body`` is no object."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error", body.get("detail", body))
    if isinstance(error, dict):
        for key in ("message", "detail", "msg"):
            if isinstance(error.get(key), str):
                return str(error[key])
        return json.dumps(error)[:500]
    if isinstance(error, str):
        return error
    return json.dumps(body)[:500]


async def sse_objects(
    stream: aiohttp.StreamReader, error: type[Exception], what: str
) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a stream of server-sent events, up to OpenAI's ``[DONE]``.

    Data that is not JSON raises ``error`` ("malformed ``what``: …"); JSON that is not an
    object is passed over.
    """
    async for data in _sse_data(stream):
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise error(f"malformed {what}: {data[:200]!r}") from None
        if isinstance(event, dict):
            yield event


async def _sse_data(stream: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event (multi-line data joined with newlines)."""
    lines: list[str] = []
    async for raw in stream:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        # Comments (": keep-alive") and other fields have a name other than "data".
        field, _, value = line.partition(":")
        if field == "data":
            lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        yield "\n".join(lines)

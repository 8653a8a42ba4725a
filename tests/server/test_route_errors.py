"""Unknown routes and wrong methods answer in OpenAI's JSON error shape (issue 28, point 8).

OpenAI answers ``{"error": {"message": "Invalid URL (GET /v1/…)", "type":
"invalid_request_error", "param": null, "code": null}}`` (404) for a path it does not serve,
and ``Invalid method for URL (…)`` for one it serves with another method; the official SDK
reads that body into its error's ``type``, ``code`` and ``param``. aiohttp's own answers are
plain text, which the SDK can only quote.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from hark.config import Settings
from hark.engines.registry import Engines
from tests.helpers.net import bearer

from .conftest import API_KEY, StartServer

KEYED = Settings(api_keys=(API_KEY,))


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)


async def test_an_unknown_route_is_openais_json_404(
    start_server: StartServer, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with sdk(server.url) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.get("/realtime/nothing_here", cast_to=object)
        with pytest.raises(openai.NotFoundError) as posted:
            await client.post("/responses", cast_to=object, body={"model": "m"})
    assert caught.value.body == {
        "message": "Invalid URL (GET /v1/realtime/nothing_here)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert caught.value.type == "invalid_request_error"
    assert caught.value.response.headers["Content-Type"].startswith("application/json")
    body: Any = posted.value.body
    assert body["message"] == "Invalid URL (POST /v1/responses)"


async def test_a_wrong_method_is_openais_json_405_naming_the_allowed_ones(
    start_server: StartServer, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with sdk(server.url) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.get("/realtime/client_secrets", cast_to=object)
    assert caught.value.status_code == 405
    assert caught.value.body == {
        "message": "Invalid method for URL (GET /v1/realtime/client_secrets)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert "POST" in caught.value.response.headers["Allow"]


async def test_a_route_that_finds_nothing_answers_json_too(
    start_server: StartServer, fake_engines: Engines, http: aiohttp.ClientSession
) -> None:
    # The demo's asset route matches any name and says 404 for one it does not have.
    server = await start_server(Settings(demo=True), fake_engines)
    async with http.get(server.url + "/demo/nothing.js", headers=bearer(API_KEY)) as response:
        assert response.status == 404
        body = await response.json()
    assert body["error"]["message"] == "Invalid URL (GET /demo/nothing.js)"
    assert body["error"]["type"] == "invalid_request_error"

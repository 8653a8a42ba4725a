"""Ephemeral keys open a Realtime session or call, and do nothing else: not the audio API,
not call control, not another call's sideband (a real server, real aiortc calls)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from hark.bench.webrtc import CallClient
from tests.helpers.net import bearer
from tests.transports.conftest import API_KEY, RtcServer, serving_rtc

SCOPE = "Ephemeral keys can only open Realtime sessions and calls"


@pytest.fixture
async def server() -> AsyncIterator[RtcServer]:
    async with serving_rtc() as start:
        yield await start()


@pytest.fixture
async def calls() -> AsyncIterator[list[CallClient]]:
    made: list[CallClient] = []
    yield made
    await asyncio.gather(*(c.close() for c in made), return_exceptions=True)


async def mint(http: aiohttp.ClientSession, server: RtcServer) -> str:
    body = {"session": {"type": "realtime", "output_modalities": ["text"]}}
    async with http.post(
        server.url + "/v1/realtime/client_secrets", json=body, headers=bearer(API_KEY)
    ) as response:
        assert response.status == 200, await response.text()
        value: str = (await response.json())["value"]
        return value


async def refusal(response: aiohttp.ClientResponse) -> str:
    """The message of a 403 in OpenAI's shape."""
    assert response.status == 403, await response.text()
    error = (await response.json())["error"]
    assert error["code"] == "insufficient_permissions"
    message: str = error["message"]
    return message


async def test_an_ephemeral_key_cannot_use_the_audio_api(
    http: aiohttp.ClientSession, server: RtcServer
) -> None:
    key = await mint(http, server)
    speech = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}
    async with http.post(server.url + "/v1/audio/speech", json=speech, headers=bearer(key)) as r:
        assert SCOPE in await refusal(r)
    form = aiohttp.FormData()
    form.add_field("model", "whisper-1")
    form.add_field("file", b"RIFF", filename="a.wav", content_type="audio/wav")
    async with http.post(
        server.url + "/v1/audio/transcriptions", data=form, headers=bearer(key)
    ) as response:
        assert SCOPE in await refusal(response)
    # The API key that minted it may.
    async with http.post(
        server.url + "/v1/audio/speech", json=speech, headers=bearer(API_KEY)
    ) as response:
        assert response.status == 200
        await response.read()


async def test_an_ephemeral_key_opens_a_session(
    http: aiohttp.ClientSession, server: RtcServer
) -> None:
    key = await mint(http, server)
    async with http.ws_connect(server.ws_url, headers=bearer(key)) as ws:
        created = json.loads((await ws.receive(timeout=30)).data)
    assert created["type"] == "session.created"
    assert created["session"]["output_modalities"] == ["text"]


async def test_an_ephemeral_key_reaches_its_own_call_and_no_other(
    http: aiohttp.ClientSession, server: RtcServer, calls: list[CallClient]
) -> None:
    key, stranger = await mint(http, server), await mint(http, server)
    own, other = CallClient(), CallClient()
    calls += [own, other]
    await own.connect(http, server.url, api_key=key)
    await other.connect(http, server.url, api_key=API_KEY)
    own_url = f"{server.url}/v1/realtime/calls/{own.call_id}"
    other_url = f"{server.url}/v1/realtime/calls/{other.call_id}"

    # Call control is the API key's.
    for action, body in (
        ("accept", {"type": "realtime"}),
        ("reject", {}),
        ("refer", {"target_uri": "tel:+14155550123"}),
    ):
        async with http.post(f"{own_url}/{action}", json=body, headers=bearer(key)) as response:
            await refusal(response)
    # Another call of the same API key: neither its sideband nor its hang-up.
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(f"{server.ws_url}?call_id={other.call_id}", headers=bearer(key))
    assert refused.value.status == 403
    async with http.post(f"{other_url}/hangup", headers=bearer(key)) as response:
        assert "only reach the call it opened" in await refusal(response)
    # Nor may another ephemeral key of that API key reach this key's call.
    async with http.post(f"{own_url}/hangup", headers=bearer(stranger)) as response:
        await refusal(response)
    assert server.calls.get(other.call_id or "") is not None
    assert server.calls.get(own.call_id or "") is not None

    # Its own call: the sideband attaches, and the hang-up ends it.
    async with http.ws_connect(f"{server.ws_url}?call_id={own.call_id}", headers=bearer(key)):
        pass
    async with http.post(f"{own_url}/hangup", headers=bearer(key)) as response:
        assert response.status == 200
    assert server.calls.get(own.call_id or "") is None
    # The API key reaches every call of its own.
    async with http.post(f"{other_url}/hangup", headers=bearer(API_KEY)) as response:
        assert response.status == 200

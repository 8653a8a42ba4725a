"""OpenAI's browser WebRTC snippet, run by a real Chromium against hark, from another origin."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from playwright.async_api import Browser, Page

from tests.e2e.conftest import transcribe, words

from .conftest import API_KEY, HarkServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

SNIPPET = Path(__file__).with_name("openai_snippet.html")


@pytest.fixture
async def page_origin() -> AsyncIterator[str]:
    """A static server for the snippet page on another port: the call is cross-origin."""

    async def snippet(request: web.Request) -> web.FileResponse:
        return web.FileResponse(SNIPPET)

    app = web.Application()
    app.router.add_get("/", snippet)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}"
    await runner.cleanup()


async def mint_key(server: HarkServer) -> str:
    """An ephemeral key, minted server-side with the real key as OpenAI's guide does."""
    body = {
        "session": {
            "type": "realtime",
            "model": "gpt-realtime",
            "audio": {"input": {"transcription": {"model": "whisper-1"}}},
        }
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            server.url + "/v1/realtime/client_secrets",
            json=body,
            headers={"Authorization": f"Bearer {API_KEY}"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        value: str = (await response.json())["value"]
        return value


async def events_until(page: Page, done: Any, limit_s: float) -> list[dict[str, Any]]:
    """The page's data channel events, once ``done(events)`` holds."""
    async with asyncio.timeout(limit_s):
        while True:
            events: list[dict[str, Any]] = await page.evaluate("window.events")
            if done(events):
                return events
            state = await page.text_content("#state")
            assert state is not None and not state.startswith("failed"), state
            await asyncio.sleep(0.25)


async def inbound_audio(page: Page) -> dict[str, int]:
    """Chromium's counts for the received audio stream (its inbound-rtp stats)."""
    counts: dict[str, int] = await page.evaluate(
        """async () => {
            for (const s of (await window.pc.getStats()).values()) {
                if (s.type === "inbound-rtp" && s.kind === "audio") {
                    return {packets: s.packetsReceived, samples: s.totalSamplesReceived,
                            concealed: s.concealedSamples};
                }
            }
            return null;
        }"""
    )
    return counts


def completed_response(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first response that completed, if any."""
    return next(
        (
            e["response"]
            for e in events
            if e["type"] == "response.done" and e["response"]["status"] == "completed"
        ),
        None,
    )


def answered(events: list[dict[str, Any]]) -> bool:
    """A response completed and its audio finished playing."""
    response = completed_response(events)
    return response is not None and any(
        e["type"] == "output_audio_buffer.stopped" and e["response_id"] == response["id"]
        for e in events
    )


async def test_openai_snippet_asks_and_hears_the_answer(
    hark_server: HarkServer, page_origin: str, browser: Browser
) -> None:
    key = await mint_key(hark_server)
    page = await browser.new_page()
    failures: list[str] = []
    page.on("pageerror", lambda error: failures.append(str(error)))
    await page.goto(f"{page_origin}/?{urlencode({'base': hark_server.url, 'key': key})}")

    events = await events_until(page, answered, limit_s=180)
    assert not failures, failures
    kinds = [e["type"] for e in events]
    assert kinds[0] == "session.created"
    response = completed_response(events)
    assert response is not None
    mine = [e for e in events if e.get("response_id") == response["id"]]
    mine_kinds = [e["type"] for e in mine]
    for kind in (
        "response.output_audio_transcript.delta",
        "response.output_audio_transcript.done",
        "output_audio_buffer.started",
        "output_audio_buffer.stopped",
    ):
        assert kind in mine_kinds, (kind, mine_kinds)
    # The turn that caused the response, in protocol order.
    created = next(
        i
        for i, e in enumerate(events)
        if e["type"] == "response.created" and e["response"]["id"] == response["id"]
    )
    stopped = max(i for i in range(created) if kinds[i] == "input_audio_buffer.speech_stopped")
    assert "input_audio_buffer.speech_started" in kinds[:stopped], kinds
    assert "input_audio_buffer.committed" in kinds[stopped:created], kinds
    heard = [
        e["transcript"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert any("france" in words(text) for text in heard), heard

    # The answer arrived as speech on the remote track: Whisper hears the words the
    # transcript says.
    started = next(e for e in mine if e["type"] == "output_audio_buffer.started")
    rate: int = await page.evaluate("window.recorder.rate")
    recorded = await page.evaluate(
        "start => window.recording(start)", started["_recorded"] - rate // 2
    )
    pcm = np.frombuffer(base64.b64decode(recorded), "<i2")
    assert len(pcm) > rate // 2
    transcript = next(e for e in mine if e["type"] == "response.output_audio_transcript.done")
    recognised = await transcribe(pcm, rate)
    expected = set(words(transcript["transcript"]))
    assert len(set(words(recognised)) & expected) >= max(1, len(expected) // 2), (
        recognised,
        transcript["transcript"],
    )

    # After the answer, silence: the server's one cached silence packet keeps coming (packets
    # arrive, and Chromium plays them) and plays as silence. Watched until 75 more packets
    # have come and a second has played, however long a busy machine takes over them.
    await asyncio.sleep(1.0)
    before = await inbound_audio(page)
    mark: int = await page.evaluate("window.recorder.samples")
    async with asyncio.timeout(60):
        while True:
            after = await inbound_audio(page)
            played: int = await page.evaluate("window.recorder.samples") - mark
            if after["packets"] - before["packets"] >= 75 and played >= rate:
                break
            await asyncio.sleep(0.25)
    quiet = np.frombuffer(
        base64.b64decode(await page.evaluate("start => window.recording(start)", mark)), "<i2"
    )
    # Not all Chromium played was concealment: packets made some of it. (How much it
    # concealed besides is how punctually they came, which a busy machine changes.)
    concealed = after["concealed"] - before["concealed"]
    assert concealed < after["samples"] - before["samples"], (before, after)
    assert len(quiet) >= rate
    assert int(np.abs(quiet.astype(np.int32)).max()) <= 64

    # The page read the answer's Location across origins (CORS exposes it) and can hang up.
    location: str = await page.evaluate("window.callLocation")
    assert location.startswith("/v1/realtime/calls/rtc_")
    status = await page.evaluate(
        """async ([base, location, key]) => (await fetch(base + location + "/hangup", {
            method: "POST", headers: {Authorization: `Bearer ${key}`}})).status""",
        [hark_server.url, location, key],
    )
    assert status == 200
    await page.close()

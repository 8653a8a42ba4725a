"""The demo page at `/`, used the way a person does: press Talk, ask, read and hear the answer."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import Browser, expect

from tests.e2e.conftest import ARTIFACTS, words

from .conftest import HarkServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

SCREENSHOT = ARTIFACTS / "demo-page.png"
# Generous: a loaded 2-core machine, and a fake microphone that may need its second round.
TURN_TIMEOUT_MS = 120_000


async def test_talk_ask_and_read_the_answer(hark_server: HarkServer, browser: Browser) -> None:
    page = await browser.new_page(viewport={"width": 1100, "height": 900})
    failures: list[str] = []
    page.on("pageerror", lambda error: failures.append(str(error)))
    await page.goto(hark_server.url + "/")
    talk = page.get_by_role("button", name="Talk")
    await expect(talk).to_have_attribute("aria-pressed", "false")

    await talk.click()
    stop = page.get_by_role("button", name="Stop")
    await expect(stop).to_have_attribute("aria-pressed", "true", timeout=30_000)
    # The answer's transcript, then the turn's latency row once the server's timings arrive.
    await expect(page.locator("#assistant-live")).to_have_attribute(
        "data-empty", "false", timeout=TURN_TIMEOUT_MS
    )
    row = page.locator("#turns tr.turn", has=page.locator("td.latency[data-server-ms]")).first
    latency = row.locator("td.latency")
    await expect(latency).to_contain_text("ms", timeout=TURN_TIMEOUT_MS)
    await expect(latency).to_have_attribute("data-page-ms", re.compile(r"^\d+$"))
    user_text = await row.locator("td.user").inner_text()
    assistant_text = await row.locator("td.assistant").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(SCREENSHOT), full_page=True)

    assert {"capital", "france"} <= set(words(user_text)), user_text
    assert words(assistant_text), assistant_text
    assert await page.locator("#user-live").inner_text() != "…"
    assert not failures, failures

    await stop.click()
    await expect(talk).to_have_attribute("aria-pressed", "false")
    await expect(page.locator("#status")).to_contain_text("Call ended")
    await page.close()

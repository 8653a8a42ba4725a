"""A real `hark serve` with the demo on, Debian's Chromium driven by Playwright, and a spoken
question for Chromium's fake microphone."""

from __future__ import annotations

import wave
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from playwright.async_api import Browser, async_playwright

from tests.e2e.conftest import artifact, speech
from tests.servers import PATIENT, hark_serve

API_KEY = "sk-hark-browser-test-key"
CHROMIUM = Path("/usr/bin/chromium")
QUESTION = "What is the capital of France?"
# Chromium's fake microphone starts the file when the page opens the microphone and loops
# it. The lead-in covers setting the call up; the long tail keeps the next round of the
# question from talking over the answer (and brings it back if a slow set-up missed it).
LEAD_IN_S = 2.5
TAIL_S = 16.0
FAKE_MIC_RATE = 48000


@dataclass(frozen=True)
class HarkServer:
    """A running `hark serve` (with the demo on) and where to reach it."""

    url: str
    log: Path


@pytest.fixture(scope="session")
def hark_server() -> Iterator[HarkServer]:
    """`hark serve --demo` on the embedded models with one API key, ready before use."""
    log = artifact("browser-server.log")
    with hark_serve(["--demo", *PATIENT], log, env={"HARK_API_KEYS": API_KEY}) as port:
        yield HarkServer(f"http://127.0.0.1:{port}", log)


@pytest.fixture
async def question_wav(tmp_path: Path) -> Path:
    """The question (a committed fixture) as a 48 kHz mono 16-bit WAV, silence around it."""
    pcm = await speech(QUESTION, FAKE_MIC_RATE)
    lead = np.zeros(int(LEAD_IN_S * FAKE_MIC_RATE), np.int16)
    tail = np.zeros(int(TAIL_S * FAKE_MIC_RATE), np.int16)
    path = tmp_path / "question.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(FAKE_MIC_RATE)
        out.writeframes(np.concatenate((lead, pcm, tail)).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium; Playwright never downloads a browser here."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/test does)")
    return CHROMIUM


@pytest.fixture
async def browser(chromium: Path, question_wav: Path) -> AsyncIterator[Browser]:
    """Headless Chromium whose microphone plays ``question_wav``, allowed without asking."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(chromium),
            args=[
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={question_wav}",
                "--autoplay-policy=no-user-gesture-required",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield launched
        finally:
            await launched.close()

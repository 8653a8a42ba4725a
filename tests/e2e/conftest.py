"""A real `hark serve` on the embedded models, and spoken input from committed fixtures."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from openai import AsyncOpenAI

from tests.servers import PATIENT, hark_serve
from tests.speech import spoken

API_KEY = "sk-hark-e2e-test-key"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def artifact(name: str) -> Path:
    """``ARTIFACTS / name`` (the folder made); under pytest-xdist one per worker
    (``e2e-server.gw1.log``), so that servers started side by side never share a log."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return path.with_name(f"{path.stem}.{worker}{path.suffix}") if worker else path


@dataclass(frozen=True)
class Server:
    """A running hark server."""

    host: str
    port: int
    log: Path

    @property
    def http(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def ws(self) -> str:
        return f"ws://{self.host}:{self.port}/v1"

    def client(self, api_key: str = API_KEY) -> AsyncOpenAI:
        """The official SDK pointed at this server, as the README shows."""
        return AsyncOpenAI(api_key=api_key, base_url=self.http, websocket_base_url=self.ws)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """`hark serve` with the embedded models, ready (``/readyz`` 200) before tests use it."""
    log = artifact("e2e-server.log")
    with hark_serve(PATIENT, log, env={"HARK_API_KEYS": API_KEY}) as port:
        yield Server("127.0.0.1", port, log)


@contextlib.contextmanager
def fake_hark(log_name: str) -> Iterator[Server]:
    """`hark serve --engines fake` (a real server and Silero VAD, scripted ASR, LLM and TTS),
    ready, its output in ``artifact(log_name)``."""
    log = artifact(log_name)
    with hark_serve(["--engines", "fake"], log, env={"HARK_API_KEYS": API_KEY}) as port:
        yield Server("127.0.0.1", port, log)


async def speech(text: str, rate: int = 24000) -> npt.NDArray[np.int16]:
    """``text`` spoken (a committed fixture) at ``rate``, with 300 ms of silence around it."""
    pad = np.zeros(rate * 3 // 10, np.int16)
    return np.concatenate((pad, spoken(text, rate), pad))


_asr = None


async def transcribe(pcm: npt.NDArray[np.int16], rate: int) -> str:
    """What Whisper hears in ``pcm``."""
    global _asr
    from hark.audio.resample import resample
    from hark.engines.asr import AudioToTranscribe
    from hark.engines.asr.whisper import WhisperAsr

    if _asr is None:
        _asr = WhisperAsr()
    audio = resample(pcm, rate, 16000).astype(np.float32) / 32768.0
    return "".join([d async for d in _asr.transcribe(AudioToTranscribe(audio, language="en"))])


def words(text: str) -> list[str]:
    """Lower-case words without punctuation."""
    return "".join(c.lower() if c.isalnum() or c.isspace() else " " for c in text).split()


async def stream_realtime(send: object, pcm: npt.NDArray[np.int16], rate: int = 24000) -> None:
    """Append ``pcm`` in 20 ms chunks at the pace of real time."""
    import base64

    step = rate // 50
    start = time.monotonic()
    for n, i in enumerate(range(0, len(pcm), step)):
        audio = base64.b64encode(pcm[i : i + step].astype("<i2").tobytes()).decode()
        await send(audio=audio)  # type: ignore[operator]
        delay = start + (n + 1) * 0.02 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def events_until(conn: object, stop: str, limit_s: float = 120) -> AsyncIterator[object]:
    """Yield server events until one of type ``stop`` (included)."""
    async with asyncio.timeout(limit_s):
        while True:
            event = await conn.recv()  # type: ignore[attr-defined]
            yield event
            if event.type == stop:
                return

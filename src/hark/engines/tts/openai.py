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

import logging
from collections.abc import AsyncGenerator, Sequence

import aiohttp
import numpy as np
import numpy.typing as npt

from hark.engines.openai_http import OpenAIEndpoint, endpoint_url

_LOG = logging.getLogger(__name__)

DEFAULT_MODEL = "tts-1"
# The voice when the client names none; the client's names go to the server unchanged.
DEFAULT_VOICE = "alloy"
# OpenAI's "pcm" format.
SAMPLE_RATE = 24000
# The speeds OpenAI's API takes; others are brought into this range rather than refused.
MIN_SPEED = 0.25
MAX_SPEED = 4.0


class TtsEndpointError(RuntimeError):
    """The endpoint failed one synthesis: unreachable, an HTTP error, or a broken answer."""


class OpenAITts(OpenAIEndpoint):
    """Speaks text with a remote OpenAI audio API; a ``TtsEngine`` at 24 kHz.

    ``base_url`` includes the version prefix (``http://host:8000/v1``). ``timeout_s`` bounds
    connecting and each wait for the next bytes of audio. ``voices``: the voice names the
    server knows (the server passes OpenAI's), sent as they are. Call :meth:`aclose` when
    done.
    """

    sample_rate: int = SAMPLE_RATE

    def __init__(
        self,
        base_url: str,
        *,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        voices: Sequence[str] = (),
    ) -> None:
        super().__init__(
            "TTS",
            base_url,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            accept="audio/pcm, application/octet-stream, */*",
        )
        self._voices = tuple(voices)
        self._url = endpoint_url(base_url, "/audio/speech")

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
        async with self._endpoint.post(self._url, TtsEndpointError, json=body) as response:
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
                    f"the TTS audio broke off: {self._endpoint.scrub(repr(exc))}"
                ) from None
            if odd:
                _LOG.warning("TTS endpoint sent an odd number of bytes; the last one is dropped")

    def installed_voices(self) -> None:
        """None: voice names go to the server as they are, and it knows its own."""
        return None

    def voice_map(self) -> dict[str, str]:
        """The names of ``voices`` (OpenAI's) go to the server unchanged."""
        return {name: name for name in self._voices}

    async def warmup(self) -> None:
        """Speak a word: the endpoint answers, and takes the model and the key."""
        async for _ in self.synthesize("Hello."):
            pass

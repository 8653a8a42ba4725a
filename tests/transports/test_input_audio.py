"""Decoded frames to mono PCM at the session's input rate."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from hark.transports.webrtc.input_audio import forward_input_audio, frame_to_mono


def frame(samples: np.ndarray, layout: str, fmt: str = "s16", rate: int = 48000) -> AudioFrame:
    made = AudioFrame.from_ndarray(samples, format=fmt, layout=layout)
    made.sample_rate = rate
    return made


@pytest.mark.parametrize(
    ("samples", "layout", "fmt"),
    [
        (np.array([[100, 300, -100, -300]], np.int16), "stereo", "s16"),
        (np.array([[100, -100], [300, -300]], np.int16), "stereo", "s16p"),
        (np.array([[200, -200]], np.int16), "mono", "s16"),
        (np.array([[200 / 32768, -200 / 32768]], np.float32), "mono", "flt"),
    ],
)
def test_channels_are_averaged(samples: np.ndarray, layout: str, fmt: str) -> None:
    assert frame_to_mono(frame(samples, layout, fmt)).tolist() == [200, -200]


class Frames(MediaStreamTrack):
    """A track that plays the frames it was given, then ends."""

    kind = "audio"

    def __init__(self, frames: list[AudioFrame]) -> None:
        super().__init__()
        self.frames = frames

    async def recv(self) -> AudioFrame:
        if not self.frames:
            raise MediaStreamError
        await asyncio.sleep(0)
        return self.frames.pop(0)


async def test_audio_follows_the_input_rate_frame_by_frame() -> None:
    t = np.arange(960 * 100) / 48000
    tone = (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    stereo = np.repeat(tone, 2).reshape(1, -1)
    frames = [frame(stereo[:, i * 1920 : (i + 1) * 1920], "stereo") for i in range(100)]
    rates = iter([24000] * 50 + [8000] * 50)
    got: list[tuple[int, int]] = []
    current = 24000

    def rate() -> int:
        nonlocal current
        current = next(rates)
        return current

    await forward_input_audio(Frames(frames), rate, lambda pcm: got.append((current, len(pcm))))
    at_24k = sum(n for r, n in got if r == 24000)
    at_8k = sum(n for r, n in got if r == 8000)
    # soxr holds some audio back across each change of rate; nearly all of it comes through.
    assert 24000 * 0.9 <= at_24k <= 24000
    assert 8000 * 0.9 <= at_8k <= 8000

"""The caller's microphone: decoded Opus frames in, mono PCM at the session's input rate out.

aiortc decodes Opus to 48 kHz stereo ``s16`` frames; the session wants mono int16 at the
rate of its input format, which a ``session.update`` may change mid-call, so the rate is
read again for every frame and the resampler rebuilt when it moved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from hark.audio.resample import StreamResampler

logger = logging.getLogger(__name__)


def frame_to_mono(frame: AudioFrame) -> npt.NDArray[np.int16]:
    """The frame's samples as mono int16, channels averaged."""
    channels = len(frame.layout.channels)
    if frame.format.name == "s16":
        # The common case (aiortc's decoder), read straight from the plane: a tenth of the
        # cost of to_ndarray on every 20 ms frame of every call.
        packed = np.frombuffer(memoryview(frame.planes[0]), np.int16, frame.samples * channels)
        if channels == 1:
            return packed.copy()
        if channels == 2:
            return ((packed[0::2].astype(np.int32) + packed[1::2]) >> 1).astype(np.int16)
    samples = frame.to_ndarray()
    if frame.format.is_planar:
        planes = samples.reshape(channels, -1)
    else:
        planes = samples.reshape(-1, channels).T
    if planes.dtype.kind == "f":
        mono = planes.mean(axis=0) * 32768.0
        return np.clip(np.rint(mono), -32768, 32767).astype(np.int16)
    return (planes.astype(np.int32).sum(axis=0) // channels).astype(np.int16)


async def forward_input_audio(
    track: MediaStreamTrack,
    rate: Callable[[], int],
    sink: Callable[[npt.NDArray[np.int16]], None],
) -> None:
    """Feed ``track``'s audio to ``sink`` as mono PCM at ``rate()``, until the track ends."""
    resampler: StreamResampler | None = None
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if not isinstance(frame, AudioFrame):
            continue
        out_rate = rate()
        if (
            resampler is None
            or resampler.in_rate != frame.sample_rate
            or resampler.out_rate != out_rate
        ):
            resampler = StreamResampler(frame.sample_rate, out_rate)
        pcm = resampler.process(frame_to_mono(frame))
        if len(pcm):
            sink(pcm)

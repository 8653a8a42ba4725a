"""Server-side playout over WebRTC: reply audio leaves as a real-time Opus track.

``PlayoutTrack`` is the aiortc track a call's sender pulls from, over a
``hark.transports.playout.Playout`` at 48 kHz that does the rest: pacing, the order of
responses, what was heard, clear on barge-in. Every ``recv`` waits until the next 20 ms
frame is due and returns it as an Opus packet. The track is the session's ``AudioPlayer``
by handing ``play``/``finish``/``clear`` to its playout.

The track encodes Opus itself and hands the sender packets, so the sender must have
negotiated Opus (``Call`` makes sure). aiortc would otherwise encode on a thread pool and
compute an audio level in a Python loop for every frame, which costs more than the
encoding. Most of a call is silence: the encoder runs only while there is audio (and for
``_TAIL_FRAMES`` after, to flush its look-ahead), and silence is one packet encoded once.
"""

from __future__ import annotations

import asyncio
import fractions
import functools
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioCodecContext, AudioFrame, CodecContext, Packet

from hark.transports.playout import Playout, PlayoutListener

PLAYOUT_RATE = 48000
FRAME_MS = 20
FRAME_SAMPLES = PLAYOUT_RATE * FRAME_MS // 1000
_TIME_BASE = fractions.Fraction(1, PLAYOUT_RATE)
# Speech at 32 kbit/s mono: transparent for a voice, a third of aiortc's stereo default.
OPUS_BITRATE = 32000
# Frames of silence still encoded after audio: the encoder's 6.5 ms look-ahead needs one.
_TAIL_FRAMES = 2


def _opus_encoder() -> AudioCodecContext:
    encoder = CodecContext.create("libopus", "w")
    encoder.bit_rate = OPUS_BITRATE
    encoder.format = "s16"
    encoder.layout = "mono"
    encoder.sample_rate = PLAYOUT_RATE
    encoder.time_base = _TIME_BASE
    encoder.options = {"application": "voip"}
    return encoder


@functools.cache
def _encoded_silence() -> bytes:
    """One Opus packet of 20 ms of silence, as a warmed-up encoder makes it."""
    encoder = _opus_encoder()
    frame = _frame(np.zeros(FRAME_SAMPLES, np.int16))
    packets = [bytes(p) for _ in range(4) for p in encoder.encode(frame)]
    return packets[-1]


def _frame(samples: npt.NDArray[np.int16]) -> AudioFrame:
    frame = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = PLAYOUT_RATE
    frame.time_base = _TIME_BASE
    return frame


class PlayoutTrack(MediaStreamTrack):
    """An outgoing audio track that plays responses in real time; an ``AudioPlayer``.

    ``clock`` is the monotonic time in seconds that paces the frames; ``playout`` is the
    transport-neutral part, for what is not Opus.
    """

    kind = "audio"

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.playout = Playout(PLAYOUT_RATE, frame_ms=FRAME_MS, clock=clock)
        self._encoder: AudioCodecContext | None = None
        self._tail = 0

    def attach(self, listener: PlayoutListener) -> None:
        """Report playout progress to ``listener`` from now on."""
        self.playout.attach(listener)

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        """Queue audio of a response after whatever is queued already."""
        self.playout.play(response_id, item_id, pcm, rate)

    def finish(self, response_id: str) -> None:
        """No more audio will come for this response: it stops once what is queued is sent."""
        self.playout.finish(response_id)

    def clear(self, response_id: str) -> None:
        """Drop what is left of a response; see ``Playout.clear``."""
        self.playout.clear(response_id)

    async def recv(self) -> Packet:
        """The next 20 ms of audio as an Opus packet, released at its time."""
        if self.readyState != "live":
            raise MediaStreamError
        playout = self.playout
        delay = playout.due_in()
        if delay > 0:
            await asyncio.sleep(delay)
        pts = playout.frames_sent * FRAME_SAMPLES
        packet = Packet(self._encode(playout.next_frame(), pts))
        packet.pts = pts
        packet.time_base = _TIME_BASE
        return packet

    def _encode(self, samples: npt.NDArray[np.int16], pts: int) -> bytes:
        if samples is self.playout.silence:
            if not self._tail:
                return _encoded_silence()
            self._tail -= 1
        else:
            self._tail = _TAIL_FRAMES
        if self._encoder is None:
            self._encoder = _opus_encoder()
        frame = _frame(samples)
        frame.pts = pts
        # libopus gives one packet per 20 ms frame; never none, but silence covers that.
        return b"".join(bytes(p) for p in self._encoder.encode(frame)) or _encoded_silence()

    def stop(self) -> None:
        """End the track and drop everything queued."""
        self.playout.stop()
        super().stop()

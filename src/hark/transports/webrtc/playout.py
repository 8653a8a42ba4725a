"""Server-side playout: reply audio leaves as a real-time Opus track, cut at once on barge-in.

``PlayoutTrack`` is the session's ``AudioPlayer`` and the aiortc track its sender pulls
from. Every ``recv`` returns the next 20 ms frame at 48 kHz mono, paced by the clock: frame
*n* is released at ``start + n × 20 ms``, silence when nothing is queued. A frame released
is a frame sent, so the track knows exactly how many samples of each response went out;
``clear`` drops the rest before the next frame is cut, which puts the end of the audio
within one frame of the request, and reports what was sent.

The track encodes Opus itself and hands the sender packets, so the sender must have
negotiated Opus (``Call`` makes sure). aiortc would otherwise encode on a thread pool and
compute an audio level in a Python loop for every frame, which costs more than the
encoding. Most of a call is silence: the encoder runs only while there is audio (and for
``_TAIL_FRAMES`` after, to flush its look-ahead), and silence is one packet encoded once.

Responses play one after another, in the order their audio first arrived. A response whose
audio runs dry before it is finished (TTS slower than real time) waits with silence; it
ends, and the next one starts, only once ``finish`` says no more audio will come for it.
"""

from __future__ import annotations

import asyncio
import fractions
import functools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioCodecContext, AudioFrame, CodecContext, Packet

from hark.audio.resample import StreamResampler

PLAYOUT_RATE = 48000
FRAME_SAMPLES = PLAYOUT_RATE // 50
FRAME_SECONDS = FRAME_SAMPLES / PLAYOUT_RATE
# Further behind than this (a stalled loop), playout restarts its clock rather than
# bursting the backlog out faster than real time.
MAX_LAG_SECONDS = 0.1
# Responses that ended recently: audio arriving for them late is not played.
_ENDED_MEMORY = 32
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


class PlayoutListener(Protocol):
    """Who hears about playout progress (``hark.session.runner.SessionRunner``)."""

    def playout_started(self, response_id: str) -> None:
        """The first frame of a response's audio was sent."""
        ...

    def playout_stopped(self, response_id: str) -> None:
        """The last frame of a response's audio was sent."""
        ...

    def playout_cleared(self, response_id: str, played_ms: int) -> None:
        """A response's audio was cut after ``played_ms`` of it were sent."""
        ...


@dataclass(slots=True)
class _Response:
    """One response's audio: queued at the playout rate, and how much of it went out."""

    id: str
    resampler: StreamResampler
    chunks: deque[npt.NDArray[np.int16]] = field(default_factory=deque)
    offset: int = 0
    queued: int = 0
    sent: int = 0
    started: bool = False
    finished: bool = False

    def push(self, pcm: npt.NDArray[np.int16]) -> None:
        if len(pcm):
            self.chunks.append(pcm)
            self.queued += len(pcm)

    def take(self, out: npt.NDArray[np.int16], start: int) -> int:
        """Copy queued samples into ``out[start:]``; returns how many."""
        filled = start
        while filled < len(out) and self.chunks:
            chunk = self.chunks[0]
            n = min(len(out) - filled, len(chunk) - self.offset)
            out[filled : filled + n] = chunk[self.offset : self.offset + n]
            filled += n
            self.offset += n
            if self.offset == len(chunk):
                self.chunks.popleft()
                self.offset = 0
        taken = filled - start
        self.queued -= taken
        self.sent += taken
        return taken

    @property
    def sent_ms(self) -> int:
        return self.sent * 1000 // PLAYOUT_RATE


class PlayoutTrack(MediaStreamTrack):
    """An outgoing audio track that plays responses in real time; an ``AudioPlayer``.

    ``clock`` is the monotonic time in seconds that paces the frames. Playout progress goes
    to the listener given to ``attach`` (events before that are not reported).
    """

    kind = "audio"

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._listener: PlayoutListener | None = None
        self._queue: deque[_Response] = deque()
        self._ended: deque[str] = deque(maxlen=_ENDED_MEMORY)
        self._start: float | None = None
        self._frames = 0
        self._silence = np.zeros(FRAME_SAMPLES, np.int16)
        self._encoder: AudioCodecContext | None = None
        self._tail = 0
        self.frames_sent = 0
        self.late_restarts = 0

    def attach(self, listener: PlayoutListener) -> None:
        """Report playout progress to ``listener`` from now on."""
        self._listener = listener

    # ------------------------------------------------------------------ AudioPlayer

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        """Queue audio of a response after whatever is queued already."""
        response = self._find(response_id)
        if response is None:
            if response_id in self._ended:
                return
            response = _Response(response_id, StreamResampler(rate, PLAYOUT_RATE))
            self._queue.append(response)
        elif response.finished:
            return
        response.push(response.resampler.process(pcm))

    def finish(self, response_id: str) -> None:
        """No more audio will come for this response: it stops once what is queued is sent."""
        response = self._find(response_id)
        if response is None or response.finished:
            return
        response.finished = True
        tail = response.resampler.flush()
        response.push(tail.astype(np.int16, copy=False))

    def clear(self, response_id: str) -> None:
        """Drop what is left of a response; the next frame has none of it.

        The listener's ``playout_cleared`` follows on the next loop turn (the session core
        asked for the clear and is still busy), with the milliseconds that were sent.
        """
        response = self._find(response_id)
        if response is None:
            return
        self._queue.remove(response)
        self._ended.append(response_id)
        if self._listener is not None:
            asyncio.get_running_loop().call_soon(
                self._listener.playout_cleared, response_id, response.sent_ms
            )

    # ------------------------------------------------------------------ the track

    async def recv(self) -> Packet:
        """The next 20 ms of audio as an Opus packet, released at its time."""
        if self.readyState != "live":
            raise MediaStreamError
        now = self._clock()
        if self._start is None:
            self._start = now
        delay = self._start + self._frames * FRAME_SECONDS - now
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -MAX_LAG_SECONDS:
            self._start = now - self._frames * FRAME_SECONDS
            self.late_restarts += 1
        packet = Packet(self._encode(self.next_frame()))
        packet.pts = self._frames * FRAME_SAMPLES
        packet.time_base = _TIME_BASE
        self._frames += 1
        return packet

    def _encode(self, samples: npt.NDArray[np.int16]) -> bytes:
        if samples is self._silence:
            if not self._tail:
                return _encoded_silence()
            self._tail -= 1
        else:
            self._tail = _TAIL_FRAMES
        if self._encoder is None:
            self._encoder = _opus_encoder()
        frame = _frame(samples)
        frame.pts = self._frames * FRAME_SAMPLES
        # libopus gives one packet per 20 ms frame; never none, but silence covers that.
        return b"".join(bytes(p) for p in self._encoder.encode(frame)) or _encoded_silence()

    def next_frame(self) -> npt.NDArray[np.int16]:
        """Cut the next frame from the queue; no pacing.

        A frame without any audio is the track's silence array itself (not a copy).
        """
        self.frames_sent += 1
        if not self._queue:
            return self._silence
        out = np.zeros(FRAME_SAMPLES, np.int16)
        filled = 0
        started: list[str] = []
        stopped: list[str] = []
        while filled < FRAME_SAMPLES and self._queue:
            response = self._queue[0]
            taken = response.take(out, filled)
            if taken and not response.started:
                response.started = True
                started.append(response.id)
            filled += taken
            if response.queued:
                continue
            if not response.finished:
                # Its audio is late: wait for it with silence rather than skip ahead.
                break
            self._queue.popleft()
            self._ended.append(response.id)
            if response.started:
                stopped.append(response.id)
        if not filled:
            out = self._silence
        if self._listener is not None:
            for response_id in started:
                self._listener.playout_started(response_id)
            for response_id in stopped:
                self._listener.playout_stopped(response_id)
        return out

    def stop(self) -> None:
        """End the track and drop everything queued."""
        self._queue.clear()
        self._listener = None
        super().stop()

    def _find(self, response_id: str) -> _Response | None:
        for response in self._queue:
            if response.id == response_id:
                return response
        return None

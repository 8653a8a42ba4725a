"""Real-time playout of reply audio for transports that pace it themselves (WebRTC, SIP).

``Playout`` is the session's ``AudioPlayer`` without a codec or a socket: a transport
adapter asks it when the next frame is due (``due_in``) and for the frame (``next_frame``),
then encodes and sends it (Opus at 48 kHz for WebRTC, G.711 at 8 kHz for SIP). Frame *n*
is due at ``start + n × frame``, on the clock given, and a frame without audio is silence.
A frame cut is a frame sent, so the playout knows exactly how many samples of each response
went out; ``clear`` drops the rest before the next frame is cut, which puts the end of the
audio within one frame of the request, and reports what was sent.

Responses play one after another, in the order their audio first arrived. A response whose
audio runs dry before it is finished (TTS slower than real time) waits with silence; it
ends, and the next one starts, only once ``finish`` says no more audio will come for it.
Audio that arrives for a response that has ended (cleared, or played out) is not played.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from hark.audio.resample import StreamResampler

logger = logging.getLogger(__name__)

DEFAULT_FRAME_MS = 20
# Further behind than this (a stalled loop), playout restarts its clock rather than
# bursting the backlog out faster than real time.
MAX_LAG_SECONDS = 0.1
# The bound on audio queued ahead of playout, all responses together: TTS runs faster than
# real time, so a whole long reply may wait here, but not without end. Beyond it audio is
# dropped (and logged).
MAX_QUEUED_SECONDS = 600.0
# The bound on responses queued at once; one more is cleared at once, with nothing heard.
MAX_RESPONSES = 64
# Responses that ended recently: audio arriving for them late is not played.
_ENDED_MEMORY = 32


class PlayoutListener(Protocol):
    """Who hears about playout progress (``hark.driver.runner.SessionRunner``)."""

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
    # Held (``Playout.hold``): silence goes out in its place, and it keeps its place.
    held: bool = False

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


class Playout:
    """Reply audio cut into frames of ``frame_ms`` at ``rate`` Hz, paced by ``clock``.

    ``clock`` is the monotonic time in seconds that schedules the frames. Playout progress
    goes to the listener given to ``attach`` (events before that are not reported).
    """

    def __init__(
        self,
        rate: int,
        *,
        frame_ms: int = DEFAULT_FRAME_MS,
        clock: Callable[[], float] = time.monotonic,
        max_queued_s: float = MAX_QUEUED_SECONDS,
    ) -> None:
        if rate <= 0 or frame_ms <= 0 or rate * frame_ms % 1000:
            raise ValueError(f"{frame_ms} ms frames at {rate} Hz are not whole samples")
        self.rate = rate
        self.frame_samples = rate * frame_ms // 1000
        self.frame_seconds = frame_ms / 1000
        # Frames without audio are this array itself, so an adapter can tell them apart
        # (and send a cached packet) without looking at the samples.
        self.silence: npt.NDArray[np.int16] = np.zeros(self.frame_samples, np.int16)
        self._clock = clock
        self._max_queued = int(max_queued_s * rate)
        self._queued = 0
        self._listener: PlayoutListener | None = None
        self._queue: deque[_Response] = deque()
        self._ended: deque[str] = deque(maxlen=_ENDED_MEMORY)
        self._start: float | None = None
        self.frames_sent = 0
        # Frames whose time passed uncut (``pass_frame``): they count on the schedule.
        self.frames_passed = 0
        # Told of every frame cut, and whether it is ``silence`` (``hark.transports.echo``'s
        # reference); None: nobody is.
        self.tap: Callable[[npt.NDArray[np.int16], bool], None] | None = None
        self.late_restarts = 0
        # Frames of the schedule that restarts passed over: an adapter adds them to its media
        # clock (an RTP timestamp), so that a stall is a gap there too, not a lasting delay.
        self.frames_skipped = 0

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
            response = _Response(response_id, StreamResampler(rate, self.rate))
            self._queue.append(response)
            if len(self._queue) > MAX_RESPONSES:
                logger.warning("playout: %d responses queued; clearing the newest", MAX_RESPONSES)
                self.clear(response_id)
                return
        elif response.finished:
            return
        self._push(response, response.resampler.process(pcm))

    def finish(self, response_id: str) -> None:
        """No more audio will come for this response: it stops once what is queued is sent."""
        response = self._find(response_id)
        if response is None or response.finished:
            return
        response.finished = True
        self._push(response, response.resampler.flush().astype(np.int16, copy=False))

    def clear(self, response_id: str) -> None:
        """Drop what is left of a response; the next frame has none of it.

        The listener's ``playout_cleared`` follows on the next loop turn (the session core
        asked for the clear and is still busy), with the milliseconds that were sent.
        """
        response = self._find(response_id)
        if response is None:
            return
        self._queue.remove(response)
        self._queued -= response.queued
        self._ended.append(response_id)
        if self._listener is not None:
            asyncio.get_running_loop().call_soon(
                self._listener.playout_cleared, response_id, response.sent * 1000 // self.rate
            )

    def hold(self, response_id: str) -> None:
        """From the next frame on, send silence instead of this response, which keeps its
        place (``resume``); a ``clear`` meanwhile reports what was sent before the hold."""
        response = self._find(response_id)
        if response is not None:
            response.held = True

    def resume(self, response_id: str) -> None:
        """Go on with a held response from where it was held."""
        response = self._find(response_id)
        if response is not None:
            response.held = False

    def stop(self) -> None:
        """Drop everything queued and report nothing more."""
        self._queue.clear()
        self._queued = 0
        self._listener = None
        self.tap = None

    # ------------------------------------------------------------------ frames

    def due_in(self, now: float | None = None) -> float:
        """Seconds from ``now`` (None: the clock's time) until the next frame is due (zero or
        less: now).

        The first call starts the schedule with a frame due at once. Behind it by more than
        ``MAX_LAG_SECONDS``, the schedule restarts from now (``late_restarts`` counts it, and
        ``frames_skipped`` the whole frames it was behind).
        """
        if now is None:
            now = self._clock()
        frames = self.frames_sent + self.frames_passed
        if self._start is None:
            self._start = now - frames * self.frame_seconds
        delay = self._start + frames * self.frame_seconds - now
        if delay < -MAX_LAG_SECONDS:
            self._start = now - frames * self.frame_seconds
            self.late_restarts += 1
            self.frames_skipped += int(-delay / self.frame_seconds)
            return 0.0
        return delay

    def pass_frame(self) -> None:
        """Let the next frame's time pass without cutting it (nobody would hear it: a call on
        hold): the schedule moves on, and what is queued waits."""
        self.frames_passed += 1

    def next_frame(self) -> npt.NDArray[np.int16]:
        """Cut the next frame from the queue, whether or not it is due.

        A frame without any audio is ``silence`` itself (not a copy).
        """
        self.frames_sent += 1
        if not self._queue:
            if self.tap is not None:
                self.tap(self.silence, True)
            return self.silence
        out = np.zeros(self.frame_samples, np.int16)
        filled = 0
        started: list[str] = []
        stopped: list[str] = []
        while filled < self.frame_samples and self._queue:
            response = self._queue[0]
            if response.held:
                break
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
        self._queued -= filled
        if not filled:
            out = self.silence
        if self._listener is not None:
            for response_id in started:
                self._listener.playout_started(response_id)
            for response_id in stopped:
                self._listener.playout_stopped(response_id)
        if self.tap is not None:
            self.tap(out, out is self.silence)
        return out

    def _push(self, response: _Response, pcm: npt.NDArray[np.int16]) -> None:
        room = self._max_queued - self._queued
        if len(pcm) > room:
            logger.warning(
                "playout: over %d s of audio queued; dropping %d ms of %s",
                self._max_queued // self.rate,
                (len(pcm) - room) * 1000 // self.rate,
                response.id,
            )
            pcm = pcm[:room]
        response.push(pcm)
        self._queued += len(pcm)

    def _find(self, response_id: str) -> _Response | None:
        for response in self._queue:
            if response.id == response_id:
                return response
        return None


class PlayoutPlayer:
    """An ``AudioPlayer`` (``hark.driver.runner``) that plays through its ``playout``: what
    a call transport's player inherits, overriding what it does beyond the playout."""

    __slots__ = ()
    playout: Playout

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        """Queue audio of a response after whatever is queued already."""
        self.playout.play(response_id, item_id, pcm, rate)

    def finish(self, response_id: str) -> None:
        """No more audio will come for this response: it stops once what is queued is sent."""
        self.playout.finish(response_id)

    def clear(self, response_id: str) -> None:
        """Drop what is left of a response within a frame; see ``Playout.clear``."""
        self.playout.clear(response_id)

    def hold(self, response_id: str) -> None:
        """Send silence in a response's place for now; see ``Playout.hold``."""
        self.playout.hold(response_id)

    def resume(self, response_id: str) -> None:
        """Go on with a held response; see ``Playout.resume``."""
        self.playout.resume(response_id)

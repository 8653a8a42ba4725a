"""Server-side playout over WebRTC: reply audio leaves as a real-time Opus stream.

``PlayoutTrack`` is the session's ``AudioPlayer`` by handing ``play``/``finish``/``clear``
to a ``hark.transports.playout.Playout`` at 48 kHz, which does the pacing, the order of
responses, what was heard, clear on barge-in; the track cuts its frames into Opus payloads
(``next_payload``). On the server a call's ``hark.transports.webrtc.rtp_audio.AudioSender``
takes them on the worker's shared ``PlayoutTicker`` and sends them as RTP itself
(``drive``); anywhere else (a client of the bench) the track is an ordinary aiortc track
whose every ``recv`` waits until the next 20 ms frame is due and returns it as a packet.

Most of a call is silence: the encoder runs only while there is audio (and for
``_TAIL_FRAMES`` after, to flush its look-ahead), and silence is one packet encoded once.
"""

from __future__ import annotations

import asyncio
import fractions
import functools
import time
from collections.abc import Callable

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import Packet

from hark.audio.codecs.opus import OpusEncoder
from hark.transports.playout import Playout, PlayoutListener, PlayoutPlayer

PLAYOUT_RATE = 48000
FRAME_MS = 20
FRAME_SAMPLES = PLAYOUT_RATE * FRAME_MS // 1000
_TIME_BASE = fractions.Fraction(1, PLAYOUT_RATE)
# Speech at 32 kbit/s mono: transparent for a voice, a third of aiortc's stereo default.
OPUS_BITRATE = 32000
# Encoding is a fifth of a speaking call's CPU. On Piper's voice at 32 kbit/s (the 2-vCPU
# development VM, best of five passes) a 20 ms frame costs 62 µs at complexity 1, 86 at 3 and
# 147 at libopus's default 10, and the decoded waveform's SNR is 11.6, 12.1 and 12.6 dB: what
# 3 adds over 1 (SILK's delayed-decision quantiser) is as little as 10 adds over 3, and at a
# bitrate well above what wideband speech needs neither is a difference a caller hears.
OPUS_COMPLEXITY = 1
# Frames of silence still encoded after audio: the encoder's 6.5 ms look-ahead needs one.
_TAIL_FRAMES = 2


def _opus_encoder() -> OpusEncoder:
    return OpusEncoder(PLAYOUT_RATE, bitrate=OPUS_BITRATE, complexity=OPUS_COMPLEXITY)


@functools.cache
def encoded_silence() -> bytes:
    """One Opus packet of 20 ms of silence, as a warmed-up encoder makes it."""
    encoder = _opus_encoder()
    silence = np.zeros(FRAME_SAMPLES, np.int16)
    return [encoder.encode(silence) for _ in range(4)][-1]


class PlayoutTrack(PlayoutPlayer, MediaStreamTrack):
    """An outgoing audio track that plays responses in real time; an ``AudioPlayer``.

    ``clock`` is the monotonic time in seconds that paces the frames; ``playout`` is the
    transport-neutral part, for what is not Opus.
    """

    kind = "audio"

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.playout = Playout(PLAYOUT_RATE, frame_ms=FRAME_MS, clock=clock)
        self._encoder: OpusEncoder | None = None
        self._tail = 0
        # Set while something else sends the payloads (``drive``): ``recv`` gives none.
        self._stopped: asyncio.Event | None = None

    def attach(self, listener: PlayoutListener) -> None:
        """Report playout progress to ``listener`` from now on."""
        self.playout.attach(listener)

    def drive(self) -> None:
        """From now on the payloads are taken with ``next_payload`` by the caller, which
        paces them itself; ``recv`` waits until the track ends and gives nothing."""
        self._stopped = asyncio.Event()
        if self.readyState != "live":
            self._stopped.set()

    async def recv(self) -> Packet:
        """The next 20 ms of audio as an Opus packet, released at its time."""
        if self.readyState != "live":
            raise MediaStreamError
        if self._stopped is not None:
            await self._stopped.wait()
            raise MediaStreamError
        playout = self.playout
        delay = playout.due_in()
        if delay > 0:
            await asyncio.sleep(delay)
        pts = (playout.frames_sent + playout.frames_skipped) * FRAME_SAMPLES
        packet = Packet(self.next_payload())
        packet.pts = pts
        packet.time_base = _TIME_BASE
        return packet

    def next_payload(self) -> bytes:
        """Cut the next frame, due or not, and encode it: one Opus packet's payload."""
        samples = self.playout.next_frame()
        if samples is self.playout.silence:
            if not self._tail:
                return encoded_silence()
            self._tail -= 1
        else:
            self._tail = _TAIL_FRAMES
        if self._encoder is None:
            self._encoder = _opus_encoder()
        return self._encoder.encode(samples)

    def stop(self) -> None:
        """End the track and drop everything queued."""
        self.playout.stop()
        super().stop()
        if self._stopped is not None:
            self._stopped.set()

"""A call's echo cancellation: the reply as it leaves is the reference, the caller's audio
goes through the canceller before the session (and its VAD) hears it.

On a speakerphone, a laptop without headphones or a phone line with a hybrid, the caller's
microphone hears the reply again, 50-300 ms later and through the room; without this the VAD
takes it for the caller speaking and the reply interrupts itself. The server knows exactly
which samples of reply it sent when (``hark.transports.playout.Playout``): every frame the
playout cuts reaches ``played`` (through ``Playout.tap``), every chunk of the caller's audio
passes ``heard`` on its way to ``SessionRunner.receive_audio``, and ``hark.audio.echo``
pairs and cancels them. A WebRTC call taps its playout at 48 kHz and cancels at the
session's input rate (the reference is resampled); a SIP call does both at 8 kHz, before its
input is resampled. ``--echo-cancellation off`` builds none of this: the input path is then
what it was.

WebSocket sessions have none: the client plays the audio (OpenAI's SDKs and browsers run
their own echo cancellation on the microphone) and the server does not know when.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from hark.audio.echo import LEAD_S, EchoCanceller
from hark.audio.resample import StreamResampler

logger = logging.getLogger(__name__)


class CallEcho:
    """One call's canceller, for a playout at ``playout_rate`` Hz; the canceller is made at
    the rate of the first audio heard, and made again if that rate changes.

    Heard audio that waited for its reference is handed to ``release`` when the reference
    is played (what ``heard`` returns goes wherever its caller sends it: the same place).
    ``skipped`` counts the frames the playout's schedule passed over after a stall (WebRTC:
    the caller's stream keeps its own clock, so the reference gets as much silence); None
    where the input skips the same frames (SIP hands out one input frame per frame sent)."""

    def __init__(
        self,
        playout_rate: int,
        release: Callable[[npt.NDArray[np.int16]], None],
        skipped: Callable[[], int] | None = None,
    ) -> None:
        self.playout_rate = playout_rate
        self._release = release
        self._skipped = skipped
        self._skips = 0 if skipped is None else skipped()
        self.canceller: EchoCanceller | None = None
        # Set once the canceller raised: the call's audio passes untouched from then on.
        self.failed = False
        self._resampler: StreamResampler | None = None
        # A silent frame at the canceller's rate: only its length is read.
        self._quiet = np.zeros(0, np.int16)

    def played(self, frame: npt.NDArray[np.int16], silent: bool) -> None:
        """A frame of reply audio left (``silent``: the playout's silence frame)."""
        canceller = self.canceller
        if canceller is None:
            return
        try:
            self._played(canceller, frame, silent)
        except Exception:
            self._fail()

    def _played(self, canceller: EchoCanceller, frame: npt.NDArray[np.int16], silent: bool) -> None:
        if self._skipped is not None:
            skips = self._skipped()
            if skips != self._skips:
                gap = (skips - self._skips) * len(self._quiet)
                self._skips = skips
                self._hand_on(canceller.played(np.zeros(gap, np.int16), silent=True))
        resampler = self._resampler
        if silent:
            out = canceller.played(frame if resampler is None else self._quiet, silent=True)
        elif resampler is None:
            out = canceller.played(frame)
        else:
            out = canceller.played(resampler.process(frame))
        self._hand_on(out)

    def _hand_on(self, out: npt.NDArray[np.int16]) -> None:
        if len(out):
            self._release(out)

    def heard(self, pcm: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.int16]:
        """The caller's next audio at ``rate``, its echo taken out (whole 10 ms frames; see
        ``EchoCanceller.heard``); as it came if the canceller failed."""
        if self.failed:
            return pcm
        try:
            return self._heard(pcm, rate)
        except Exception:
            self._fail()
            return pcm

    def _fail(self) -> None:
        """The call goes on without echo cancellation (fail open: the caller is heard)."""
        logger.exception("echo cancellation failed; the call goes on without it")
        self.failed = True
        self.canceller = None

    def _heard(self, pcm: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.int16]:
        canceller = self.canceller
        if canceller is None or canceller.rate != rate:
            # SIP hands out a heard frame right after each frame played: no lead needed.
            lead_s = LEAD_S if self._skipped is not None else 0.0
            canceller = self.canceller = EchoCanceller(rate, lead_s)
            self._resampler = (
                None if rate == self.playout_rate else StreamResampler(self.playout_rate, rate)
            )
            self._quiet = np.zeros(rate // 50, np.int16)
            if self._skipped is not None:
                self._skips = self._skipped()
        return canceller.heard(pcm)

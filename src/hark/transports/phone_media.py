"""What the two phone transports' players share: SIP's RTP session and Twilio's media stream
both carry G.711 at 8 kHz, and hand the caller's audio to the session at whatever input rate
the session has now (a ``session.update`` may change it in the middle of a call)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from hark.audio.resample import StreamResampler
from hark.transports.playout import PlayoutPlayer

# G.711's sample rate: the caller's audio as it comes off the line.
RATE = 8000


class PhoneMedia(PlayoutPlayer):
    """A phone call's player (``PlayoutPlayer``) that also passes the caller's audio on.

    A subclass sets ``_on_audio`` and ``_input_rate`` when a session takes the call's audio
    (and ``_on_audio`` back to None when it stops), and sends each chunk of the caller's
    audio, echo-cancelled or not, through ``_pass_heard``.
    """

    def __init__(self) -> None:
        self._on_audio: Callable[[npt.NDArray[np.int16]], None] | None = None
        self._input_rate: Callable[[], int] | None = None
        self._resampler: StreamResampler | None = None

    def _pass_heard(self, pcm: npt.NDArray[np.int16]) -> None:
        """The caller's audio at 8 kHz to ``_on_audio``, at the session's input rate."""
        if self._on_audio is None or self._input_rate is None or not len(pcm):
            return
        rate = self._input_rate()
        if self._resampler is None or self._resampler.out_rate != rate:
            self._resampler = StreamResampler(RATE, rate)
        out = self._resampler.process(pcm)
        if len(out):
            self._on_audio(out)

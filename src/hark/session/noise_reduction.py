"""Input noise reduction (``audio.input.noise_reduction``): the client's audio denoised as it
enters the input buffer, before the VAD and recognition hear it, as OpenAI does.

RNNoise (``hark.audio.denoise``) does the work; the two types differ in how much of the input
they let through. ``far_field`` (laptop and room microphones, where noise and the room are
loud next to the voice) takes the denoised signal alone. ``near_field`` (a headset, where
the voice dominates and the risk is clipping its soft sounds) mixes a tenth of the input back
in, so noise goes down by at most 20 dB. ``strength`` (0 to 1, 1 when unset, as OpenAI's
default) scales the denoised share further.

The denoiser hands back as many samples as it is given, so the session's sample clock is the
input's; its audio is about 21 ms late (RNNoise's two frames and the resampling). Turning
noise reduction off lets go of the audio held inside it; turning it on starts a fresh stream,
whose first 21 ms are silence.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hark.audio.denoise import Denoiser
from hark.protocol.session_config import NoiseReduction as NoiseReductionConfig
from hark.session.context import SessionContext

# The share of the denoised signal at strength 1, per type.
WET = {"near_field": 0.9, "far_field": 1.0}


def wet_share(config: NoiseReductionConfig | None) -> float:
    """The denoised share of the output for ``config``; 0 when noise reduction is off."""
    if config is None or config.type is None:
        return 0.0
    strength = 1.0 if config.strength is None else config.strength
    return WET[config.type] * strength


class NoiseReduction:
    """The session's denoiser, made when noise reduction is turned on and dropped when it is
    turned off, as the session's ``audio.input.noise_reduction`` (in ``context``) says."""

    def __init__(self, context: SessionContext) -> None:
        self._context = context
        self._denoiser: Denoiser | None = None

    def denoiser(self, rate: int) -> Denoiser | None:
        """The stream that denoises input audio at ``rate`` under the current setting, or None
        when noise reduction is off. Its state carries from one chunk to the next, so chunks
        must reach it one at a time and in order, on whatever thread."""
        share = wet_share(self._context.config.audio.input.noise_reduction)
        if share <= 0.0:
            self.close()
            return None
        denoiser = self._denoiser
        if denoiser is None or denoiser.rate != rate:
            self.close()
            denoiser = self._denoiser = Denoiser(rate)
        denoiser.wet = share
        return denoiser

    def apply(self, pcm: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.int16]:
        """The input audio ``pcm`` (at ``rate``) as the buffer should hear it."""
        denoiser = self.denoiser(rate)
        return pcm if denoiser is None else denoiser.process(pcm)

    def close(self) -> None:
        """Free the denoiser, if there is one."""
        if self._denoiser is not None:
            self._denoiser.close()
            self._denoiser = None

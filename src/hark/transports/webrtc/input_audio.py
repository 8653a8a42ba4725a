"""The caller's microphone: Opus RTP payloads in, mono PCM at the session's input rate out.

``InputAudio`` decodes each packet straight to the rate of the session's input format
(libopus decodes at 8, 12, 16, 24 and 48 kHz itself; only another rate is resampled),
which a ``session.update`` may change mid-call, so the rate is read again for every packet
and the decoder rebuilt when it moved. There is no jitter buffer: packets are decoded as
they come, a packet older than the newest one decoded is dropped, and a gap in the RTP
timestamps (packets lost, or not sent during the caller's silence with DTX) is filled with
the decoder's concealment, which fades to silence. The session's sample clock therefore
keeps pace with the caller's, which is what its VAD and turn-taking run on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from hark.audio.codecs.opus import MAX_FRAME_MS, RATES, RTP_RATE, OpusDecoder, OpusError
from hark.audio.resample import StreamResampler
from hark.observability.session_metrics import SessionMetrics

logger = logging.getLogger(__name__)

# The longest gap filled with concealment; longer, the stream starts over (a caller who
# was on hold) rather than inventing seconds of audio.
MAX_GAP_SAMPLES = RTP_RATE
_CHUNK = RTP_RATE * MAX_FRAME_MS // 1000
# Opus decodes in whole 2.5 ms steps.
_STEP = RTP_RATE // 400


class InputAudio:
    """One caller's Opus stream to ``sink``, as mono PCM at ``rate()`` Hz.

    ``packet`` takes the RTP fields that matter, in the order packets arrive. ``metrics``
    (the session's) counts packets that came after a newer one as late, and packets of
    another stream or that did not decode as dropped.
    """

    def __init__(
        self,
        rate: Callable[[], int],
        sink: Callable[[npt.NDArray[np.int16]], None],
        metrics: SessionMetrics | None = None,
    ) -> None:
        self._rate = rate
        self._sink = sink
        self._metrics = metrics if metrics is not None else SessionMetrics.disabled()
        self._decoder: OpusDecoder | None = None
        self._resampler: StreamResampler | None = None
        self._ssrc: int | None = None
        # The sequence number of the newest packet decoded, once one is.
        self._sequence: int | None = None
        # The RTP timestamp the next packet has when none is missing.
        self._next_timestamp = 0
        self.dropped = 0
        # Filled with concealment, at the RTP clock (48 kHz).
        self.concealed_samples = 0

    def packet(self, ssrc: int, sequence: int, timestamp: int, payload: bytes) -> None:
        """Decode one packet of the stream (and conceal what went missing before it)."""
        if self._ssrc is None:
            self._ssrc = ssrc
        elif ssrc != self._ssrc:
            # The first stream is the caller's microphone; another SSRC is not mixed in.
            self.dropped += 1
            self._metrics.audio_dropped()
            return
        last = self._sequence
        if last is not None and (sequence == last or (sequence - last) & 0xFFFF >= 0x8000):
            self.dropped += 1
            self._metrics.audio_late()
            return
        decoder = self._decoder_for(self._rate())
        fresh = self._decoder is not decoder or last is None
        self._decoder = decoder
        gap = (timestamp - self._next_timestamp) & 0xFFFFFFFF
        if not fresh and 0 < gap <= MAX_GAP_SAMPLES:
            self._conceal(decoder, gap)
        try:
            pcm = decoder.decode(payload)
        except OpusError as exc:
            logger.debug("a caller's Opus packet did not decode: %s", exc)
            self.dropped += 1
            self._metrics.audio_dropped()
            return
        self._sequence = sequence
        self._next_timestamp = (timestamp + len(pcm) * RTP_RATE // decoder.rate) & 0xFFFFFFFF
        self._emit(pcm)

    def _decoder_for(self, rate: int) -> OpusDecoder:
        decode_rate = rate if rate in RATES else RTP_RATE
        if self._decoder is not None and self._decoder.rate == decode_rate:
            if decode_rate == rate:
                self._resampler = None
            elif self._resampler is None or self._resampler.out_rate != rate:
                self._resampler = StreamResampler(decode_rate, rate)
            return self._decoder
        self._resampler = None if decode_rate == rate else StreamResampler(decode_rate, rate)
        return OpusDecoder(decode_rate)

    def _conceal(self, decoder: OpusDecoder, gap: int) -> None:
        gap -= gap % _STEP
        self.concealed_samples += gap
        while gap:
            chunk = min(gap, _CHUNK)
            self._emit(decoder.conceal(chunk * decoder.rate // RTP_RATE))
            gap -= chunk

    def _emit(self, pcm: npt.NDArray[np.int16]) -> None:
        if self._resampler is not None:
            pcm = self._resampler.process(pcm)
        if len(pcm):
            self._sink(pcm)

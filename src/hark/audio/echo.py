"""Acoustic echo cancellation for one call: WebRTC's AEC3, the reference being what was played.

The canceller is AEC3 (WebRTC's audio processing module, as Chrome runs it) through the
``pywebrtc-audio`` wheel; this module is the only one that knows that wheel. AEC3 takes the
signal that was played (far end, the reference) and the signal that was heard (near end, the
microphone), 10 ms of each at a time, finds the delay between them itself (its matched
filters search a few hundred milliseconds), models the echo path with an adaptive linear
filter and takes what the filter leaves out with a suppressor. Its high-pass filter runs on
the heard signal too. What it cannot do is find an echo that comes *before* its reference:
the reference has to reach it no later than the echo.

``EchoCanceller`` pairs the two streams by their sample clocks: the first sample heard is
processed with the sample played a lead (``lead_s``) before the last one, and each one after
with the next, so the delay AEC3 sees is the path's less that lead, and stays what it is
however unevenly either stream arrives (a loaded server's ticks, a caller's packets in
bursts): the played samples wait in a buffer for their heard counterparts, and the lead lets
a frame heard just before the tick that plays its counterpart find it there. Heard audio
that outruns the reference all the same (the caller's packets queued while a loaded loop
stalled, handed over before the ticks catch up) waits for it, ``MAX_WAIT_S`` at most, and
``played`` hands it out once its reference came; past that it is paired with silence, and
the reference owes as many samples (the next ones played are dropped), so the pairing keeps
to the clock.
The two clocks drift apart all the same (a caller's sound card against our clock, a
loaded loop's frames), so the pairing moves, a little at a time: when even the least the
reference waited over ``TRIM_WINDOW_S`` was more than ``SLACK_S`` (it would reach AEC3 after
its echo before long) its oldest samples are dropped down to the lead, and when the heard
audio waited for its reference all window long (it would soon wait for good), silence goes
before the reference to give the lead back. A heard stream that starts over (a caller back
from a gap longer than ``MAX_LEAD_S``, or owing more than ``MAX_OWED_S``) is paired afresh.

AEC3 assumes an echo until its filter shows otherwise, and with none to find (a headset, a
handset, a browser or phone that cancels its own echo) its suppressor takes the caller's voice
over the reply for echo: a voice said into such a call half a second to four seconds into a
reply came out 10-30 dB quieter, some 200 ms stretches of it 40-60 dB. So each call also
watches whether its microphone hears the reply at all (``EchoPresence``): while the reply
plays and the caller is silent, an echo would be what the microphone hears, and once it
has heard nothing within ``QUIET_DB`` of the reply for ``QUIET_S`` of it, the caller's audio
passes as it came, and AEC3 rests: it is let go, and only the last ``WARM_S`` of heard audio
and reference are kept (AEC3 costs about 10 ms of a core per call-second, and most calls,
a handset or a browser that cancels its own echo, have none). Should the reply be heard
later (the caller turns a speakerphone on), the heard audio's correlation with the reference
shows it; a new AEC3 is run over the kept seconds first, which hold the echo the
correlation was found in, so that it has adapted to that echo almost as well as one that had
run all along, and its output is used from then on.

Heard audio is processed in whole 10 ms frames; a chunk that is not a whole number of them
leaves the rest for the next call (``heard`` returns only what was processed), so chunks of
10 or 20 ms whose reference is there come back at once, without a copy. While nothing has
been played for ``IDLE_S`` (the longest echo path and room tail there are), heard audio
passes untouched and AEC3 is not called at all.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from pywebrtc_audio import AudioProcessor

# Played audio held for pairing: past this much the heard stream is taken to have started
# over. More than the longest gap a call's input conceals (a second) rather than skipping.
MAX_LEAD_S = 1.5
# How far the reference is paired behind the heard audio where the two arrive apart
# (WebRTC): three 20 ms frames, so that either stream's frame may come in the other's phase
# and a loaded loop's jitter besides. An echo path shorter than this (no real one is:
# jitter buffers, codec frames, the air) would reach AEC3 before its reference.
LEAD_S = 0.06
# The least the reference may wait for its heard counterpart over a window before the
# excess is dropped, down to the lead.
SLACK_S = 0.1
TRIM_WINDOW_S = 2.0
# Heard audio this far ahead of the reference has started over. A stalled server loop makes
# the caller's audio queued meanwhile arrive before the reference catches up (its ticks
# run late); a caller's clock that runs fast gets here only after hours.
MAX_OWED_S = 1.5
# The longest heard audio waits for its reference (a loaded server's ticks late, the
# caller's packets queued meanwhile) before it is paired with silence instead.
MAX_WAIT_S = 0.3
# After the last sample of reference that was not silence, this long before the heard audio
# is passed through unprocessed: a path delay of 300 ms, a room tail, and the margin.
IDLE_S = 1.0
# Echo presence (see the module doc). Heard audio is judged in windows of this length,
# against the reference of the window and of the longest echo path before it (AEC3's own
# delay search covers about as much).
PRESENCE_WINDOW_S = 0.25
PRESENCE_PATH_S = 0.5
# A window counts while the reference is audible over all of that (RMS over about -40 dBFS).
AUDIBLE_RMS = 300.0
# Heard audio this far under the reference (RMS) is no echo worth cancelling; the echoes the
# canceller is for are -6 to -20 dB.
QUIET_DB = -35.0
# This much audible reply heard as quiet, and the call has no echo.
QUIET_S = 1.0
# While AEC3 rests, the heard audio and reference kept to start a new one on: longer than
# AEC3's initial state (2.5 s, in which it suppresses cautiously). Over the two seconds
# after a speakerphone's echo was found (tests/audio/test_echo.py), a new AEC3 run over the
# last second alone took it out by 33 dB, one run over these three by 42 dB, and one that
# had run all along by 46 dB.
WARM_S = 3.0
# Two heard windows in a row this correlated with the reference, at delays within the path
# and within ECHO_DELAY_S of each other, are echo. One is not enough: a word said in the
# reply's own voice (a test's caller, a synthetic voice) correlates with it over the few
# hundredths of a second it starts with.
ECHO_CORRELATION = 0.5
ECHO_DELAY_S = 0.002


_NOTHING = np.zeros(0, np.int16)
_NOTHING.flags.writeable = False


class EchoCanceller:
    """AEC3 over one call at ``rate`` Hz (any rate with whole 10 ms frames); ``lead_s``: 0
    where each heard frame comes right after the frame played with it (SIP's ticks).

    ``played`` hands over the reference as it is played, ``heard`` the microphone as it is
    heard, each in chunks of any length, from one thread.
    """

    def __init__(self, rate: int, lead_s: float = LEAD_S) -> None:
        if rate <= 0 or rate % 100:
            raise ValueError(f"{rate} Hz has no whole 10 ms frames")
        self.rate = rate
        self.frame = rate // 100
        self._apm: AudioProcessor | None = None
        self._max_lead = int(MAX_LEAD_S * rate)
        # The played samples not yet paired: _far[_start:_end], compacted when full.
        self._far = np.zeros(2 * (self._max_lead + 4 * self.frame), np.int16)
        self._start = 0
        self._end = 0
        # Reference samples owed: heard audio outran them and was paired with silence.
        self._owed = 0
        self._max_owed = int(MAX_OWED_S * rate)
        # Heard audio waiting for the rest of its frame, or for its reference.
        self._max_wait = int(MAX_WAIT_S * rate)
        self._wait = np.zeros(self._max_wait + rate // 2, np.int16)
        self._wait_len = 0
        self._lead = int(lead_s * rate)
        self._slack = int(SLACK_S * rate)
        self._window = int(TRIM_WINDOW_S * rate)
        self._window_heard = 0
        self._window_least = self._max_lead
        self._window_least_wait = self._max_wait
        # Counted in played samples: where the last audible reference ends. The heard audio
        # is idle while what it is paired with is more than IDLE_S past that.
        self._played = 0
        self._idle = int(IDLE_S * rate)
        self._audible_until = -self._idle - self._lead - 1
        self._started = False
        self.presence = EchoPresence(rate)
        # While AEC3 rests (None otherwise): the last WARM_S heard (near) and played with it
        # (far), each _history[:, _kept - _warm : _kept], compacted when full.
        self._warm = int(WARM_S * rate)
        self._history: npt.NDArray[np.int16] | None = None
        self._kept = 0
        # How often the pairing had to give way (for the tests and the bench).
        self.underruns = 0
        self.trims = 0
        self.catch_ups = 0
        self.restarts = 0
        self.frames_processed = 0

    # ------------------------------------------------------------------ reference

    def played(self, pcm: npt.NDArray[np.int16], *, silent: bool = False) -> npt.NDArray[np.int16]:
        """The next samples of the reference, as they leave (``silent``: all zero, which
        the caller knows without looking). Returns the heard audio that was waiting for
        them, its echo taken out (most often none)."""
        self._store(pcm, silent)
        if self._wait_len < self.frame:
            return _NOTHING
        return self._drain()

    def _store(self, pcm: npt.NDArray[np.int16], silent: bool) -> None:
        n = len(pcm)
        if not n:
            return
        self._played += n
        if not silent:
            self._audible_until = self._played
        if self._owed:
            dropped = min(self._owed, n)
            self._owed -= dropped
            if dropped == n:
                return
            pcm = pcm[dropped:]
            n -= dropped
        if self._end + n > len(self._far):
            held = self._end - self._start
            self._far[:held] = self._far[self._start : self._end]
            self._start, self._end = 0, held
        if silent:
            self._far[self._end : self._end + n] = 0
        else:
            self._far[self._end : self._end + n] = pcm
        self._end += n
        if self._end - self._start > self._max_lead + 2 * self.frame:
            # Nothing heard for a while: only what the next heard audio may meet is kept.
            self._start = self._end - self._max_lead - 2 * self.frame

    # ------------------------------------------------------------------ microphone

    def heard(self, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """The next microphone samples with the echo taken out: the whole 10 ms frames of
        what waits and ``pcm`` that have their reference; the rest waits for the next call
        or for the reference (``played`` hands it out then), ``MAX_WAIT_S`` at most."""
        frame = self.frame
        n = len(pcm)
        if not self._started:
            # The pairing starts here: the first samples heard go with the last played, the
            # lead before them (silence where nothing was played yet).
            self._started = True
            keep = self._lead + n - n % frame
            held = min(self._end - self._start, keep)
            recent = self._far[self._end - held : self._end].copy()
            self._far[: keep - held] = 0
            self._far[keep - held : keep] = recent
            self._start, self._end = 0, keep
        if not self._wait_len and not n % frame and self._end - self._start >= n:
            return self._process(pcm)
        head = _NOTHING
        if n > len(self._wait) - self._wait_len:
            head = self._drain(force=True)
        if n > len(self._wait) - self._wait_len:
            # Longer than anything that waits: through at once, with what reference there is.
            whole = n - n % frame
            tail = self._process(pcm[:whole]) if whole else _NOTHING
            self._wait[: n - whole] = pcm[whole:]
            self._wait_len = n - whole
            return np.concatenate((head, tail))
        self._wait[self._wait_len : self._wait_len + n] = pcm
        self._wait_len += n
        out = self._drain()
        return out if not len(head) else np.concatenate((head, out))

    def _drain(self, force: bool = False) -> npt.NDArray[np.int16]:
        """Process the whole frames waiting that have their reference (all of them when
        ``force``d, or when they have waited ``MAX_WAIT_S``)."""
        frame = self.frame
        whole = self._wait_len - self._wait_len % frame
        held = self._end - self._start
        ready = min(whole, held - held % frame)
        if force or whole - ready > self._max_wait:
            ready = whole
        if not ready:
            return _NOTHING
        near = self._wait[:ready].copy()
        left = self._wait_len - ready
        self._wait[:left] = self._wait[ready : self._wait_len]
        self._wait_len = left
        return self._process(near)

    def _process(self, near: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        n = len(near)
        held = self._end - self._start
        if held > self._max_lead:
            # The heard stream fell behind by more than any gap it fills: it starts over, and
            # is paired with what was played last.
            self._start = self._end - n
            held = n
            self.restarts += 1
        start = self._start
        if held >= n:
            far = self._far[start : start + n]
            self._start += n
        else:
            # Heard audio outran the reference: silence stands in for what is not played
            # yet, and is owed.
            far = np.zeros(n, np.int16)
            far[:held] = self._far[start : self._end]
            self._start = self._end
            self._owed += n - held
            self.underruns += 1
            if self._owed > self._max_owed:
                self._owed = 0
                self.restarts += 1
        self._keep_lead(n)
        paired_at = self._played - (self._end - self._start)
        if paired_at - self._audible_until > self._idle:
            return near
        if not self.presence.echo:
            return self._rest(near, far)
        out = self._cancel(near, far)
        if not self.presence.heard(near, far):
            # No echo after all: AEC3 rests from here (its kept seconds start empty: they
            # were let go when the echo came back, if ever they were kept).
            self._apm = None
            return near
        return out

    def _cancel(
        self, near: npt.NDArray[np.int16], far: npt.NDArray[np.int16]
    ) -> npt.NDArray[np.int16]:
        apm = self._apm
        if apm is None:
            apm = self._apm = AudioProcessor(sample_rate=self.rate, echo_cancellation=True)
        self.frames_processed += len(near) // self.frame
        out: npt.NDArray[np.int16] = apm.process(
            np.ascontiguousarray(near), np.ascontiguousarray(far)
        )
        return out

    def _rest(
        self, near: npt.NDArray[np.int16], far: npt.NDArray[np.int16]
    ) -> npt.NDArray[np.int16]:
        """A call with no echo: ``near`` passes as it came, and is kept with ``far``; if the
        reply is heard in it after all, a new AEC3 runs over what was kept, then on ``near``."""
        n = len(near)
        history = self._history
        if history is None:
            history = self._history = np.zeros((2, 2 * self._warm), np.int16)
        if n >= self._warm:
            history[:, : self._warm] = (near[-self._warm :], far[-self._warm :])
            self._kept = self._warm
        else:
            if self._kept + n > history.shape[1]:
                history[:, : self._warm - n] = history[:, self._kept - self._warm + n : self._kept]
                self._kept = self._warm - n
            history[:, self._kept : self._kept + n] = (near, far)
            self._kept += n
        if not self.presence.heard(near, far):
            return near
        frame = self.frame
        start = max(0, self._kept - self._warm)
        start += (self._kept - start - n) % frame
        kept_near, kept_far = history[:, start : self._kept - n]
        if len(kept_near):
            self._cancel(kept_near, kept_far)
        self._history = None
        self._kept = 0
        return self._cancel(near, far)

    def _keep_lead(self, heard: int) -> None:
        """Move the pairing when, all window long, the reference waited more than the slack
        (drop its oldest samples, down to the lead) or the heard audio waited for it
        (silence before the reference, to give the lead back)."""
        held = self._end - self._start
        if held < self._window_least:
            self._window_least = held
        if self._wait_len < self._window_least_wait:
            self._window_least_wait = self._wait_len
        self._window_heard += heard
        if self._window_heard < self._window:
            return
        if self._window_least > self._slack:
            self._start += self._window_least - self._lead
            self.trims += 1
        waited = self._window_least_wait
        if waited >= self.frame:
            gap = waited - waited % self.frame + self._lead
            kept = self._far[self._start : self._end].copy()
            self._far[:gap] = 0
            self._far[gap : gap + len(kept)] = kept
            self._start, self._end = 0, gap + len(kept)
            self.catch_ups += 1
        self._window_heard = 0
        self._window_least = self._max_lead
        self._window_least_wait = self._max_wait


class EchoPresence:
    """Whether a call's microphone hears the reply (see the module doc), from the heard audio
    and the reference paired with it, at ``rate`` Hz.

    ``echo`` starts true (cancel until shown otherwise). It turns false once ``QUIET_S`` of
    audible reply went by with the microphone more than ``QUIET_DB`` under it, and true again
    when two heard windows in a row are ``ECHO_CORRELATION`` correlated with the reference at
    about the same delay within ``PRESENCE_PATH_S``.
    """

    def __init__(self, rate: int) -> None:
        self._window = int(PRESENCE_WINDOW_S * rate)
        self._path = int(PRESENCE_PATH_S * rate)
        # The reference of the path before the window and of the window; the window heard.
        self._far = np.zeros(self._path + self._window, np.float64)
        self._near = np.zeros(self._window, np.float64)
        self._filled = 0
        self._quiet_windows_needed = max(1, round(QUIET_S / PRESENCE_WINDOW_S))
        self._quiet_windows = 0
        self._quiet_ratio = 10 ** (QUIET_DB / 20)
        self._delay_slack = ECHO_DELAY_S * rate
        # The delay at which the last window heard the reference, if it did.
        self._echo_delay: int | None = None
        self.echo = True
        self.windows = 0

    def heard(self, near: npt.NDArray[np.int16], far: npt.NDArray[np.int16]) -> bool:
        """The next heard samples and the reference paired with them (the same length);
        returns whether the call has an echo to cancel."""
        window, path = self._window, self._path
        i, n = 0, len(near)
        while i < n:
            take = min(n - i, window - self._filled)
            at = path + self._filled
            self._far[at : at + take] = far[i : i + take]
            self._near[self._filled : self._filled + take] = near[i : i + take]
            self._filled += take
            i += take
            if self._filled == window:
                self._judge()
                # The window's reference becomes the end of the next one's path.
                self._far[:path] = self._far[window:]
                self._filled = 0
        return self.echo

    def _judge(self) -> None:
        far, near = self._far, self._near
        path, window = self._path, self._window
        # Sums of squares of the path before the window and of the window's reference.
        before = float(far[:path] @ far[:path])
        during = float(far[path:] @ far[path:])
        audible = AUDIBLE_RMS * AUDIBLE_RMS
        if before < audible * path or during < audible * window:
            return
        self.windows += 1
        # Mean squares compared, so the quiet ratio is squared.
        if float(near @ near) / window < (before + during) / len(far) * self._quiet_ratio**2:
            self._quiet_windows += 1
            if self._quiet_windows >= self._quiet_windows_needed:
                self.echo = False
            return
        self._quiet_windows = 0
        if self.echo:
            return
        correlation, delay = self._correlation()
        if correlation < ECHO_CORRELATION:
            self._echo_delay = None
            return
        last, self._echo_delay = self._echo_delay, delay
        if last is not None and abs(delay - last) <= self._delay_slack:
            self.echo = True

    def _correlation(self) -> tuple[float, int]:
        """The highest normalised correlation of the heard window with the reference at a
        delay of 0 to ``PRESENCE_PATH_S``, and that delay in samples."""
        far, near = self._far, self._near
        window, path = self._window, self._path
        size = 1 << (len(far) + window - 1).bit_length()
        # full[k] = sum_i near[i] * far[i + k]: the window against the reference k samples
        # after the path's start (a delay of path - k), for k = 0 .. path.
        full = np.fft.irfft(np.fft.rfft(far, size) * np.conj(np.fft.rfft(near, size)), size)
        dots = full[: path + 1]
        # Energy of far[k : k + window] for each k, from running sums.
        sums = np.concatenate(([0.0], np.cumsum(far * far)))
        energies = sums[window : window + path + 1] - sums[: path + 1]
        norm = np.sqrt(np.maximum(energies, 1.0) * max(float(near @ near), 1.0))
        correlations = np.abs(dots) / norm
        best = int(np.argmax(correlations))
        return float(correlations[best]), path - best

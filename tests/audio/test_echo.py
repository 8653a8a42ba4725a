"""The echo canceller's adapter: a delayed, room-filtered copy of the reference is taken out
by a measured margin (ERLE, on signals made here), a voice over it stays, audio heard while
nothing plays passes untouched, and a call with no echo at all hears its caller untouched
once it has shown it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.echo import PRESENCE_PATH_S, PRESENCE_WINDOW_S, QUIET_S, EchoCanceller
from tests.speech import spoken

REPLY = (
    "Could you tell me what the capital of France is, and how many people live there?",
    "Tell me a long story about a dragon and a knight.",
    "How do I reset my password?",
)
BARGE_IN = "Wait, stop please."


def room(rate: int, seed: int = 7) -> npt.NDArray[np.float64]:
    """A room-like impulse response: a direct path, then 250 ms of exponentially decaying
    noise (τ 30 ms, a reverberation time near 210 ms), at unit energy."""
    rng = np.random.default_rng(seed)
    length = rate // 4
    ir = rng.standard_normal(length) * np.exp(-np.arange(length) / (0.03 * rate))
    ir[0] = 2.0
    return ir / np.sqrt(np.sum(ir**2))


def echo_of(
    far: npt.NDArray[np.int16], rate: int, delay_ms: int, gain_db: float
) -> npt.NDArray[np.float64]:
    """``far`` as a microphone hears it: late by ``delay_ms``, through the room, quieter."""
    delay = delay_ms * rate // 1000
    wet = np.convolve(far.astype(np.float64), room(rate))[: len(far) - delay]
    return np.concatenate((np.zeros(delay), wet)) * 10 ** (gain_db / 20)


def pcm(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int16]:
    return np.clip(np.rint(x), -32768, 32767).astype(np.int16)


def through(
    canceller: EchoCanceller,
    far: npt.NDArray[np.int16],
    near: npt.NDArray[np.int16],
    chunk_ms: int = 20,
) -> npt.NDArray[np.int16]:
    """Play ``far`` and hear ``near`` chunk by chunk, as a call's ticks do."""
    step = canceller.rate * chunk_ms // 1000
    out = []
    for i in range(0, len(near) - step + 1, step):
        out.append(canceller.played(far[i : i + step]))
        out.append(canceller.heard(near[i : i + step]))
    return np.concatenate(out)


def energy(x: npt.NDArray[np.generic]) -> float:
    return float(np.sum(x.astype(np.float64) ** 2)) + 1.0


def erle_at_the_end(
    heard: npt.NDArray[np.generic], out: npt.NDArray[np.generic], rate: int
) -> float:
    """How much quieter (dB) ``out`` is than ``heard`` over the last three seconds of
    ``out`` (``heard`` aligned with it from the start), once AEC3 has found the path."""
    tail = slice(len(out) - 3 * rate, len(out))
    return float(10 * np.log10(energy(heard[tail]) / energy(out[tail])))


def reply(rate: int) -> npt.NDArray[np.int16]:
    return np.concatenate([spoken(text, rate) for text in REPLY])


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
@pytest.mark.parametrize(("delay_ms", "gain_db"), [(50, -6), (150, -20), (300, -6)])
def test_a_delayed_filtered_echo_is_taken_out(rate: int, delay_ms: int, gain_db: float) -> None:
    far = reply(rate)
    near = pcm(echo_of(far, rate, delay_ms, gain_db))
    # Played then heard in each step, as SIP's ticks hand them over: no lead needed.
    out = through(EchoCanceller(rate, lead_s=0.0), far, near)
    # Once AEC3 has found the delay and the path (the last three seconds of the reply):
    erle_db = erle_at_the_end(near, out, rate)
    assert erle_db >= 25, erle_db


def test_a_voice_over_the_echo_stays() -> None:
    rate = 16000
    far = reply(rate)
    voice = spoken(BARGE_IN, rate).astype(np.float64) * 0.5
    at = len(far) - len(voice) - rate
    talk = np.zeros(len(far))
    talk[at : at + len(voice)] = voice
    echo = echo_of(far, rate, 150, -6)
    out = through(EchoCanceller(rate, lead_s=0.0), far, pcm(echo + talk))
    during = slice(at, at + len(voice))
    # Most of the voice's energy comes through, and the loudness of what comes through
    # follows the voice (10 ms by 10 ms), not the echo under it, as the input did not.
    kept_db = 10 * np.log10(energy(out[during]) / energy(talk[during]))
    assert kept_db >= -6, kept_db
    follows_voice = np.corrcoef(envelope(out[during]), envelope(talk[during]))[0, 1]
    follows_echo = np.corrcoef(envelope(out[during]), envelope(echo[during]))[0, 1]
    before = np.corrcoef(envelope(echo[during] + talk[during]), envelope(talk[during]))[0, 1]
    assert follows_voice >= 0.6, follows_voice
    assert follows_voice > before, (follows_voice, before)
    assert follows_echo < 0.3, follows_echo


def envelope(x: npt.NDArray[np.generic], frame: int = 160) -> npt.NDArray[np.float64]:
    """Loudness in dB, 10 ms (at 16 kHz) at a time."""
    whole = np.asarray(x, np.float64)[: len(x) // frame * frame].reshape(-1, frame)
    return np.asarray(10 * np.log10(np.sum(whole**2, axis=1) + 1.0))


def test_nothing_played_leaves_the_microphone_untouched() -> None:
    rate = 24000
    canceller = EchoCanceller(rate)
    near = spoken(BARGE_IN, rate)
    silence = np.zeros(len(near), np.int16)
    step = rate // 50
    out = []
    for i in range(0, len(near) - step + 1, step):
        out.append(canceller.played(silence[i : i + step], silent=True))
        out.append(canceller.heard(near[i : i + step]))
    whole = len(near) // step * step
    assert np.array_equal(np.concatenate(out), near[:whole])
    assert canceller.frames_processed == 0


def test_chunks_of_any_length_come_back_in_whole_frames() -> None:
    rate = 16000
    far = reply(rate)[: 2 * rate]
    near = pcm(echo_of(far, rate, 100, -6))
    canceller = EchoCanceller(rate)
    out = through(canceller, far, near, chunk_ms=7)
    step = rate * 7 // 1000
    heard = len(near) // step * step
    assert len(out) == heard - heard % canceller.frame
    assert canceller.frames_processed == len(out) // canceller.frame


def test_a_microphone_back_from_a_long_gap_is_paired_afresh() -> None:
    """A caller silent for two seconds (longer than any gap its stream fills): the reference
    played meanwhile is let go, and the echo after the gap is cancelled again."""
    rate = 16000
    far = reply(rate)
    near = pcm(echo_of(far, rate, 120, -6))
    canceller = EchoCanceller(rate, lead_s=0.0)
    step = rate // 50
    gap = range(rate // step, 3 * rate // step)
    out = []
    for k, i in enumerate(range(0, len(near) - step + 1, step)):
        out.append(canceller.played(far[i : i + step]))
        if k not in gap:
            out.append(canceller.heard(near[i : i + step]))
    assert canceller.restarts == 1
    heard = np.concatenate(out)
    after = near[3 * rate : 3 * rate + len(heard) - rate]
    erle_db = erle_at_the_end(after, heard[rate:], rate)
    assert erle_db >= 25, erle_db


def test_with_a_lead_a_frame_heard_before_its_reference_is_played_still_pairs() -> None:
    """WebRTC's order: the caller's frame may be heard just before the tick that plays its
    counterpart, and a loaded loop runs its ticks late and in bursts (here every fifth
    tick, two frames at once, and once a stall of 200 ms whose frames the caller's packets,
    queued meanwhile, bring before the ticks catch up). The lead and the wait keep every
    frame with its own reference."""
    rate = 24000
    far = reply(rate)
    near = pcm(echo_of(far, rate, 150, -12))
    canceller = EchoCanceller(rate)
    step = rate // 50
    stall = range(100, 110)
    out = []
    for k, i in enumerate(range(0, len(near) - step + 1, step)):
        out.append(canceller.heard(near[i : i + step]))
        if k in stall:
            continue
        first = i - (k - stall.start) * step if k == stall.stop else i
        if k % 5 == 3:
            continue
        if k % 5 == 4:
            first = min(first, i - step)
        out.append(canceller.played(far[first : i + step]))
    heard = np.concatenate(out)
    assert canceller.underruns == 0
    assert len(heard) >= len(near) - rate // 10
    erle_db = erle_at_the_end(near, heard, rate)
    assert erle_db >= 25, erle_db


def test_a_caller_clock_faster_than_the_reference_is_caught_up() -> None:
    """The caller's stream gains 20 ms on ours every second (its sound card's clock,
    concealed gaps): its audio would wait longer and longer for the reference; instead the
    pairing gives the lead back, and the echo is still cancelled."""
    rate = 16000
    far = reply(rate)
    echo = pcm(echo_of(far, rate, 150, -6))
    step = rate // 50
    gain = rate // 50
    pieces, k = [], 0
    while k < len(echo):
        pieces += [echo[k : k + rate], np.zeros(gain, np.int16)]
        k += rate
    near = np.concatenate(pieces)[: len(echo)]
    canceller = EchoCanceller(rate)
    out = []
    played = 0
    for c, i in enumerate(range(0, len(near) - step + 1, step)):
        out.append(canceller.heard(near[i : i + step]))
        # The caller's extra 20 ms each second has no reference of its own.
        if c % (rate // step + 1) != rate // step:
            out.append(canceller.played(far[played : played + step]))
            played += step
    heard = np.concatenate(out)
    assert canceller.catch_ups >= 1
    assert canceller.underruns == 0
    # Nothing is held back for long: the audio heard is out within the wait's bound.
    assert len(heard) >= len(near) - len(near) % step - rate // 10
    erle_db = erle_at_the_end(near, heard, rate)
    assert erle_db >= 20, erle_db


@pytest.mark.parametrize("rate", [8000, 24000])
def test_a_call_with_no_echo_hears_its_caller_untouched(rate: int) -> None:
    """A headset: the microphone never hears the reply. AEC3 alone took a voice said over the
    reply for echo (10-60 dB quieter); once the reply has played QUIET_S with the microphone
    quiet, the voice passes as it was said, every sample."""
    far = reply(rate)
    voice = spoken(BARGE_IN, rate)
    at = int((PRESENCE_PATH_S + QUIET_S + 0.5) * rate)
    near = np.zeros(len(far), np.int16)
    near[at : at + len(voice)] = voice
    canceller = EchoCanceller(rate, lead_s=0.0)
    out = through(canceller, far, near)
    assert not canceller.presence.echo
    assert np.array_equal(out[at : at + len(voice)], voice)
    # AEC3 rests once the call has shown it has no echo: it ran on what came before alone.
    frames = len(out) // canceller.frame
    shown = round((PRESENCE_PATH_S + QUIET_S + 2 * PRESENCE_WINDOW_S) * 100)
    assert canceller.frames_processed <= shown < frames // 2


def test_a_quiet_start_then_an_echo_is_cancelled_again() -> None:
    """The caller turns a speakerphone on in the middle of a reply: the echo is heard from
    then on, the correlation with the reference shows it, and it is cancelled again."""
    rate = 16000
    far = np.concatenate((reply(rate), reply(rate)))
    echo = echo_of(far, rate, 150, -6)
    on = 4 * rate
    echo[:on] = 0
    near = pcm(echo)
    canceller = EchoCanceller(rate, lead_s=0.0)
    out = through(canceller, far, near)
    assert canceller.presence.echo
    # It rested while the microphone was quiet, and came back.
    assert 0 < canceller.frames_processed < len(out) // canceller.frame
    erle_db = erle_at_the_end(near, out, rate)
    assert erle_db >= 25, erle_db
    # Started anew on the seconds kept, it takes the echo out at once almost as well as one
    # that had run all along (42 dB here against 46; started on the last second alone, 33).
    soon = slice(on + 5 * rate // 2, on + 9 * rate // 2)
    soon_db = float(10 * np.log10(energy(near[soon]) / energy(out[soon])))
    assert soon_db >= 38, soon_db


def test_an_echo_keeps_the_canceller_on() -> None:
    """The echo is never taken for a quiet microphone, even -20 dB under the reply."""
    rate = 8000
    far = reply(rate)
    canceller = EchoCanceller(rate, lead_s=0.0)
    through(canceller, far, pcm(echo_of(far, rate, 300, -20)))
    assert canceller.presence.echo
    assert canceller.presence.windows > 10

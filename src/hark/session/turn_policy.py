"""Turn policy: how the session's turn detection (``server_vad`` or ``semantic_vad``) decides.

A ``TurnPolicy`` is chosen once from the session's ``turn_detection`` config and answers every
question the core has about turn-taking: the VAD threshold and prefix padding, the silence that
ends a turn, when to start recognising (and speculating on) a pause, whether pauses are judged
by the end-of-turn model and what silence a judgement asks for, and the idle timeout. The core
holds a policy, never the config's class.

``semantic_vad`` ends the user's turn after a pause whose length depends on what was said:
the end-of-turn model (``hark.engines.turn``) says how likely the transcript so far is a
finished turn, and :func:`silence_for` turns that probability and the eagerness into the
silence to wait.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from hark.protocol.session_config import SemanticVad, ServerVad, TurnDetection

# The longest semantic_vad waits in a pause, by eagerness (OpenAI's figures).
MAX_SILENCE_MS = {"low": 8000, "medium": 4000, "high": 2000, "auto": 4000}
# server_vad's default silence_duration_ms: the plain silence timer semantic_vad must beat.
SILENCE_TIMER_MS = 500
# Where the curve ends: an utterance that is clearly complete still gets this much silence,
# about the gap between turns in human conversation.
CURVE_END_MS = 200
# The shortest silence that ends a turn, by eagerness. Low asks for the speaker to be given
# time: however finished the words sound, it never ends a turn on less than 800 ms of
# silence, since the words of a pause often sound finished when the turn is not (a list's
# first item, a sentence before an afterthought, a trailing "and" the recogniser misheard).
# On hark bench turns this is the point of fewest cut-offs for the dead air
# (docs/turn-taking.md); the other eagerness values end a clearly finished turn at once.
MIN_SILENCE_MS = {"low": 800, "medium": CURVE_END_MS, "high": CURVE_END_MS, "auto": CURVE_END_MS}
# From this probability up the turn ends fast: with eagerness auto, after at most ~310 ms.
END_FAST_PROBABILITY = 0.85
# A pause this long inside speech starts speculative recognition (and then a speculative
# reply): shorter gaps are usually between words. semantic_vad starts at once (the pause's
# first chunk), because its decision to end the turn, and so the reply, waits for that
# transcript.
SPECULATE_AFTER_MS = 96
SEMANTIC_SPECULATE_AFTER_MS = 32


def unjudged_silence_ms(eagerness: str) -> int:
    """The silence that ends a ``semantic_vad`` pause whose verdict has not come (yet, or
    because the end-of-turn model failed).

    The verdict is what lets a pause be longer or shorter than the silence timer. Without one
    nothing is known that the timer does not know, so with eagerness auto, medium and high the
    pause ends where ``server_vad``'s default would end it, ``SILENCE_TIMER_MS``: on a host too
    busy to recognise and judge a pause in time, ``semantic_vad`` is never slower than the
    timer. Eagerness low asked for the speaker to take their time: there an unjudged pause
    waits what a neutral verdict (probability 0.5) asks for, about 1.3 s, not its 8 s cap.
    A verdict that comes later still sets the wait, whether shorter or longer.
    """
    if eagerness == "low":
        return silence_for(0.5, eagerness)
    if eagerness not in MAX_SILENCE_MS:
        raise ValueError(f"unknown eagerness {eagerness!r}")
    return SILENCE_TIMER_MS


def silence_for(probability: float, eagerness: str) -> int:
    """Silence (ms) to wait before ending the turn, given how likely it is complete.

    The wait falls geometrically from the eagerness's cap (``probability`` 0) to
    ``CURVE_END_MS`` (``probability`` 1), ``END × (cap / END) ** (1 − p)``, and is never
    shorter than the eagerness's ``MIN_SILENCE_MS`` (800 ms for low). Pauses inside a
    turn have a long tail (a speaker looking up a number pauses for seconds, most pauses
    are short), so the wait is set on a log scale: each tenth of probability lost multiplies
    it by the same factor (1.35 with eagerness auto). With auto, a probability of 0.9 waits
    270 ms, 0.5 waits 890 ms and 0.4 waits 1.2 s; only an utterance judged unfinished waits
    seconds. Out-of-range probabilities are clamped, and NaN counts as 0 (wait the most).
    Raises ``ValueError`` for an eagerness other than low, medium, high or auto.
    """
    cap = MAX_SILENCE_MS.get(eagerness)
    if cap is None:
        raise ValueError(f"unknown eagerness {eagerness!r}")
    p = 0.0 if math.isnan(probability) else min(1.0, max(0.0, probability))
    wait = round(CURVE_END_MS * (cap / CURVE_END_MS) ** (1.0 - p))
    return max(MIN_SILENCE_MS[eagerness], wait)


class TurnPolicy(ABC):
    """What the session's turn detection decides, whichever kind it is."""

    #: VAD probability from which a chunk counts as speech.
    threshold: float
    #: Audio kept before the detected start of speech.
    prefix_padding_ms: int
    #: The silence that ends a turn until a judgement (if any) says otherwise (and after a
    #: judgement failed).
    silence_ms: int
    #: How long a pause lasts before it is recognised and a reply speculated on.
    speculate_after_ms: int
    #: Whether the end of a turn creates a response, and speech cancels the one in progress.
    create_response: bool
    interrupt_response: bool
    #: Silence after the assistant's reply that commits the buffer and prompts a response.
    idle_timeout_ms: int | None
    #: Whether pauses are judged by the end-of-turn model (``ScoreTurn``).
    scores_turns: bool
    #: Whether speech during the reply is judged first, so that a backchannel does not
    #: interrupt it (``hark.session.backchannel``).
    backchannels: bool

    @abstractmethod
    def silence_after(self, probability: float) -> int:
        """The silence (ms) that ends the turn once the model judged it complete with
        ``probability``."""


class ServerVadPolicy(TurnPolicy):
    """``server_vad``: a fixed silence window; no judgement of what was said."""

    def __init__(self, config: ServerVad) -> None:
        self.threshold = config.threshold
        self.prefix_padding_ms = config.prefix_padding_ms
        self.silence_ms = config.silence_duration_ms
        self.speculate_after_ms = SPECULATE_AFTER_MS
        self.create_response = config.create_response
        self.interrupt_response = config.interrupt_response
        self.idle_timeout_ms = config.idle_timeout_ms
        self.scores_turns = False
        self.backchannels = bool(config.hark_backchannels)

    def silence_after(self, probability: float) -> int:
        """The window does not depend on what was said."""
        return self.silence_ms


class SemanticVadPolicy(TurnPolicy):
    """``semantic_vad``: the silence that ends a turn follows how complete it sounds."""

    def __init__(self, config: SemanticVad) -> None:
        self.eagerness = config.eagerness
        self.threshold = 0.5
        self.prefix_padding_ms = 300
        # Until the end-of-turn model has judged the pause: no longer than the silence timer.
        self.silence_ms = unjudged_silence_ms(config.eagerness)
        self.speculate_after_ms = SEMANTIC_SPECULATE_AFTER_MS
        self.create_response = config.create_response
        self.interrupt_response = config.interrupt_response
        self.idle_timeout_ms = None
        self.scores_turns = True
        self.backchannels = config.hark_backchannels is not False

    def silence_after(self, probability: float) -> int:
        """:func:`silence_for` at the session's eagerness."""
        return silence_for(probability, self.eagerness)


def turn_policy(config: TurnDetection | None) -> TurnPolicy | None:
    """The policy for a session's ``turn_detection`` (None: turns are the client's)."""
    if config is None:
        return None
    if isinstance(config, ServerVad):
        return ServerVadPolicy(config)
    return SemanticVadPolicy(config)

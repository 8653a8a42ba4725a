"""Backchannels: a listener's "uh-huh" while the assistant's reply plays, told apart from an
interruption.

Speech that starts while the conversation's reply plays is not a turn at once: it is a
*candidate*, and nothing is said about it (no ``input_audio_buffer.speech_started``, the reply
is neither cancelled nor cleared) until it is judged, on the sample clock:

- speech that goes on for ``MAX_BACKCHANNEL_MS`` without a pause is an interruption;
- once it pauses for ``END_SILENCE_MS``, its words are asked for (one ``Recognise`` of the
  candidate's audio, ahead of captions): words that are all backchannel words (or none, as
  laughter often is) make it a backchannel, any other word an interruption;
- no verdict ``DECISION_MS`` after its onset (the recogniser is slow or failed) is an
  interruption: when in doubt the reply stops, as it did before.

An interruption becomes the turn it would have been, late: ``speech_started`` with the
candidate's own ``audio_start_ms``, the reply cancelled and its audio cleared. A backchannel
leaves no trace: no event, no item, no response, the reply plays on untruncated, and its
audio is dropped from the input buffer with the silence around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# Speech that lasts this long from its onset without a pause of END_SILENCE_MS interrupts:
# a backchannel is a word or two ("mm-hmm", "oh, okay"; under 700 ms at a slow rate), and
# a longer utterance is a listener taking the turn.
MAX_BACKCHANNEL_MS = 900
# A pause this long ends the candidate utterance, and its words are asked for. Longer than
# the gap inside "uh-huh" and "mm-hmm"; shorter than any turn-ending silence.
END_SILENCE_MS = 192
# With no verdict this long after the onset, the candidate interrupts (fail closed).
DECISION_MS = 2500
# The most words a backchannel has.
MAX_WORDS = 4

# Words a listener says to show they are following, not to take the turn, and what the
# recogniser writes for laughter (hums are ``_HUM``). Compared lowercased, without
# punctuation.
BACKCHANNEL_WORDS = frozenset(
    (
        "ah",
        "aha",
        "oh",
        "ooh",
        "yeah",
        "yea",
        "yeh",
        "yes",
        "yep",
        "yup",
        "ya",
        "right",
        "alright",
        "all",
        "okay",
        "ok",
        "kay",
        "sure",
        "cool",
        "nice",
        "great",
        "wow",
        "true",
        "exactly",
        "indeed",
        "totally",
        "absolutely",
        "definitely",
        "gotcha",
        "got",
        "it",
        "i",
        "see",
        "makes",
        "sense",
        "fine",
        "good",
        "ha",
        "haha",
        "hahaha",
        "hahahaha",
        "heh",
        "hehe",
        "hehehe",
        "laughs",
        "laughing",
        "laughter",
        "chuckles",
        "chuckling",
    )
)
# Annotations such as "[laughter]" or "(chuckles)", and punctuation, are not words said.
_ANNOTATION = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")
_NOT_WORD = re.compile(r"[^a-z' ]+")
# A hum however the recogniser spells it: "mm", "mmmm", "hmm", "mhm", "uhuh", "uhhuh",
# "nmmhmm" (Whisper writes a nasal onset as "Nm-m-hmm.").
_HUM = re.compile(r"[hmnu]+")

Verdict = Literal["backchannel", "interruption"]


def words_of(text: str) -> list[str]:
    """The words of a transcript as the lexicon reads them: lowercased, no punctuation,
    hyphens and apostrophes joined ("Uh-huh." → ``["uhhuh"]``), annotations dropped."""
    lowered = _ANNOTATION.sub(" ", text.lower()).replace("-", "").replace("'", "")
    return _NOT_WORD.sub(" ", lowered).split()


def judge_words(text: str) -> Verdict:
    """Whether a short utterance heard as ``text`` is a backchannel: at most ``MAX_WORDS``
    words, each one of ``BACKCHANNEL_WORDS`` or a hum (no words at all: laughter, a breath).
    A word said again at once counts once: a laugh comes out as "ha" or "ah" a dozen times."""
    words = words_of(text)
    said = sum(1 for i, word in enumerate(words) if i == 0 or word != words[i - 1])
    if said <= MAX_WORDS and all(
        word in BACKCHANNEL_WORDS or _HUM.fullmatch(word) for word in words
    ):
        return "backchannel"
    return "interruption"


@dataclass(slots=True)
class Candidate:
    """Speech heard while the reply plays, not yet judged.

    ``start_ms``: where its turn would start (``speech_started``'s, prefix padding included);
    ``voice_ms``: where its voice began, from which its length counts (session clock).
    """

    start_ms: float
    voice_ms: float
    # Where the candidate utterance ended (its words' audio ends there), once it paused.
    end_ms: float | None = None
    # The recognition asked for its words, until it answers.
    request_id: str | None = None
    # Where the turn detector ended the turn meanwhile (its speech_stopped), if it did.
    stopped_ms: float | None = None

    def step(self, now_ms: float, pause_from: float | None) -> Literal["ask", "interrupt"] | None:
        """The VAD has heard up to ``now_ms``; ``pause_from``: where the silence the
        candidate is in began (None while it speaks). Says whether to ask for its words
        now, interrupt, or wait."""
        if now_ms - self.voice_ms >= DECISION_MS:
            return "interrupt"
        if pause_from is None:
            if self.request_id is None and now_ms - self.voice_ms >= MAX_BACKCHANNEL_MS:
                return "interrupt"
            return None
        if self.request_id is None and now_ms - pause_from >= END_SILENCE_MS:
            if pause_from - self.voice_ms >= MAX_BACKCHANNEL_MS:
                return "interrupt"
            self.end_ms = pause_from
            return "ask"
        return None

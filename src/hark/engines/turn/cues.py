"""What the words of an unfinished utterance give away, read from a speech transcript.

A transcript is Whisper's text of the audio up to a pause, so it comes with Whisper's habits:
a period on almost everything (on "My phone number is 415." as on a finished sentence), an
ellipsis or a comma where the speech trailed off, digits for spoken numbers ("four one five"
becomes "415"), capitals or hyphens for spelled letters ("JOHN", "S-M-I"), fillers ("um")
mostly dropped, and on short or cut-off audio a phrase repeated in a loop ("How many? How
many?"). :func:`read_transcript` undoes those habits into a :class:`Transcript`, and
:func:`cues` names the signs in it of an unfinished (or a finished) utterance, each a
:class:`Cue` that :mod:`hark.engines.turn.llama_cpp` weighs with a language model's judgement.

The signs of an unfinished utterance are the ones that get people cut off by other voice
agents: a sentence that stops on a word that cannot end one ("for", "the", "and", "is"), a
filler ("um", "you know"), a phone, card or zip number with fewer digits than it must have,
an email address or a word being spelled out letter by letter, a street number with no
street, a month with no day. The signs of a finished one: a short reply ("thanks", "yes
please"), a sentence that opens as a question, a number with all its digits.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


def _words(text: str) -> frozenset[str]:
    """A word list written as one string, which keeps the long lists below readable."""
    return frozenset(text.split())


# Words after which an English sentence cannot end (in a voice assistant's inputs).
_CONJUNCTIONS = _words(
    "and or but nor so because cause cuz if unless until whether although though while "
    "whereas since than then plus"
)
_PREPOSITIONS = _words(
    "to for of in on at from with about by into onto between among under over through after "
    "before without within near towards toward around across against during per via than "
    "like including except beside besides behind beyond"
)
_DETERMINERS = _words("a an the my your our their his her its every each whose")
_AUXILIARIES = _words(
    "is are was were will would can could should shall may might must isn't aren't wasn't "
    "weren't won't wouldn't can't couldn't shouldn't it's that's there's what's i'm you're "
    "we're they're he's she's i'll you'll we'll i'd you'd we'd they'd i've you've we've "
    "they've gonna wanna gotta"
)
# Subject pronouns: "how do i", "can we", "so they"; "you" and "it" also end objects.
_SUBJECTS = _words("i we they he she")
# Fillers and hedges that announce more to come; Whisper keeps some of them.
_FILLERS = _words(
    "um umm uh uhh uhm erm er ah hmm hm mm mmm like well basically actually anyway so "
    "literally kinda sorta"
)
_FILLER_PHRASES = (
    ("you", "know"),
    ("i", "mean"),
    ("i", "guess"),
    ("let", "me", "see"),
    ("let", "me", "think"),
    ("let's", "see"),
    ("and", "also"),
    ("or", "maybe"),
)
# Question openers that cannot stand on their own once more words have come before them.
_DANGLING_PHRASES = (("how", "many"), ("how", "much"), ("such", "as"))
# "I think so", "I hope so": "so" ends these instead of leading on.
_SO_VERBS = _words("think hope guess believe suppose said told thought")
# Replies that are whole on their own.
_REPLY_WORDS = _words(
    "yes yeah yep yup no nope nah okay ok sure right alright fine great perfect cool thanks "
    "thank you please hello hi hey bye goodbye stop cancel correct exactly absolutely "
    "definitely"
)
_QUESTION_OPENERS = _words(
    "what what's who who's whom where where's when why how how's which can could would will "
    "do does did is are was were should shall may"
)
# "When I get home", "if it rains": a clause that waits for its main clause.
_SUBORDINATORS = _words("if when whenever because although though unless while once since until")
_CLAUSE_SUBJECTS = _words("i we they he she you it the my our your there this that")
_UNITS = _words("zero oh one two three four five six seven eight nine")
_TENS = _words(
    "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty "
    "thirty forty fifty sixty seventy eighty ninety"
)
# Words inside a number read out: "two hundred and five", "double five", "one dash two".
_NUMBER_GLUE = _words("hundred thousand and double triple dash point")
# Words Whisper writes in capitals that are not spelled out.
_CAPITAL_WORDS = _words("ok tv us uk usa eu id pm am ai")
_MONTHS = _words(
    "january february march april may june july august september october november december"
)
_STREET_TYPES = _words(
    "street st avenue ave road rd drive dr lane ln way boulevard blvd court ct place pl "
    "square terrace parkway highway circle"
)
_EMAIL_WORDS = _words("email e-mail")
_EMAIL_ENDINGS = _words("com org net edu gov io co uk de fr")

# Numbers that are read out until they have this many digits.
_DIGITS_EXPECTED: tuple[tuple[frozenset[str], int], ...] = (
    (_words("card"), 15),
    # Ten digits make a full North American number. Fewer is most likely a pause between
    # groups ("415 … 555 … 1234"), and Whisper drops or repeats a digit now and then, so a
    # seven-digit local number waits a little longer rather than a caller being cut off.
    (_words("phone cell mobile telephone fax reach call text"), 10),
    (_words("zip postcode postal"), 5),
)
_NUMBER_NOUNS = _words("number code pin account extension id")
# What the assistant asks for when it wants a number said (verbs such as "call" ask for
# no number: "Should I call you back?").
_ASKED_NUMBER = _NUMBER_NOUNS | _words("zip postcode")
# A month after one of these is a date still being said ("on March", "about March"); after
# a day it is whole ("the twenty first of March").
_BEFORE_A_DATE = _PREPOSITIONS | _words("is was")
_NEGATIONS = _words("no not never nope none nah")

_WORD = re.compile(r"(\S+?)([.,?!…;:\-–—]*)(?=\s|$)")
_SPELLED = re.compile(r"^(?:[a-z]-)+[a-z]?$", re.I)


class Ending(enum.Enum):
    """How the transcript's last word is punctuated, Whisper's own hint about the prosody."""

    NONE = "none"
    PERIOD = "period"
    QUESTION = "question"
    TRAILING = "trailing"  # an ellipsis, a comma, a dash: the speech trailed off


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript read back into words, without punctuation or repetition loops.

    ``text`` is the words rejoined in their original case, for a language model; ``words``
    are lowercase, with words spelled out split into letters (``"S-M-I"`` and ``"SMI"``
    become ``s m i``), for the rules of :func:`cues`. ``ending`` is the last word's
    punctuation.
    """

    text: str
    words: tuple[str, ...]
    ending: Ending


class Cue(enum.Enum):
    """A sign, in the words, that the utterance is unfinished or that it is finished."""

    DANGLING_WORD = "dangling_word"  # ends on a conjunction, a preposition, "the", "is"…
    OPEN_CLAUSE = "open_clause"  # only a subordinate clause so far: "if it rains tomorrow"
    FILLER = "filler"  # ends on "um", "you know", "so"…
    NUMBER_IN_PROGRESS = "number_in_progress"  # a phone, card or zip number short of digits
    NUMBER_DONE = "number_done"  # such a number with all its digits
    SPELLING = "spelling"  # ends on letters spelled one by one
    EMAIL_IN_PROGRESS = "email_in_progress"  # an email address with no domain yet
    ADDRESS_IN_PROGRESS = "address_in_progress"  # a street number with no street
    DATE_IN_PROGRESS = "date_in_progress"  # a month with no day
    SHORT_REPLY = "short_reply"  # "thanks", "yes please", "okay": whole replies in a word or two
    QUESTION_FORM = "question_form"  # starts as a question does ("can you", "what is")
    TRAILING_OFF = "trailing_off"  # Whisper heard the speech trail off (… , -)


def read_transcript(text: str) -> Transcript:
    """Undo Whisper's punctuation, repetition loops and spelling; see :class:`Transcript`."""
    tokens = [(m.group(1), m.group(2)) for m in _WORD.finditer(text.strip())]
    # A token of punctuation alone ("for …") belongs to the word before it.
    merged: list[tuple[str, str]] = []
    for word, marks in tokens:
        core = word.strip(".,?!…;:-–—\"'()[]")
        if not core and merged:
            merged[-1] = (merged[-1][0], merged[-1][1] + word + marks)
        elif core:
            merged.append((core, marks))
    merged = _collapse_loop(merged)
    if not merged:
        return Transcript("", (), Ending.NONE)
    words: list[str] = []
    for word, _ in merged:
        words.extend(_split_word(word))
    return Transcript(" ".join(w for w, _ in merged), tuple(words), _ending(merged[-1][1]))


def _ending(marks: str) -> Ending:
    if not marks:
        return Ending.NONE
    if "…" in marks or ".." in marks or marks[-1] in ",;:-–—":
        return Ending.TRAILING
    return Ending.QUESTION if "?" in marks else Ending.PERIOD


def _collapse_loop(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One copy of a phrase that a looping decoder wrote over and over ("no no no")."""
    words = [w.lower() for w, _ in tokens]
    for period in range(1, len(words) // 2 + 1):
        if all(words[i] == words[i % period] for i in range(len(words))):
            return tokens[:period]
    return tokens


def _split_word(word: str) -> list[str]:
    lower = word.lower()
    if _SPELLED.match(lower):
        return [c for c in lower if c != "-"]
    if len(word) > 1 and word.isupper() and word.isalpha() and lower not in _CAPITAL_WORDS:
        # Whisper writes letters it hears spelled out in capitals ("JOHN").
        return list(lower)
    return [lower]


def _digits(word: str) -> int:
    """How many digits ``word`` says: "415" three, "four" one, "twenty" two, "main" none."""
    if word in _UNITS:
        return 1
    if word in _TENS:
        return 2
    return sum(c.isdigit() for c in word)


def _number_digits(words: tuple[str, ...]) -> int:
    """The digits of the number the utterance ends on, however it was written."""
    count = 0
    for word in reversed(words):
        digits = _digits(word)
        if digits == 0 and word not in _NUMBER_GLUE:
            break
        # "twenty two" is two digits, not four.
        count += 1 if word in _TENS and count else digits
    return count


def _spelled_letters(words: tuple[str, ...]) -> int:
    """How many single letters the utterance ends on ("s m i", "u a"; "a" alone is a word)."""
    count = 0
    for word in reversed(words):
        if len(word) != 1 or not word.isalpha():
            break
        count += 1
    return count


def cues(transcript: Transcript, context: str | None = None) -> frozenset[Cue]:
    """The signs in ``transcript`` of an unfinished or a finished utterance (see :class:`Cue`).

    ``context``, the assistant's previous message, tells what kind of answer is coming: a
    bare "415" answering "What's your phone number?" is a phone number in progress.
    """
    words = transcript.words
    if not words:
        return frozenset()
    found: set[Cue] = set()
    if _spelled_letters(words) >= 2:
        found.add(Cue.SPELLING)
    elif _dangles(words):
        found.add(Cue.DANGLING_WORD)
    if len(words) > 2 and words[0] in _SUBORDINATORS and words[1] in _CLAUSE_SUBJECTS:
        found.add(Cue.OPEN_CLAUSE)
    if _trails_off(words):
        found.add(Cue.FILLER)
    if all(w in _REPLY_WORDS for w in words):
        found.add(Cue.SHORT_REPLY)
    if words[0] in _QUESTION_OPENERS and Cue.OPEN_CLAUSE not in found:
        found.add(Cue.QUESTION_FORM)
    question = read_transcript(_last_sentence(context)) if context else None
    asked = frozenset(question.words) if question else frozenset()
    found.update(_entity_cues(words, set(words) | asked))
    if question and question.ending is Ending.QUESTION and Cue.SHORT_REPLY not in found:
        found.update(_answer_pending(words, asked))
    if transcript.ending is Ending.TRAILING:
        found.add(Cue.TRAILING_OFF)
    return frozenset(found)


def _dangles(words: tuple[str, ...]) -> bool:
    last = words[-1]
    if last == "so" and len(words) > 1 and words[-2] in _SO_VERBS:
        return False
    return (
        last in _CONJUNCTIONS
        or last in _PREPOSITIONS
        or last in _DETERMINERS
        or last in _AUXILIARIES
        or (last in _SUBJECTS and len(words) > 1)
        or any(words[-len(p) :] == p for p in _DANGLING_PHRASES)
    )


def _trails_off(words: tuple[str, ...]) -> bool:
    last = words[-1]
    if last == "so" and len(words) > 1 and words[-2] in _SO_VERBS:
        return False
    return last in _FILLERS or any(words[-len(p) :] == p for p in _FILLER_PHRASES)


def _last_sentence(text: str) -> str:
    sentences = [s for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s]
    return sentences[-1] if sentences else ""


def _entity_cues(words: tuple[str, ...], topic: set[str]) -> set[Cue]:
    """Numbers, addresses, dates and email addresses that are still being read out."""
    found: set[Cue] = set()
    digits = _number_digits(words)
    if digits:
        expected = next((n for nouns, n in _DIGITS_EXPECTED if nouns & topic), None)
        if expected is not None:
            found.add(Cue.NUMBER_DONE if digits >= expected else Cue.NUMBER_IN_PROGRESS)
        elif topic & _NUMBER_NOUNS and digits < 4:
            found.add(Cue.NUMBER_IN_PROGRESS)
    elif words[-1] in _MONTHS and len(words) > 1 and words[-2] in _BEFORE_A_DATE:
        found.add(Cue.DATE_IN_PROGRESS)
    if "address" in topic and any(map(_digits, words)) and not topic & _STREET_TYPES:
        found.add(Cue.ADDRESS_IN_PROGRESS)
    if topic & _EMAIL_WORDS and words[-1].rsplit(".", 1)[-1] not in _EMAIL_ENDINGS:
        found.add(Cue.EMAIL_IN_PROGRESS)
    return found


def _answer_pending(words: tuple[str, ...], asked: frozenset[str]) -> set[Cue]:
    """The assistant asked for a number or a street address (``asked``: the words of its
    question) and none of it has been said yet: "It's…", "My account is…", or a word
    the recogniser misheard, before the digits come. A refusal ("I don't have one") is an
    answer."""
    if not asked or any(w in _NEGATIONS or w.endswith("n't") for w in words):
        return set()
    said_digits = any(map(_digits, words))
    if not said_digits and asked & _ASKED_NUMBER and not asked & _EMAIL_WORDS:
        return {Cue.NUMBER_IN_PROGRESS}
    if (
        "address" in asked
        and not asked & _EMAIL_WORDS
        and not said_digits
        and not set(words) & _STREET_TYPES
    ):
        return {Cue.ADDRESS_IN_PROGRESS}
    return set()

"""Cutting streamed LLM text into pieces to speak: a short first clause, then sentences.

The first piece is short so the first audio leaves early; later pieces are whole sentences,
which Piper voices more naturally. Pieces keep their exact text (leading spaces included), so
their concatenation is the LLM's text.

Piper takes about 25 ms plus 100 ms per second of speech on one core of the development
machine, and the LLM about 15 ms a token, so every word of the first piece delays the first
audio by about 40 ms. Without punctuation early on, the first piece ends where a phrase does:
before a conjunction or an auxiliary verb after at least two words ("Two plus two | is
four.", "A spider | has eight legs."), so that it still sounds like a phrase of its own;
otherwise after four words.
"""

from __future__ import annotations

import re

# A clause ends at punctuation followed by whitespace (so "3.5" and "e.g.," mid-word stay whole).
_CLAUSE_END = re.compile(r"[,;:.!?…—](?=\s)|\n")
_SENTENCE_END = re.compile(r"[.!?…](?=\s)|\n")
FIRST_MIN_WORDS = 1
FIRST_MAX_WORDS = 4
# The first piece may end before one of these words once it has this many words.
FIRST_PHRASE_WORDS = 2
# Not prepositions: Piper voices a piece that starts with "of" or "in" weakly enough that
# Whisper heard "The capital | of France is Paris." as "The capital, the Francis Paris."
_PHRASE_STARTS = frozenset(
    word
    for group in (
        "and but or so because that which who when where while if than as is are was were",
        "has have had will would can could should may might must does do did",
    )
    for word in group.split()
)
LATER_MAX_WORDS = 30


class ClauseSplitter:
    """Feed text deltas with ``push``; take the remainder with ``flush`` at the end."""

    def __init__(self) -> None:
        self._text = ""
        self._first = True

    def push(self, delta: str) -> list[str]:
        """Add text; returns the pieces now complete."""
        self._text += delta
        pieces: list[str] = []
        while (piece := self._next()) is not None:
            pieces.append(piece)
        return pieces

    def flush(self) -> list[str]:
        """The rest of the text, if it has anything to say."""
        rest, self._text = self._text, ""
        return [rest] if rest.strip() else []

    def _cut(self, end: int) -> str:
        piece, self._text = self._text[:end], self._text[end:]
        self._first = False
        return piece

    def _next(self) -> str | None:
        text = self._text
        if self._first:
            for match in _CLAUSE_END.finditer(text):
                words = len(text[: match.end()].split())
                if words >= FIRST_MIN_WORDS or _SENTENCE_END.match(text, match.start()):
                    return self._cut(match.end())
            return self._cut_phrase() or self._cut_long(FIRST_MAX_WORDS)
        sentence = _SENTENCE_END.search(text)
        if sentence:
            return self._cut(sentence.end())
        if len(text.split()) > LATER_MAX_WORDS:
            commas = [m.end() for m in _CLAUSE_END.finditer(text)]
            if commas:
                return self._cut(commas[-1])
            return self._cut_long(LATER_MAX_WORDS)
        return None

    def _cut_phrase(self) -> str | None:
        """Cut before a word that starts a phrase, once the piece would have enough words."""
        words = list(re.finditer(r"\S+(?=\s)", self._text))
        for index in range(FIRST_PHRASE_WORDS, min(len(words), FIRST_MAX_WORDS)):
            if words[index].group().lower() in _PHRASE_STARTS:
                return self._cut(words[index - 1].end())
        return None

    def _cut_long(self, max_words: int) -> str | None:
        """Cut after ``max_words`` complete words when no punctuation came in time, as soon
        as the last of them is known to be whole (a space follows it): the first piece does
        not wait for the next word, a token later."""
        spans = [m.end() for m in re.finditer(r"\S+(?=\s)", self._text)]
        if len(spans) >= max_words:
            return self._cut(spans[max_words - 1])
        return None

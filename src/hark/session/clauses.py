"""Cutting streamed LLM text into pieces to speak: a short first clause, then sentences.

The first piece is short so the first audio leaves early; later pieces are whole sentences,
which Piper voices more naturally. Pieces keep their exact text (leading spaces included), so
their concatenation is the LLM's text.
"""

from __future__ import annotations

import re

# A clause ends at punctuation followed by whitespace (so "3.5" and "e.g.," mid-word stay whole).
_CLAUSE_END = re.compile(r"[,;:.!?…—](?=\s)|\n")
_SENTENCE_END = re.compile(r"[.!?…](?=\s)|\n")
FIRST_MIN_WORDS = 1
FIRST_MAX_WORDS = 4
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
            return self._cut_long(FIRST_MAX_WORDS)
        sentence = _SENTENCE_END.search(text)
        if sentence:
            return self._cut(sentence.end())
        if len(text.split()) > LATER_MAX_WORDS:
            commas = [m.end() for m in _CLAUSE_END.finditer(text)]
            if commas:
                return self._cut(commas[-1])
            return self._cut_long(LATER_MAX_WORDS)
        return None

    def _cut_long(self, max_words: int) -> str | None:
        """Cut after ``max_words`` complete words when no punctuation came in time."""
        spans = [m.end() for m in re.finditer(r"\S+(?=\s)", self._text)]
        if len(spans) > max_words:
            return self._cut(spans[max_words - 1])
        return None

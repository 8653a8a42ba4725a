"""hark's own limit on a reply's length, for replies whose client set none.

A client's ``max_output_tokens`` is a hard limit: the reply stops there, mid-word if need be,
and the response is ``incomplete``. When the client set none, the engine still needs a bound
(a small model may ramble), but stopping mid-sentence would be hark's doing, not the client's.
So the cap is soft: past ``soft_tokens`` the reply ends at the first sentence end. From half
the soft budget on, each sentence is held back until it ends, so that should the hard ceiling
(twice the soft budget, or what the context leaves) come first, the unfinished sentence is
dropped and the reply still ends at the last sentence end. Either way the reply is complete.
"""

from __future__ import annotations

import re

# A sentence ends at . ! ? or … (and any closing quotes or brackets) before a space and a
# word that does not begin in lower case, or at a line break; "3.14", "e.g. tau" and a list's
# "2. Apples" at the start of a line do not end one. The word after it must be seen first,
# which holds the reply one token longer.
_SENTENCE_END = re.compile(r"(?<!^\d)(?<!^\d\d)[.!?…][\"'”’)\]]*(?=\s+[^\sa-z])|\n", re.MULTILINE)
_AT_SENTENCE_END = re.compile(r"(?:[.!?…][\"'”’)\]]*|\n)\s*$")
_WORD_END = re.compile(r"\S(?=\s)")
_TAIL = 16


def hard_ceiling(soft_tokens: int) -> int:
    """The most tokens a reply with a soft budget of ``soft_tokens`` may take."""
    return 2 * soft_tokens


class SentenceCap:
    """Ends a reply at a sentence once it is past ``soft_tokens``.

    Feed it the reply as it streams (:meth:`feed`, with the tokens each piece took); it says
    what to pass on and when the reply is complete. When the model stops by itself,
    :meth:`finish` gives the text still held; when the hard ceiling stops it, :meth:`cut`
    drops the unfinished sentence (or, if that sentence began before anything was held, ends
    it at its last whole word).
    """

    def __init__(self, soft_tokens: int) -> None:
        self.soft_tokens = soft_tokens
        self.hold_from = soft_tokens // 2
        self.tokens = 0
        self.stopped = False
        self._held = ""
        # The end of the text passed on, so that a sentence end at the edge is seen.
        self._tail = ""

    def feed(self, piece: str, tokens: int = 1) -> tuple[str, bool]:
        """The text to pass on now, and whether the reply is complete (stop generating)."""
        if self.stopped:
            return "", True
        self.tokens += tokens
        if self.tokens <= self.hold_from and not self._held:
            self._pass(piece)
            return piece, False
        self._held += piece
        text = self._tail + self._held
        start = len(self._tail)
        ends = [m.end() for m in _SENTENCE_END.finditer(text) if m.end() > start]
        if not ends:
            return "", False
        if self.tokens > self.soft_tokens:
            self.stopped = True
            self._held = ""
            return text[start : ends[0]].rstrip(), True
        out, self._held = text[start : ends[-1]], text[ends[-1] :]
        self._pass(out)
        return out, False

    def finish(self) -> str:
        """The model stopped by itself: everything held back."""
        out, self._held = self._held, ""
        self.stopped = True
        return out

    def cut(self) -> str:
        """The hard ceiling was reached: what to pass on before the reply ends."""
        held, self._held = self._held, ""
        self.stopped = True
        if not self._tail or _AT_SENTENCE_END.search(self._tail):
            return ""
        text = self._tail + held
        start = len(self._tail)
        ends = [m.end() for m in _WORD_END.finditer(text) if m.end() > start]
        # Without a word end in it, the held text finishes the word already passed on.
        return text[start : ends[-1] if ends else len(text)]

    def _pass(self, text: str) -> None:
        self._tail = (self._tail + text)[-_TAIL:]

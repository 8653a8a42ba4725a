"""Text helpers for comparing what was heard with what was said."""

from __future__ import annotations

import re

WORD = r"[a-z0-9']+"
"""A word: letters, digits and apostrophes ("don't" is one word)."""


def words(text: str, *, word: str = WORD) -> list[str]:
    """The words of ``text``, lower-cased, in order: the runs that match ``word``.

    Punctuation and spacing fall away, so that transcripts compare by their words alone.
    """
    return re.findall(word, text.lower())

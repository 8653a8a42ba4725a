"""Words of a transcript lined up with the words that were said: the word error rate, and
when each word of a streamed caption arrived (the captions bench's figures).

Words compare in lower case without punctuation; the alignment is a minimum edit-distance
one, so that a word misheard, missed or added counts once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def words(text: str) -> list[str]:
    """``text`` as words to compare: lower case, without punctuation (apostrophes kept)."""
    return re.findall(r"[a-z0-9']+", text.lower().replace("’", "'"))


@dataclass(frozen=True)
class Alignment:
    """How a hypothesis lines up with a reference (a minimum edit-distance alignment).

    ``matches`` pairs the index of each reference word with the index of the hypothesis
    word that is the same word, in order.
    """

    reference_words: int
    matches: tuple[tuple[int, int], ...]
    substitutions: int
    deletions: int
    insertions: int

    @property
    def errors(self) -> int:
        """Substituted, deleted and inserted words."""
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        """The word error rate (0 for an empty reference heard as nothing)."""
        if self.reference_words == 0:
            return 0.0 if self.insertions == 0 else 1.0
        return self.errors / self.reference_words


def align(reference: Sequence[str], hypothesis: Sequence[str]) -> Alignment:
    """The alignment of ``hypothesis`` to ``reference`` with the fewest edits."""
    rows, cols = len(reference) + 1, len(hypothesis) + 1
    cost = np.zeros((rows, cols), np.int32)
    cost[:, 0] = np.arange(rows)
    cost[0, :] = np.arange(cols)
    for i in range(1, rows):
        for j in range(1, cols):
            same = reference[i - 1] == hypothesis[j - 1]
            cost[i, j] = min(
                cost[i - 1, j - 1] + (0 if same else 1), cost[i - 1, j] + 1, cost[i, j - 1] + 1
            )
    matches: list[tuple[int, int]] = []
    substitutions = deletions = insertions = 0
    i, j = rows - 1, cols - 1
    while i or j:
        if i and j and cost[i, j] == cost[i - 1, j - 1] + (reference[i - 1] != hypothesis[j - 1]):
            if reference[i - 1] == hypothesis[j - 1]:
                matches.append((i - 1, j - 1))
            else:
                substitutions += 1
            i, j = i - 1, j - 1
        elif i and cost[i, j] == cost[i - 1, j] + 1:
            deletions += 1
            i -= 1
        else:
            insertions += 1
            j -= 1
    return Alignment(len(reference), tuple(reversed(matches)), substitutions, deletions, insertions)


@dataclass(frozen=True)
class Delta:
    """A piece of caption text and when it arrived (seconds, the client's clock)."""

    at: float
    text: str


def word_arrivals(deltas: Sequence[Delta]) -> tuple[list[str], list[float]]:
    """The words of the deltas joined in order, each with when its last character arrived."""
    text = ""
    ends: list[float] = []
    for delta in deltas:
        text += delta.text
        ends.extend([delta.at] * len(delta.text))
    found: list[str] = []
    arrived: list[float] = []
    lowered = text.lower().replace("’", "'")
    for match in re.finditer(r"[a-z0-9']+", lowered):
        found.append(match.group())
        arrived.append(ends[match.end() - 1])
    return found, arrived


def caption_lags(
    reference: Sequence[str], spoken_at: Sequence[float | None], deltas: Sequence[Delta]
) -> list[float | None]:
    """For each reference word, how long after ``spoken_at`` (when its last sample was
    sent) the delta completing it arrived; ``None`` for a word the captions did not get
    right or whose time is unknown."""
    if len(spoken_at) != len(reference):
        raise ValueError(f"{len(spoken_at)} times for {len(reference)} words")
    heard, arrived = word_arrivals(deltas)
    lags: list[float | None] = [None] * len(reference)
    for ref, hyp in align(reference, heard).matches:
        said = spoken_at[ref]
        if said is not None:
            lags[ref] = arrived[hyp] - said
    return lags

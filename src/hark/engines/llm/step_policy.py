"""What the batch scheduler decodes next: a pure function of the jobs, their urgency and the time.

On a CPU a step costs about the same per token whatever the batch holds (one thread of the
development machine: one decode token 14 ms, four in one batch 53 ms), so batching does not make
the model faster; what it buys is order. A reply that has not yet said its first few words (its
"opening": the first clause, the first audio) goes before everything else, one at a time,
the one with the least work left first; replies already being spoken decode together after
them, and get a token at least every ``SPOKEN_TOKEN_GAP_S`` whatever waits, to keep ahead of
the voice; speculative replies come after replies someone waits for, and prefills last.
When the KV cache is full of running work, the least urgent job gives way.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from operator import itemgetter
from typing import Protocol, TypeVar

# A reply has said its first clause (the first audio) after about this many tokens; until then
# it is served before replies already being spoken.
OPENING_TOKENS = 8
# A reply being spoken gets a token at least this often, whatever else waits: about the pace
# of speech, so that its audio does not run dry behind a burst of new turns.
SPOKEN_TOKEN_GAP_S = 0.25


class Tier(IntEnum):
    """Urgency tiers, most urgent first."""

    OVERDUE = 0
    """A reply being spoken that has waited too long for a token."""
    OPENING = 1
    """A turn's reply that has not said its first words yet."""
    SPECULATIVE_OPENING = 2
    """A speculative reply that has not said its first words yet."""
    SPOKEN = 3
    """A reply being spoken."""
    SPECULATIVE = 4
    """A speculative reply past its first words."""
    PREFILL = 5
    """A prompt read ahead of its turn, generating nothing."""


_OPENINGS = (Tier.OPENING, Tier.SPECULATIVE_OPENING)


class Work(Protocol):
    """What the policy knows of a job."""

    @property
    def generates(self) -> bool:
        """Whether the job generates a reply (else it is a prefill)."""
        ...

    @property
    def speculative(self) -> bool:
        """Whether nobody waits for the reply yet."""
        ...

    @property
    def generated(self) -> int:
        """Tokens of reply generated so far."""
        ...

    @property
    def to_read(self) -> int:
        """Tokens the job's sequence must read next: the rest of its prompt, or 1 (the token
        just sampled)."""
        ...

    @property
    def last_served(self) -> float:
        """When (``time.monotonic``) a step last read tokens of the job, or it was admitted."""
        ...

    @property
    def order(self) -> int:
        """Arrival order: lower came first."""
        ...


W = TypeVar("W", bound=Work)


def tier(work: Work, now: float) -> Tier:
    """How urgent ``work`` is at ``now``."""
    if not work.generates:
        return Tier.PREFILL
    if work.generated < OPENING_TOKENS:
        return Tier.SPECULATIVE_OPENING if work.speculative else Tier.OPENING
    if work.speculative:
        return Tier.SPECULATIVE
    if work.to_read == 1 and now - work.last_served > SPOKEN_TOKEN_GAP_S:
        return Tier.OVERDUE
    return Tier.SPOKEN


def rank(work: Work, now: float) -> tuple[int, int, int]:
    """Sort key, most urgent first: by tier; openings by the work left before the first
    words (shortest first); then by arrival."""
    level = tier(work, now)
    left = 0
    if level in _OPENINGS:
        left = work.to_read + OPENING_TOKENS - work.generated
    return level, left, work.order


def admission_order(waiting: Iterable[W], now: float) -> list[W]:
    """The order in which waiting jobs are given a sequence: by tier, then by arrival."""
    return sorted(waiting, key=lambda w: (tier(w, now), w.order))


def least_urgent(running: Iterable[W], now: float) -> W:
    """The job that gives way when the KV cache is full: the lowest tier, the latest arrival."""
    return max(running, key=lambda w: (tier(w, now), w.order))


def next_step(running: Iterable[W], now: float, budget: int) -> list[tuple[W, int]]:
    """Which running jobs the next step decodes, and how many of their tokens each: at most
    ``budget`` tokens in all, except that an overdue reply always gets its one token and an
    opening at least one.

    An overdue reply gets its one token. Then, on a CPU where a step costs what its tokens
    cost, anything beside an opening would delay its first words: one opening at a time,
    shortest first, and nothing after it. Without an opening the others share the budget in
    order of urgency.
    """
    chosen: list[tuple[W, int]] = []
    opening = False
    # Ranked once: a step runs per token, and the tier is the rank's first part.
    for (level, _, _), work in sorted(((rank(w, now), w) for w in running), key=itemgetter(0)):
        if level == Tier.OVERDUE:
            n = 1
        elif level in _OPENINGS:
            if opening:
                continue
            opening = True
            n = min(work.to_read, max(budget, 1))
        elif opening:
            break
        else:
            n = min(work.to_read, budget)
        if n <= 0:
            continue
        chosen.append((work, n))
        budget -= n
    return chosen


def waited_for(running: Iterable[Work], now: float) -> int:
    """How many of the ``running`` jobs someone waits for: openings and overdue replies."""
    count = 0
    for work in running:
        if tier(work, now) < Tier.SPOKEN:
            count += 1
    return count


def can_wait(chosen: list[tuple[W, int]], now: float) -> bool:
    """Whether a step of ``chosen`` (as :func:`next_step` picks it, most urgent first) serves
    only work nobody waits for yet: replies already being voiced, speculative replies past
    their first words, prompts read ahead. Such a step may hold off for a while."""
    return bool(chosen) and tier(chosen[0][0], now) >= Tier.SPOKEN

"""How well an end-of-turn engine tells finished utterances from unfinished ones.

An evaluation set is a TSV file: ``text<TAB>label<TAB>split[<TAB>context]`` with ``label``
``complete`` or ``incomplete`` and ``context`` the assistant's previous message; lines
starting with ``#`` are comments. The figures that matter for turn-taking are what the
session does with the probability: whether a finished question ends fast, and whether a
speaker who pauses mid-sentence is cut off. The session's turn policy says how long it waits
after each probability and which ones end a turn fast; the caller hands both in
(``hark.session.turn_policy``'s ``silence_for`` and ``END_FAST_PROBABILITY``), as an
engine knows nothing of the session.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hark.engines.turn import EndOfTurnEngine

# A speaker who pauses this long mid-sentence must not be cut off (the example).
MID_SENTENCE_PAUSE_MS = 1200


@dataclass(frozen=True, slots=True)
class Example:
    """One utterance: what was said so far and whether the turn was over."""

    text: str
    complete: bool
    split: str = "test"
    context: str | None = None


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The figures of one run over a set of examples.

    ``accuracy``: share judged right at probability 0.5. ``fast_complete_rate``: share of
    complete utterances at or above the policy's fast probability (the session's
    ``END_FAST_PROBABILITY``: the turn ends after at most ~310 ms with eagerness auto).
    ``false_cut_rate``: share of incomplete ones at or above it, cut off fast.
    ``pause_cut_rate``: share of incomplete ones whose wait is no longer than
    ``MID_SENTENCE_PAUSE_MS``, cut off by such a pause. Latencies are wall-clock milliseconds
    per call.
    """

    examples: int
    accuracy: float
    fast_complete_rate: float
    false_cut_rate: float
    pause_cut_rate: float
    latency_p50_ms: float
    latency_p90_ms: float

    def summary(self) -> str:
        """One line for a report."""
        return (
            f"{self.examples} utterances: accuracy {self.accuracy:.3f}, complete ended fast "
            f"{self.fast_complete_rate:.3f}, incomplete cut fast {self.false_cut_rate:.3f}, "
            f"incomplete cut by a {MID_SENTENCE_PAUSE_MS} ms pause {self.pause_cut_rate:.3f}, "
            f"latency p50 {self.latency_p50_ms:.1f} ms p90 {self.latency_p90_ms:.1f} ms"
        )


def load_examples(path: str | Path) -> list[Example]:
    """The examples of an evaluation TSV file (see the module's docstring)."""
    examples = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) not in (3, 4) or fields[1] not in ("complete", "incomplete"):
            raise ValueError(f"{path}:{number}: expected text, label, split[, context]")
        context = fields[3] if len(fields) == 4 and fields[3] else None
        examples.append(Example(fields[0], fields[1] == "complete", fields[2], context))
    return examples


async def evaluate(
    engine: EndOfTurnEngine,
    examples: Sequence[Example],
    *,
    wait_ms: Callable[[float], float],
    fast_probability: float,
) -> Evaluation:
    """Score every example with ``engine``, one call at a time, and sum up. ``wait_ms`` is
    the silence the session waits before ending a turn judged complete with a probability;
    ``fast_probability`` the one at or above which it ends the turn fast."""
    if not examples:
        raise ValueError("no examples to evaluate")
    right = fast_complete = false_cut = pause_cut = 0
    latencies = []
    for example in examples:
        started = time.perf_counter()
        p = await engine.probability(example.text, context=example.context)
        latencies.append((time.perf_counter() - started) * 1000)
        right += (p >= 0.5) == example.complete
        if example.complete:
            fast_complete += p >= fast_probability
        else:
            false_cut += p >= fast_probability
            pause_cut += wait_ms(p) <= MID_SENTENCE_PAUSE_MS
    completes = sum(e.complete for e in examples)
    incompletes = len(examples) - completes
    deciles = statistics.quantiles(latencies, n=10) if len(latencies) > 1 else latencies * 9
    return Evaluation(
        examples=len(examples),
        accuracy=right / len(examples),
        fast_complete_rate=fast_complete / completes if completes else 0.0,
        false_cut_rate=false_cut / incompletes if incompletes else 0.0,
        pause_cut_rate=pause_cut / incompletes if incompletes else 0.0,
        latency_p50_ms=statistics.median(latencies),
        latency_p90_ms=deciles[8],
    )

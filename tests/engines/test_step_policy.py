"""The batch scheduler's step policy, on plain data: no model, no thread, no clock but ``now``."""

from __future__ import annotations

from dataclasses import dataclass

from hark.engines.llm.step_policy import (
    OPENING_TOKENS,
    SPOKEN_TOKEN_GAP_S,
    Tier,
    admission_order,
    can_wait,
    least_urgent,
    next_step,
    tier,
    waited_for,
)

NOW = 100.0


@dataclass
class Job:
    """What the policy sees of a job; by default a reply being spoken, just served."""

    name: str
    order: int
    generates: bool = True
    speculative: bool = False
    generated: int = OPENING_TOKENS
    to_read: int = 1
    last_served: float = NOW


def opening(name: str, order: int, to_read: int, speculative: bool = False) -> Job:
    return Job(name, order, generated=0, to_read=to_read, speculative=speculative)


def prefill(name: str, order: int, to_read: int) -> Job:
    return Job(name, order, generates=False, generated=0, to_read=to_read)


def step(jobs: list[Job], budget: int = 16) -> list[tuple[str, int]]:
    return [(job.name, n) for job, n in next_step(jobs, NOW, budget)]


def test_the_tiers() -> None:
    assert tier(opening("a", 0, 30), NOW) is Tier.OPENING
    assert tier(opening("a", 0, 30, speculative=True), NOW) is Tier.SPECULATIVE_OPENING
    assert tier(Job("a", 0), NOW) is Tier.SPOKEN
    assert tier(Job("a", 0, speculative=True), NOW) is Tier.SPECULATIVE
    assert tier(prefill("a", 0, 30), NOW) is Tier.PREFILL
    # A reply past its opening that has waited too long for its next token.
    late = Job("a", 0, last_served=NOW - SPOKEN_TOKEN_GAP_S - 0.01)
    assert tier(late, NOW) is Tier.OVERDUE
    # Still reading a prompt (re-admitted): not a token the voice waits for.
    assert tier(Job("a", 0, to_read=5, last_served=0.0), NOW) is Tier.SPOKEN
    # A speculative reply is never overdue: nobody listens to it yet.
    assert tier(Job("a", 0, speculative=True, last_served=0.0), NOW) is Tier.SPECULATIVE


def test_one_opening_at_a_time_the_shortest_first_and_nothing_beside_it() -> None:
    jobs = [
        Job("spoken", 0),
        opening("long", 1, 40),
        opening("short", 2, 12),
        prefill("prefill", 3, 100),
    ]
    assert step(jobs) == [("short", 12)]


def test_an_opening_reads_a_step_worth_of_its_prompt() -> None:
    assert step([opening("long", 0, 40)], budget=16) == [("long", 16)]
    # However small the budget, the opening moves on.
    assert step([opening("long", 0, 40)], budget=0) == [("long", 1)]


def test_a_turn_opens_before_a_speculative_reply_however_short() -> None:
    jobs = [opening("guess", 0, 2, speculative=True), opening("turn", 1, 50)]
    assert step(jobs) == [("turn", 16)]


def test_an_overdue_reply_gets_its_token_beside_an_opening() -> None:
    late = Job("late", 0, last_served=NOW - 1.0)
    jobs = [opening("turn", 1, 50), late, Job("on time", 2)]
    # Its token counts against the budget; the reply served on time waits for the opening.
    assert step(jobs, budget=16) == [("late", 1), ("turn", 15)]


def test_without_an_opening_spoken_replies_decode_together_before_speculation_and_prefills() -> (
    None
):
    jobs = [
        prefill("prefill", 0, 100),
        Job("guess", 1, speculative=True),
        Job("b", 3),
        Job("a", 2),
    ]
    assert step(jobs, budget=16) == [("a", 1), ("b", 1), ("guess", 1), ("prefill", 13)]
    # A small budget goes to the most urgent first; what is left over gets nothing.
    assert step(jobs, budget=2) == [("a", 1), ("b", 1)]


def test_admission_by_tier_then_arrival() -> None:
    jobs = [
        prefill("prefill", 0, 10),
        opening("guess", 1, 10, speculative=True),
        opening("late turn", 3, 10),
        opening("early turn", 2, 500),
    ]
    names = [job.name for job in admission_order(jobs, NOW)]
    # Unlike a step, admission does not look at the work left: arrival decides.
    assert names == ["early turn", "late turn", "guess", "prefill"]


def test_the_least_urgent_job_gives_way() -> None:
    spoken, guess = Job("spoken", 0), Job("guess", 1, speculative=True)
    assert least_urgent([spoken, guess, prefill("prefill", 2, 10)], NOW).name == "prefill"
    assert least_urgent([spoken, guess], NOW).name == "guess"
    # Within a tier, the latest arrival.
    assert least_urgent([Job("first", 0), Job("second", 1)], NOW).name == "second"


def test_openings_and_overdue_replies_are_waited_for() -> None:
    late = Job("late", 0, last_served=NOW - SPOKEN_TOKEN_GAP_S - 0.01)
    spoken, speculative = Job("spoken", 1), Job("speculative", 2, speculative=True)
    ahead = prefill("ahead", 3, 30)
    assert waited_for([spoken, speculative, ahead], NOW) == 0
    assert waited_for([spoken, opening("turn", 4, 30), ahead], NOW) == 1
    assert waited_for([late, opening("turn", 4, 30), opening("guess", 5, 9, True)], NOW) == 3
    assert waited_for([], NOW) == 0


def test_only_a_step_nobody_waits_for_can_wait() -> None:
    spoken, speculative = Job("spoken", 1), Job("speculative", 2, speculative=True)
    ahead = prefill("ahead", 3, 30)
    assert can_wait(next_step([spoken, speculative, ahead], NOW, 16), NOW)
    assert can_wait(next_step([ahead], NOW, 16), NOW)
    # A turn's first words, a guess at them, or a reply whose voice is about to run dry.
    assert not can_wait(next_step([spoken, opening("turn", 4, 30)], NOW, 16), NOW)
    assert not can_wait(next_step([opening("guess", 5, 9, True), ahead], NOW, 16), NOW)
    late = Job("late", 0, last_served=NOW - SPOKEN_TOKEN_GAP_S - 0.01)
    assert not can_wait(next_step([spoken, late], NOW, 16), NOW)
    assert not can_wait([], NOW)

"""The commit policy on recorded hypotheses: hand-written words with their times."""

from __future__ import annotations

import itertools

import pytest

from hark.engines.asr import TimedSegment, TimedTranscript, TimedWord
from hark.session.local_agreement import (
    DELAYS,
    HARD_LIMIT_S,
    LocalAgreement,
    normalise,
    text_of,
)

SPEECH = (
    "The quick brown fox jumps over the lazy dog. It was a sunny day in the park. "
    "Children played near the pond while their parents talked. "
)


def hypothesis(
    text: str, window_start: float = 0.0, start: float = 0.0, per_word: float = 0.3
) -> TimedTranscript:
    """Words ``per_word`` apart from ``start`` (turn seconds), timed from ``window_start``
    as an engine times them; one segment per sentence."""
    words = [
        TimedWord(
            f" {w}",
            start + i * per_word - window_start,
            start + (i + 1) * per_word - window_start,
            0.9,
        )
        for i, w in enumerate(text.split())
    ]
    segments: list[TimedSegment] = []
    first = 0
    for i, w in enumerate(words):
        if i == len(words) - 1 or w.word.endswith((".", "?", "!")):
            segments.append(TimedSegment(words[first].start, w.end, text_of(words[first : i + 1])))
            first = i + 1
    duration = words[-1].end if words else 0.0
    return TimedTranscript(tuple(segments), "en", duration, tuple(words))


def test_commits_what_two_hypotheses_agree_on() -> None:
    policy = LocalAgreement()
    assert policy.hypothesis(hypothesis("I want to book"), 0.0, 1.4) == []
    committed = policy.hypothesis(hypothesis("I want to buy a"), 0.0, 1.8)
    assert text_of(committed) == "I want to"
    assert text_of(policy.committed) == "I want to"


def test_a_revised_word_is_not_committed_until_it_settles() -> None:
    policy = LocalAgreement()
    policy.hypothesis(hypothesis("I want to book"), 0.0, 1.4)
    policy.hypothesis(hypothesis("I want to buy a"), 0.0, 1.8)
    # The hypotheses disagreed on the fourth word: it waits for the next one.
    assert text_of(policy.hypothesis(hypothesis("I want to buy a table"), 0.0, 2.2)) == "buy a"
    assert text_of(policy.hypothesis(hypothesis("I want to buy a tablet for"), 0.0, 2.6)) == ""
    assert text_of(policy.committed) == "I want to buy a"


def test_case_and_punctuation_do_not_count_and_the_newer_spelling_wins() -> None:
    policy = LocalAgreement()
    policy.hypothesis(hypothesis("hello world how"), 0.0, 1.0)
    committed = policy.hypothesis(hypothesis("Hello, world. How are"), 0.0, 1.3)
    assert [w.word for w in committed] == [" Hello,", " world.", " How"]
    assert normalise(" World!") == "world"


def test_more_agreement_waits_for_more_hypotheses() -> None:
    policy = LocalAgreement(agreement=DELAYS["high"].agreement)
    assert DELAYS["high"].agreement == 3
    assert policy.hypothesis(hypothesis("one two"), 0.0, 0.7) == []
    assert policy.hypothesis(hypothesis("one two three"), 0.0, 1.0) == []
    assert text_of(policy.hypothesis(hypothesis("one two three four"), 0.0, 1.3)) == "one two"


def test_words_heard_again_at_the_seam_are_not_committed_twice() -> None:
    policy = LocalAgreement()
    policy.hypothesis(hypothesis("the cat sat on"), 0.0, 1.3)
    policy.hypothesis(hypothesis("the cat sat on the"), 0.0, 1.6)
    assert text_of(policy.committed) == "the cat sat on"
    # The next window hears "on" again, timed as if it had been said after the committed one.
    again = hypothesis("on the mat", start=1.15)
    policy.hypothesis(again, 0.0, 1.9)
    policy.hypothesis(hypothesis("on the mat today", start=1.15), 0.0, 2.2)
    assert text_of(policy.committed) == "the cat sat on the mat"


def test_the_final_step_commits_the_whole_last_hypothesis() -> None:
    policy = LocalAgreement()
    policy.hypothesis(hypothesis("set a timer"), 0.0, 1.0)
    policy.hypothesis(hypothesis("set a timer for"), 0.0, 1.3)
    assert text_of(policy.committed) == "set a timer"
    last = policy.finish(hypothesis("set a timer for ten minutes."), 0.0)
    assert text_of(last) == "for ten minutes."
    assert text_of(policy.committed) == "set a timer for ten minutes."


def test_a_tail_is_read_without_committing() -> None:
    policy = LocalAgreement()
    policy.hypothesis(hypothesis("set a timer"), 0.0, 1.0)
    policy.hypothesis(hypothesis("set a timer for"), 0.0, 1.3)
    assert text_of(policy.tail(hypothesis("set a timer for ten"), 0.0)) == "for ten"
    assert text_of(policy.committed) == "set a timer"


def _monologue(seconds: float, per_word: float = 0.3) -> list[str]:
    words: list[str] = []
    while len(words) * per_word < seconds:
        words += SPEECH.split()
    return words[: int(seconds / per_word)]


@pytest.mark.parametrize("delay", ["minimal", "medium"])
def test_the_window_stays_bounded_on_a_long_turn(delay: str) -> None:
    """A 60 s turn recognised step by step: every window stays short, every word is
    committed once, in order, and the prompt carries the words before the window."""
    step = DELAYS[delay].step_s  # type: ignore[index]
    policy = LocalAgreement()
    spoken = _monologue(60.0)
    end = step
    longest = 0.0
    while end <= 60.0:
        start = policy.window_start
        longest = max(longest, end - start)
        # The decoder hears the window's complete words, and guesses the one being said.
        heard = [
            w for i, w in enumerate(spoken) if (i + 1) * 0.3 <= end and i * 0.3 >= start - 0.05
        ]
        first = round(start / 0.3)
        guess = [*heard, "uh"]
        text = " ".join(guess)
        policy.hypothesis(hypothesis(text, window_start=start, start=first * 0.3), start, end)
        if policy.window_start > start:
            assert policy.prompt()
            assert policy.prompt().split()[-1] == policy.committed[-1].word.strip() or (
                policy.window_start < policy.committed[-1].end
            )
        end += step
    # A few seconds: Whisper's cost per step stays that of a short turn's.
    assert longest <= 6.0
    assert policy.window_start > 40.0
    committed = [w.word.strip() for w in policy.committed]
    assert committed == spoken[: len(committed)]
    assert len(committed) >= len(spoken) - 10


def test_hypotheses_that_never_settle_are_committed_before_whisper_runs_out() -> None:
    policy = LocalAgreement()
    end = 0.0
    for step in range(80):
        end += 0.5
        start = policy.window_start
        # Each hypothesis disagrees with the last from its first word.
        words = [f"w{step}x{i}" for i in range(int((end - start) / 0.3))]
        policy.hypothesis(hypothesis(" ".join(words), window_start=start, start=start), start, end)
        assert end - policy.window_start <= HARD_LIMIT_S + 0.5
    assert policy.committed


def words(*timed: tuple[str, float, float]) -> TimedTranscript:
    """A hypothesis with the given words and times (the window starts at the turn's)."""
    heard = tuple(TimedWord(f" {w}", start, end, 0.9) for w, start, end in timed)
    return TimedTranscript((), "en", heard[-1].end, heard)


def test_a_word_timed_into_the_next_does_not_hide_it() -> None:
    """The decoder stretches the last whole word of a window over the one cut off at its end;
    the next window's hypothesis still gets that word, found by the words before it."""
    policy = LocalAgreement()
    policy.hypothesis(words(("what", 0.9, 1.04), ("the", 1.04, 1.18), ("cap", 1.18, 1.18)), 0, 1.2)
    policy.hypothesis(
        words(("what", 0.92, 1.12), ("the", 1.12, 1.52), ("capital", 1.52, 1.52)), 0, 1.8
    )
    assert text_of(policy.committed) == "what the" and policy.committed_end == 1.52
    later = words(
        ("what", 0.92, 1.12), ("the", 1.12, 1.4), ("capital", 1.4, 1.54), ("of", 1.54, 1.8)
    )
    assert text_of(policy.tail(later, 0.0)) == "capital of"


def test_new_words_follow_the_last_committed_ones_heard_again() -> None:
    """The window starts inside a committed word (heard cut, as another) and the last
    committed word was timed over the start of the next: the new words are those after the
    committed ones heard again, not those timed after them."""
    policy = LocalAgreement()
    policy.accept(
        words(
            ("my", 3.0, 3.2), ("neighbour", 3.2, 3.7), ("grows", 3.7, 4.0), ("beans", 4.0, 4.9)
        ).words
    )
    later = TimedTranscript(
        (),
        "en",
        2.0,
        tuple(
            TimedWord(f" {w}", start - 3.3, end - 3.3, 0.9)
            for w, start, end in (
                ("bor", 3.3, 3.7),
                ("grows", 3.7, 4.0),
                ("beans", 4.0, 4.5),
                ("and", 4.6, 4.8),
                ("peas", 4.8, 5.2),
            )
        ),
    )
    assert text_of(policy.tail(later, 3.3)) == "and peas"


def test_new_words_heard_before_a_stretched_committed_end_are_kept() -> None:
    """The last committed word was timed to its window's end, well past where it was said;
    the next hypothesis hears the committed words again with their true times, and the new
    words after them are kept, though they start before the stretched end."""
    policy = LocalAgreement()
    policy.accept(words(("read", 10.0, 10.3), ("the", 10.3, 11.6)).words)
    later = TimedTranscript(
        (),
        "en",
        3.0,
        tuple(
            TimedWord(f" {w}", start - 9.8, end - 9.8, 0.9)
            for w, start, end in (
                ("read", 10.0, 10.3),
                ("the", 10.3, 10.45),
                ("news", 10.45, 10.8),
                ("slowly", 10.8, 11.3),
            )
        ),
    )
    assert text_of(policy.tail(later, 9.8)) == "news slowly"


def test_a_hypothesis_that_loops_back_is_cut_where_it_does() -> None:
    policy = LocalAgreement()
    policy.hypothesis(words(("cancel", 15.5, 15.8), ("my", 15.8, 16.1)), 0, 16.2)
    policy.hypothesis(
        words(("cancel", 15.5, 15.8), ("my", 15.8, 16.2), ("sub", 16.2, 16.3)), 0, 16.4
    )
    looping = words(
        ("cancel", 15.5, 15.8),
        ("my", 15.8, 16.2),
        ("subscription.", 16.2, 16.8),
        ("me", 11.1, 11.3),
        ("a", 11.3, 11.5),
    )
    assert text_of(policy.finish(looping, 0.0)) == "subscription."


def test_a_long_turn_whose_steps_fall_behind_decodes_a_short_window_at_its_end() -> None:
    """A host too busy to keep up: each step comes 2.5 s of audio after the last and no two
    hypotheses agree. However long the turn, no step (the turn's last included) decodes
    much more than a short turn's audio."""
    policy = LocalAgreement()
    end, longest = 0.0, 0.0
    for step in range(16):
        end += 2.5
        start = policy.window_start
        longest = max(longest, end - start)
        words = [f"w{step}x{i}" for i in range(int((end - start) / 0.3))]
        policy.hypothesis(hypothesis(" ".join(words), window_start=start, start=start), start, end)
    assert end == 40.0
    # The window at the turn's end, and every step's, against a 5 s turn's 5 s.
    assert end - policy.window_start <= 10.0
    assert longest <= 10.5
    committed = policy.committed
    assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(committed))


def test_a_long_stretch_without_words_moves_the_window_on() -> None:
    """Hypotheses of silence or noise hold no words to commit: the window still moves on."""
    policy = LocalAgreement()
    end = 0.0
    for _ in range(12):
        end += 2.5
        start = policy.window_start
        empty = TimedTranscript((), "en", end - start, ())
        policy.hypothesis(empty, start, end)
        assert end - policy.window_start <= HARD_LIMIT_S + 2.5
    assert not policy.committed

"""hark's soft cap on a reply the client did not limit (``hark.engines.llm.reply_length``)."""

from __future__ import annotations

import re

from hark.engines.llm.reply_length import SentenceCap, hard_ceiling


def pieces(text: str) -> list[str]:
    """``text`` as a model streams it: one word (with its leading space) a token."""
    return re.findall(r"\s*\S+", text)


def run(cap: SentenceCap, text: str, ceiling: int | None = None) -> tuple[str, bool]:
    """Stream ``text`` through ``cap``; returns what was passed on and whether the cap ended
    the reply (rather than the model, or the ceiling)."""
    out = []
    for n, piece in enumerate(pieces(text), start=1):
        passed, complete = cap.feed(piece)
        out.append(passed)
        if complete:
            return "".join(out), True
        if ceiling is not None and n == ceiling:
            return "".join(out) + cap.cut(), False
    return "".join(out) + cap.finish(), False


STORY = (
    "Once upon a time there was a dragon. It lived in a cave near the sea. "
    "Every morning it flew over the village and the children waved at it. "
    "One day a knight came."
)


def test_a_reply_within_the_budget_passes_whole() -> None:
    assert run(SentenceCap(100), STORY) == (STORY, False)


def test_past_the_budget_the_reply_ends_at_the_next_sentence_end() -> None:
    # Word 10 is "It" of the second sentence: the budget ends there, the sentence goes on.
    text, complete = run(SentenceCap(10), STORY)
    assert complete
    assert text == "Once upon a time there was a dragon. It lived in a cave near the sea."


def test_at_the_hard_ceiling_the_unfinished_sentence_is_dropped() -> None:
    text = "Dragons are old. " + "They fly far and wide over every land and sea " * 5
    out, complete = run(SentenceCap(6), text, ceiling=hard_ceiling(6))
    assert not complete
    assert out == "Dragons are old."


def test_a_sentence_begun_before_anything_was_held_ends_at_a_whole_word() -> None:
    text = "Dragons fly far and wide over every land and sea " * 5
    out, _ = run(SentenceCap(6), text, ceiling=hard_ceiling(6))
    words = text.split()
    assert out.split() == words[: len(out.split())]
    # The last token might end mid-word (no space after it is seen yet): it goes too.
    assert len(out.split()) == hard_ceiling(6) - 1
    assert not out.endswith(" ")


def test_numbers_and_abbreviations_do_not_end_a_sentence() -> None:
    text = "Pi is about 3.14 and e.g. tau is 6.28 which is twice pi. That is all."
    out, complete = run(SentenceCap(3), text)
    assert complete and out == "Pi is about 3.14 and e.g. tau is 6.28 which is twice pi."


def test_pieces_that_split_words_never_end_the_reply_mid_word() -> None:
    text = "The dragon slept peacefully. Then it woke."
    cap = SentenceCap(2)
    out = []
    for ch in text:  # a token a character: the budget falls inside a word
        passed, complete = cap.feed(ch)
        out.append(passed)
        if complete:
            break
    assert "".join(out) == "The dragon slept peacefully."


def test_a_list_ends_after_an_item_not_at_the_next_ones_number() -> None:
    # SmolLM2 asked to "List ten fruits" with a budget of 24 ended at "6." before this.
    text = "Here are ten fruits:\n1. Bananas\n2. Apples\n3. Oranges\n4. Grapes\n5. Kiwis"
    items = text.split("\n")
    for budget in range(2, 12):
        out, complete = run(SentenceCap(budget), text)
        assert complete and out in ["\n".join(items[:n]) for n in range(1, len(items))]

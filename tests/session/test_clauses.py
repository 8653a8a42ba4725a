"""Cutting LLM text into speakable pieces."""

from __future__ import annotations

from hark.session.clauses import ClauseSplitter


def split(deltas: list[str]) -> list[str]:
    splitter = ClauseSplitter()
    pieces = [p for d in deltas for p in splitter.push(d)]
    return pieces + splitter.flush()


def tokens(text: str) -> list[str]:
    """Roughly how an LLM streams: word by word with leading spaces."""
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]]


def test_first_piece_is_a_short_clause_then_sentences() -> None:
    text = "Sure, the capital of France is Paris. It is a lovely city. Many people visit it."
    pieces = split(tokens(text))
    assert pieces == [
        "Sure,",
        " the capital of France is Paris.",
        " It is a lovely city.",
        " Many people visit it.",
    ]
    assert "".join(pieces) == text


def test_concatenation_is_exact_for_any_chunking() -> None:
    text = "Well, it's 3.5 degrees today; wear a coat! Also: bring an umbrella… maybe?"
    for size in (1, 2, 3, 7, len(text)):
        deltas = [text[i : i + size] for i in range(0, len(text), size)]
        assert "".join(split(deltas)) == text


def test_numbers_are_not_cut_at_the_decimal_point() -> None:
    pieces = split(tokens("The answer is 3.14159 exactly. Done."))
    assert not any(p.endswith("3.") for p in pieces)


def test_long_text_without_punctuation_is_cut_by_words() -> None:
    text = " ".join(["word"] * 50)
    pieces = split(tokens(text))
    assert len(pieces) >= 2
    assert len(pieces[0].split()) <= 8
    assert "".join(pieces) == text


def test_nothing_to_say() -> None:
    assert split(["", "  "]) == []


def test_without_early_punctuation_the_first_piece_ends_where_a_phrase_does() -> None:
    assert split(tokens("A spider has eight legs.")) == ["A spider", " has eight legs."]
    # Not before a preposition: Piper swallows a leading "of".
    assert split(tokens("The capital of France is Paris.")) == [
        "The capital of France",
        " is Paris.",
    ]
    assert split(tokens("Two plus two is four.")) == ["Two plus two", " is four."]
    # A short sentence is a piece of its own; no phrase boundary within four words: cut there.
    assert split(tokens("Bees make honey. They do.")) == ["Bees make honey.", " They do."]
    assert split(tokens("William Shakespeare wrote Romeo and Juliet."))[0] == (
        "William Shakespeare wrote Romeo"
    )
    # One word is too short a phrase: "Jupiter" alone would sound clipped.
    assert split(tokens("Jupiter is the largest planet of all."))[0] == "Jupiter is the largest"


def test_the_phrase_cut_waits_for_the_whole_next_word() -> None:
    splitter = ClauseSplitter()
    # "is" might still become "island": nothing is cut until a space follows it.
    assert splitter.push("Two plus two is") == []
    assert splitter.push(" four") == ["Two plus two"]


def test_the_four_word_cut_comes_as_soon_as_the_fourth_word_is_whole() -> None:
    splitter = ClauseSplitter()
    assert splitter.push("The capital of France") == []
    # The space of the next token ends "France": the piece goes now, not a token later.
    assert splitter.push(" is") == ["The capital of France"]
    assert splitter.push(" Paris.") == []
    assert splitter.flush() == [" is Paris."]

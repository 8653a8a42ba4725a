"""The end-of-turn engine: transcript cues and SmolLM2's judgement (the silence curve is the
session's turn policy, tests/session/test_turn_policy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hark.engines.turn import EndOfTurnEngine
from hark.engines.turn.cues import Cue, Ending, cues, read_transcript
from hark.engines.turn.evaluation import (
    MID_SENTENCE_PAUSE_MS,
    Evaluation,
    Example,
    evaluate,
    load_examples,
)
from hark.engines.turn.llama_cpp import EMPTY_PROBABILITY, LlamaCppEndOfTurn
from hark.session.turn_policy import END_FAST_PROBABILITY, silence_for
from tests.conftest import shared_end_of_turn_model

from .conftest import Say

DATA = Path(__file__).parent / "data" / "end_of_turn.tsv"

# The speaker, pausing after each group of digits, as typed and as Whisper writes it.
PHONE_PREFIXES = [
    "my phone number is four one five",
    "my phone number is four one five five five five",
    "My phone number is 415.",
    "My phone number is 415, 555,",
    "My phone number is 415-555.",
]
UM_ENDINGS = ["um", "So, um,", "My name is, uh", "I was thinking um", "Well, you know,", "Um..."]
COMPLETE_QUESTIONS = [
    "What is the capital of France?",
    "What is two plus two?",
    "what is two plus two",
    "How do I reset my password?",
    "What time is it?",
    "Why is the sky blue?",
    "Can you tell me a joke?",
]


def survives_mid_sentence_pause(probability: float) -> bool:
    """Whether eagerness auto waits out the issue's 1.2 s pause after this judgement."""
    return silence_for(probability, "auto") > MID_SENTENCE_PAUSE_MS


async def evaluate_as_session(engine: EndOfTurnEngine, examples: list[Example]) -> Evaluation:
    """The figures of ``examples`` under the session's turn policy, eagerness auto."""
    return await evaluate(
        engine,
        examples,
        wait_ms=lambda p: silence_for(p, "auto"),
        fast_probability=END_FAST_PROBABILITY,
    )


# ------------------------------------------------------------------ reading Whisper's text


def test_reading_undoes_whisper_habits() -> None:
    loop = read_transcript("How many? How many?")
    assert loop.words == ("how", "many")
    assert loop.ending is Ending.QUESTION
    trailing = read_transcript("I'm looking for...")
    assert trailing.words == ("i'm", "looking", "for")
    assert trailing.ending is Ending.TRAILING
    spelled = read_transcript("It's spelled S-M-I.")
    assert spelled.words[-3:] == ("s", "m", "i")
    assert spelled.text == "It's spelled S-M-I"
    assert read_transcript("My email is JOHN").words[-4:] == ("j", "o", "h", "n")
    assert read_transcript("  ").words == ()


@pytest.mark.parametrize(
    ("transcript", "context", "expected"),
    [
        ("My phone number is 415.", None, Cue.NUMBER_IN_PROGRESS),
        ("My phone number is 415, 555,", None, Cue.NUMBER_IN_PROGRESS),
        ("my phone number is four one five five five five", None, Cue.NUMBER_IN_PROGRESS),
        ("My phone number is 415-555-1234.", None, Cue.NUMBER_DONE),
        ("415.", "Sure. What's your phone number?", Cue.NUMBER_IN_PROGRESS),
        ("My credit card number is 4242.", None, Cue.NUMBER_IN_PROGRESS),
        ("My zip code is 94003.", None, Cue.NUMBER_DONE),
        ("My email is j o h n", None, Cue.SPELLING),
        ("My email is john dot smith at", None, Cue.EMAIL_IN_PROGRESS),
        ("The address is 123 Main.", None, Cue.ADDRESS_IN_PROGRESS),
        ("My birthday is March.", None, Cue.DATE_IN_PROGRESS),
        ("I want to book a table for", None, Cue.DANGLING_WORD),
        ("How do I", None, Cue.DANGLING_WORD),
        ("If it rains tomorrow.", None, Cue.OPEN_CLAUSE),
        ("So, um,", None, Cue.FILLER),
        ("Well, you know", None, Cue.FILLER),
        ("Thanks.", None, Cue.SHORT_REPLY),
        ("Can you help me?", None, Cue.QUESTION_FORM),
        ("I'm calling because...", None, Cue.TRAILING_OFF),
        # Asked for a number or an address, and none of it said yet (or misheard).
        ("Let me find it.", "Sure. What's your account number?", Cue.NUMBER_IN_PROGRESS),
        ("It's a tricky one.", "What is your postcode?", Cue.NUMBER_IN_PROGRESS),
        ("We live near the park.", "What's your home address?", Cue.ADDRESS_IN_PROGRESS),
        ("Sometime around June.", None, Cue.DATE_IN_PROGRESS),
    ],
)
def test_cues(transcript: str, context: str | None, expected: Cue) -> None:
    assert expected in cues(read_transcript(transcript), context)


@pytest.mark.parametrize(
    "transcript",
    ["I think so.", "Call my wife.", "What is the capital of France?", "Set a timer for 10 min."],
)
def test_finished_sentences_raise_no_unfinished_cue(transcript: str) -> None:
    unfinished = {
        Cue.DANGLING_WORD,
        Cue.OPEN_CLAUSE,
        Cue.FILLER,
        Cue.NUMBER_IN_PROGRESS,
        Cue.SPELLING,
        Cue.EMAIL_IN_PROGRESS,
        Cue.ADDRESS_IN_PROGRESS,
        Cue.DATE_IN_PROGRESS,
        Cue.TRAILING_OFF,
    }
    assert not cues(read_transcript(transcript)) & unfinished


@pytest.mark.parametrize(
    ("transcript", "context"),
    [
        ("Sure.", "What's your zip code?"),
        ("I don't know it.", "What's your account number?"),
        ("Not right now.", "Can you read me the card number?"),
        ("It's 10 Downing Street.", "What's your address?"),
        ("Yes, tomorrow morning.", "Should I call you back?"),
        ("It was my account.", "Your account number is on the invoice."),
    ],
)
def test_answers_and_refusals_are_not_answers_in_progress(transcript: str, context: str) -> None:
    pending = {Cue.NUMBER_IN_PROGRESS, Cue.ADDRESS_IN_PROGRESS}
    assert not cues(read_transcript(transcript), context) & pending


# ------------------------------------------------------------------ the evaluation set


def test_evaluation_set_is_balanced_with_a_held_out_split() -> None:
    examples = load_examples(DATA)
    assert len(examples) >= 80
    for split in ("dev", "test"):
        rows = [e for e in examples if e.split == split]
        complete = sum(e.complete for e in rows)
        assert rows and abs(2 * complete - len(rows)) <= 2
    assert any(e.context for e in examples)


def test_evaluation_set_rejects_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text("# a comment\nhello\tmaybe\tdev\n")
    with pytest.raises(ValueError, match=":2:"):
        load_examples(path)


# ------------------------------------------------------------------ the model


@pytest.fixture
def engine() -> LlamaCppEndOfTurn:
    # The run's one model (it loads on first use); each test runs on its own loop.
    return shared_end_of_turn_model()


@pytest.mark.slow
@pytest.mark.parametrize("transcript", PHONE_PREFIXES)
async def test_phone_number_prefix_is_unfinished(
    engine: LlamaCppEndOfTurn, transcript: str
) -> None:
    p = await engine.probability(transcript)
    assert survives_mid_sentence_pause(p), p


@pytest.mark.slow
async def test_digits_answering_a_phone_question_are_unfinished(
    engine: LlamaCppEndOfTurn,
) -> None:
    alone = await engine.probability("415.")
    answering = await engine.probability("415.", context="Great. What's your phone number?")
    assert answering < alone
    assert survives_mid_sentence_pause(answering), answering


@pytest.mark.slow
@pytest.mark.parametrize("transcript", UM_ENDINGS)
async def test_um_endings_are_unfinished(engine: LlamaCppEndOfTurn, transcript: str) -> None:
    p = await engine.probability(transcript)
    assert survives_mid_sentence_pause(p), p


@pytest.mark.slow
@pytest.mark.parametrize("transcript", COMPLETE_QUESTIONS)
async def test_complete_questions_end_fast(engine: LlamaCppEndOfTurn, transcript: str) -> None:
    p = await engine.probability(transcript)
    assert p >= END_FAST_PROBABILITY, p


@pytest.mark.slow
async def test_full_phone_number_ends_fast(engine: LlamaCppEndOfTurn) -> None:
    assert await engine.probability("My phone number is 415-555-1234.") >= END_FAST_PROBABILITY


@pytest.mark.slow
async def test_no_words_waits_a_while(engine: LlamaCppEndOfTurn) -> None:
    judgement = await engine.judge(" ")
    assert judgement.probability == EMPTY_PROBABILITY
    assert judgement.end_log_probability is None


@pytest.mark.slow
async def test_judgement_shows_its_evidence(engine: LlamaCppEndOfTurn) -> None:
    question = await engine.judge("What is two plus two?")
    dangling = await engine.judge("I want to book a table for")
    assert question.end_log_probability is not None
    assert dangling.end_log_probability is not None
    # The model alone already prefers the question as a finished message.
    assert question.end_log_probability > dangling.end_log_probability
    assert Cue.DANGLING_WORD in dangling.cues


@pytest.mark.slow
async def test_scores_do_not_depend_on_the_previous_call(engine: LlamaCppEndOfTurn) -> None:
    # The engine keeps the model's state between calls; a stale state would shift scores.
    first = await engine.judge("Where is the nearest pharmacy?")
    await engine.judge("My phone number is 415-555.")
    await engine.judge("Where is the nearest")
    again = await engine.judge("Where is the nearest pharmacy?")
    # On the development VM the two scores came out identical. Reusing a cached prefix can
    # change how llama.cpp splits its matrix products (the new tokens alone, or the whole
    # prompt), so another machine's SIMD paths may round them differently: float32 noise,
    # far below 1e-3 in log probability, while a stale state shifts a score by tenths.
    assert again.end_log_probability == pytest.approx(first.end_log_probability, abs=1e-3)


def test_window_must_hold_a_token() -> None:
    with pytest.raises(ValueError, match="window_tokens"):
        LlamaCppEndOfTurn(window_tokens=0)


@pytest.mark.slow
async def test_held_out_typed_utterances(engine: LlamaCppEndOfTurn) -> None:
    held_out = [e for e in load_examples(DATA) if e.split == "test"]
    result = await evaluate_as_session(engine, held_out)
    print(result.summary())
    assert result.accuracy >= 0.9
    assert result.false_cut_rate <= 0.05
    assert result.pause_cut_rate <= 0.15
    assert result.fast_complete_rate >= 0.7


# Spoken by Piper and transcribed by Whisper, as the session will see them.
SPOKEN = [
    Example("What is the capital of France?", True),
    Example("How do I reset my password?", True),
    Example("Set a timer for ten minutes.", True),
    Example("Can you recommend a good book?", True),
    Example("I'd like to cancel my subscription.", True),
    Example("My phone number is four one five five five five one two three four.", True),
    Example("my phone number is four one five", False),
    Example("my phone number is four one five five five five", False),
    Example("i want to book a table for", False),
    Example("i was wondering if", False),
    Example("my credit card number is four two four two", False),
    Example("so what i'm trying to say is", False),
]


@pytest.mark.slow
async def test_whisper_transcripts_of_speech(engine: LlamaCppEndOfTurn, say: Say) -> None:
    from hark.engines.asr import AudioToTranscribe
    from hark.engines.asr.whisper import WhisperAsr

    asr = WhisperAsr()
    heard = []
    for example in SPOKEN:
        text = "".join(
            [d async for d in asr.transcribe(AudioToTranscribe(say(example.text), language="en"))]
        )
        heard.append(Example(text, example.complete))
    result = await evaluate_as_session(engine, heard)
    print(result.summary(), [e.text for e in heard])
    assert result.accuracy >= 0.8
    assert result.pause_cut_rate == 0.0
    for example in heard[6:8]:
        assert survives_mid_sentence_pause(await engine.probability(example.text)), example

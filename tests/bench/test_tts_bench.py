"""``hark bench tts``: its options, how words compare, and one short run of both engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hark.bench.tts import SENTENCES, compared
from hark.cli import main
from tests.speech import SENTENCES as TEST_SENTENCES


@pytest.mark.parametrize(
    "options",
    [["--engines", "espeak"], ["--engines", ""], ["--runs", "0"], ["--sentences", "0"]],
)
def test_bad_options_are_refused(options: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tts", *options]) == 2
    assert "hark bench tts:" in capsys.readouterr().err


def test_numbers_compare_digit_by_digit() -> None:
    assert compared("My number is four one five, five five five.") == compared(
        "My number is 415-555."
    )
    assert compared("Set a timer for ten minutes.") == compared("Set a timer for 10 minutes")
    assert compared("four one five") != compared("416")


def test_the_sentences_are_those_the_tests_hear() -> None:
    # Every one, in order; the tests add only the backchannels said over a reply.
    assert TEST_SENTENCES[: len(SENTENCES)] == SENTENCES
    assert set(TEST_SENTENCES) - set(SENTENCES) == {"Uh-huh.", "Yeah."}


@pytest.mark.slow
def test_a_short_run_of_both_engines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report_path = tmp_path / "tts.json"
    options = ["--sentences", "3", "--runs", "2", "--json", str(report_path)]
    assert main(["bench", "tts", *options]) == 0
    report = json.loads(report_path.read_text())
    # Alternating: the engine that went second goes first in the next run.
    assert [(row["run"], row["engine"]) for row in report["rows"]] == [
        (1, "piper"),
        (1, "hibari"),
        (2, "hibari"),
        (2, "piper"),
    ]
    for row in report["rows"]:
        # Whisper hears both voices' first three sentences nearly word for word.
        assert row["sentences"] == 3 and row["exact"] >= 2 and row["wer"] < 0.2
        assert row["cpu_rtf_p50"] > 0 and row["wall_rtf_p50"] > 0
        assert row["audio_s"] > 3
    assert set(report["load_s"]) == {"piper", "hibari"}
    assert "hibari" in capsys.readouterr().out

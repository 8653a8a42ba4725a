"""`hark bench captions`: word alignment, caption lag and WER on made-up timelines, the
monologues, and a run against `hark serve --engines fake`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hark.bench.captions import (
    CaptionsBenchConfig,
    CaptionsReport,
    CaptionTurn,
    LengthCpu,
    ReplyTurn,
    format_summary,
)
from hark.bench.monologues import SENTENCE_GAP_S, first_voiced_sample, monologues
from hark.bench.spoken_questions import RATE, cache_path, last_voiced_sample, write_question
from hark.bench.word_alignment import Delta, align, caption_lags, word_arrivals, words
from tests.speech import spoken

pytestmark = pytest.mark.realtime

# --- words, alignment, word error rate ------------------------------------------------------


def test_words_are_compared_without_case_or_punctuation() -> None:
    said = "I’d like THAT, please... Twenty-two?"
    assert words(said) == ["i'd", "like", "that", "please", "twenty", "two"]


def test_alignment_counts_each_kind_of_error() -> None:
    alignment = align(["a", "b", "c", "d"], ["a", "x", "c", "d", "e"])
    assert alignment.matches == ((0, 0), (2, 2), (3, 3))
    assert (alignment.substitutions, alignment.deletions, alignment.insertions) == (1, 0, 1)
    assert alignment.wer == 0.5
    missing = align(["a", "b", "c"], ["c"])
    assert missing.matches == ((2, 0),)
    assert (missing.deletions, missing.wer) == (2, 2 / 3)
    assert align([], []).wer == 0.0
    assert align([], ["noise"]).wer == 1.0


def test_a_word_arrives_with_the_delta_that_completes_it() -> None:
    deltas = [Delta(1.0, "The qui"), Delta(1.5, "ck bro"), Delta(2.0, "wn, fox"), Delta(2.5, ".")]
    assert word_arrivals(deltas) == (["the", "quick", "brown", "fox"], [1.0, 1.5, 2.0, 2.0])


def test_caption_lag_is_from_the_word_sent_to_its_delta() -> None:
    reference = ["the", "quick", "brown", "fox", "jumps", "high"]
    spoken_at = [0.2, 0.5, 0.9, None, 1.4, 1.7]
    # "jumps" is misheard; "fox" has no time in the audio; "high" is never captioned.
    deltas = [Delta(1.0, "The quick"), Delta(1.5, " brown fox"), Delta(2.25, " jumped")]
    assert caption_lags(reference, spoken_at, deltas) == pytest.approx(
        [0.8, 0.5, 0.6, None, None, None]
    )
    with pytest.raises(ValueError):
        caption_lags(reference, spoken_at[:-1], deltas)


def turn(
    length: float, deltas: list[tuple[float, str]], transcript: str, spoken_ms: list[float]
) -> CaptionTurn:
    result = CaptionTurn(
        speaker=0,
        length_s=length,
        duration_s=length,
        reference="One two three four.",
        word_spoken_ms=list(spoken_ms),
        deltas=deltas,
        transcript=transcript,
        speech_end_ms=spoken_ms[-1],
    )
    result.compute()
    return result


def test_a_report_summarises_lag_wer_cpu_and_v2v_per_length() -> None:
    spoken_ms = [100.0, 300.0, 500.0, 700.0]
    short = turn(5, [(400.0, "One two"), (1200.0, " three four")], "One two three four.", spoken_ms)
    assert short.lags_ms == [300.0, 100.0, 700.0, 500.0]
    assert (short.wer, short.errors) == (0.0, 0)
    long = turn(40, [(2000.0, "one two tree")], "One two tree.", spoken_ms)
    assert long.lags_ms == [1900.0, 1700.0, None, None]
    assert (long.wer, long.errors) == (0.5, 2)
    report = CaptionsReport(
        config=CaptionsBenchConfig(url="ws://127.0.0.1:1", lengths_s=(5.0, 40.0)),
        captions=[short, long],
        replies=[
            ReplyTurn(0, 5.0, "heard", 600.0),
            ReplyTurn(0, 40.0, "heard", 650.0),
            ReplyTurn(0, 40.0, "timeout"),
        ],
        cpu=[LengthCpu(5.0, 3.0, 6.0, 5.0), LengthCpu(40.0, 20.0, 44.0, 40.0)],
        baseline_cores=0.25,
        started_at=0.0,
        duration_s=100.0,
    )
    summary = report.summary()
    five, forty = summary["by_length"]["5"], summary["by_length"]["40"]
    assert five["caption_lag_ms"] == {"p50": 400.0, "p95": 670.0}
    assert five["deltas_before_speech_end"] == 1
    assert (five["wer"], forty["wer"]) == (0.0, 0.5)
    # The server's CPU less its idle rate over the window, per second said.
    assert five["asr_cpu_s_per_speech_s"] == pytest.approx((3.0 - 0.25 * 6.0) / 5.0)
    assert forty["asr_cpu_s_per_speech_s"] == pytest.approx((20.0 - 0.25 * 44.0) / 40.0)
    assert (forty["replies"], forty["replies_heard"], forty["v2v_ms"]["p50"]) == (2, 1, 650.0)
    assert (forty["words"], forty["captioned_words"]) == (4, 2)
    assert summary["caption_lag_ms"]["p50"] == 600.0
    rows = {line.split()[0]: line.split()[2:] for line in format_summary(report).splitlines()}
    assert rows["5"] == ["400", "670", "4/4", "0.0%", "0.300", "600", "600"]
    assert rows["40"] == ["1800", "1890", "2/4", "50.0%", "0.225", "650", "650"]
    assert json.loads(json.dumps(report.to_json()))["summary"] == summary


def test_without_the_servers_cpu_there_is_no_cpu_figure() -> None:
    report = CaptionsReport(
        config=CaptionsBenchConfig(url="ws://127.0.0.1:1", lengths_s=(5.0,)),
        captions=[turn(5, [], "", [100.0, 200.0, 300.0, 400.0])],
        replies=[],
        cpu=[],
        baseline_cores=None,
        started_at=0.0,
        duration_s=10.0,
    )
    row = report.summary()["by_length"]["5"]
    assert row["asr_cpu_s_per_speech_s"] is None
    assert row["caption_lag_ms"] == {"p50": None, "p95": None}
    assert row["wer"] == 1.0


# --- monologues ------------------------------------------------------------------------------

SENTENCES = ("Turn off the lights in the kitchen.", "Set a timer for ten minutes.")


def cached_sentences(directory: Path, texts: tuple[str, ...] = SENTENCES) -> None:
    """The recorded sentences where the bench looks for Piper's (no synthesis)."""
    for text in texts:
        write_question(cache_path(directory, text), spoken(text, RATE))


def test_first_voiced_sample() -> None:
    pcm = np.zeros(4800, np.int16)
    pcm[1000:2000] = (3000 * np.sin(np.arange(1000) * 0.2)).astype(np.int16)
    frame = RATE // 100
    assert 1000 - frame < first_voiced_sample(pcm, RATE) <= 1000
    assert first_voiced_sample(np.zeros(100, np.int16), RATE) == 100


async def test_a_monologue_is_trimmed_sentences_a_gap_apart_with_their_word_times(
    tmp_path: Path,
) -> None:
    cached_sentences(tmp_path)
    # Word times as the cache keeps them, so that no model runs here.
    stored: dict[str, list[float | None]] = {
        SENTENCES[0]: [0.2, 0.35, 0.5, 0.8, 0.9, 1.0, None],
        SENTENCES[1]: [0.1, 0.2, 0.6, 0.7, 0.9, 1.3],
    }
    for text, ends in stored.items():
        path = cache_path(tmp_path, text).with_suffix(".words1.json")
        path.write_text(json.dumps({"text": text, "word_ends": ends}))
    said = await monologues([0.5, 100.0], SENTENCES, cache_dir=tmp_path)
    one = said[0.5]
    assert one.text == SENTENCES[0]
    assert one.word_ends == tuple(stored[SENTENCES[0]])
    first = spoken(SENTENCES[0], RATE)
    voiced = last_voiced_sample(first, RATE) + 1 - first_voiced_sample(first, RATE)
    gap = round(SENTENCE_GAP_S * RATE)
    assert len(one.pcm) == voiced + gap
    assert one.last_voiced == voiced - 1
    assert not one.pcm[voiced:].any()
    long = said[100.0]
    assert long.duration_s >= 100.0
    # The sentences come round again in order, each starting after the one before and its gap.
    assert long.text.startswith(" ".join(SENTENCES * 2))
    second_start = (voiced + gap) / RATE
    assert long.word_ends[7:13] == pytest.approx(
        [second_start + t for t in stored[SENTENCES[1]] if t is not None]
    )


# --- against `hark serve --engines fake` ---------------------------------------------------


@pytest.mark.slow
def test_command_against_a_fake_server(tmp_path: Path) -> None:
    """The bench starts its own `hark serve --engines fake`, times the words with the
    embedded Whisper, and reports figures that follow from the events it recorded."""
    sentence = "What is the capital of France?"
    cache = tmp_path / "xdg" / "hark" / "bench"
    cached_sentences(cache, (sentence,))
    text = tmp_path / "monologue.txt"
    text.write_text(sentence + "\n")
    report_path = tmp_path / "captions.json"
    env = {k: v for k, v in os.environ.items() if k != "HARK_API_KEYS"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    command = [
        sys.executable,
        "-m",
        "hark.cli",
        "bench",
        "captions",
        "--engines",
        "fake",
        "--speakers",
        "2",
        "--seconds",
        "1,3",
        "--baseline-s",
        "1",
        "--text",
        str(text),
        "--json",
        str(report_path),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("hark bench captions: 2 speakers")
    report = json.loads(report_path.read_text())
    assert report["benchmark"] == "captions"
    assert report["parameters"]["lengths_s"] == [1.0, 3.0]
    captions = report["captions"]
    assert sorted((t["length_s"], t["speaker"]) for t in captions) == [
        (1.0, 0),
        (1.0, 1),
        (3.0, 0),
        (3.0, 1),
    ]
    for recorded in captions:
        reference = words(recorded["reference"])
        # Whisper placed every word of the sentence, in order, within what was sent.
        spoken_ms = recorded["word_spoken_ms"]
        assert None not in spoken_ms
        assert spoken_ms == sorted(spoken_ms)
        assert spoken_ms[-1] <= recorded["speech_end_ms"] + 20
        assert recorded["deltas"], "no caption came"
        deltas = [Delta(at, piece) for at, piece in recorded["deltas"]]
        lags = caption_lags(reference, spoken_ms, deltas)
        assert recorded["lags_ms"] == [None if lag is None else pytest.approx(lag) for lag in lags]
        assert recorded["wer"] == pytest.approx(
            align(reference, words(recorded["transcript"])).wer, abs=1e-4
        )
    # The fake recogniser hears exactly this sentence, which the 1 s monologue is.
    short = [t for t in captions if t["length_s"] == 1.0]
    assert all(t["reference"] == sentence and t["wer"] == 0 for t in short)
    assert all(None not in t["lags_ms"] for t in short)
    summary = report["summary"]["by_length"]
    assert summary["1"]["captioned_words"] == 2 * len(words(sentence))
    assert summary["1"]["wer"] == 0
    baseline = report["summary"]["baseline_cpu_cores"]
    assert baseline is not None
    for length, row in summary.items():
        windows = [c for c in report["cpu"] if f"{c['length_s']:g}" == length]
        used = sum(c["cpu_s"] - baseline * c["wall_s"] for c in windows)
        speech = sum(c["speech_s"] for c in windows)
        assert row["asr_cpu_s_per_speech_s"] == pytest.approx(used / speech, abs=2e-3)
        assert row["replies"] == row["replies_heard"] == 2
        assert row["v2v_ms"]["p50"] > 0
    assert [r["status"] for r in report["replies"]] == ["heard"] * 4

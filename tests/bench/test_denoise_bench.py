"""``hark bench denoise``: its options, and one short run on the recorded questions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hark.bench.denoise import mix, noise
from hark.bench.spoken_questions import QUESTIONS, RATE
from hark.cli import main
from tests.speech import spoken


@pytest.mark.parametrize(
    "options",
    [["--noises", "traffic"], ["--snrs", "ten"], ["--questions", "0"], ["--snrs", ","]],
)
def test_bad_options_are_refused(options: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "denoise", *options]) == 2
    assert "hark bench denoise:" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["white", "pink"])
def test_noise_is_mixed_at_the_snr_asked(kind: str) -> None:
    speech = spoken(QUESTIONS[0], RATE)
    noisy = mix(speech, noise(kind, len(speech), seed=0), snr_db=5.0)
    added = noisy.astype(np.float64) - speech
    ratio = np.mean(speech.astype(np.float64) ** 2) / np.mean(added**2)
    assert 10 * np.log10(ratio) == pytest.approx(5.0, abs=0.1)


@pytest.mark.slow
def test_a_short_run_reports_each_mode(
    tmp_path: Path,
    recorded_questions: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The recorded questions, where the bench looks for them: nothing is synthesised.
    monkeypatch.setenv("XDG_CACHE_HOME", str(recorded_questions.parent.parent))
    report_path = tmp_path / "denoise.json"
    options = ["--questions", "2", "--snrs", "10", "--noises", "white", "--json", str(report_path)]
    assert main(["bench", "denoise", *options]) == 0
    report = json.loads(report_path.read_text())
    assert [(row["noise"], row["snr_db"]) for row in report["rows"]] == [
        ("clean", None),
        ("white", 10.0),
    ]
    for row in report["rows"]:
        assert {"wer_off", "wer_near_field", "wer_far_field"} <= set(row)
    # Whisper hears the clean recordings nearly word for word.
    assert report["rows"][0]["wer_off"] < 0.2
    assert report["denoiser_cpu_s_per_audio_s"] > 0
    assert "far_field" in capsys.readouterr().out

"""The benchmarks' spoken questions, from the committed recordings instead of Piper."""

from __future__ import annotations

from pathlib import Path

import pytest

from hark.bench.spoken_questions import QUESTIONS, RATE, cache_path, write_question
from tests.speech import spoken


@pytest.fixture(scope="session")
def recorded_questions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A question cache holding every benchmark question, recorded (tests/data/speech).

    It lies where the commands look with ``XDG_CACHE_HOME`` set to its grandparent, so no
    benchmark in the tests synthesises anything.
    """
    directory = tmp_path_factory.mktemp("xdg-cache") / "hark" / "bench"
    for text in QUESTIONS:
        write_question(cache_path(directory, text), spoken(text, RATE))
    return directory

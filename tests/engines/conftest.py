"""Spoken fixtures for the engine tests: real speech that Piper said once, at 16 kHz."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from tests.speech import spoken_float

QUESTION = "What is the capital of France?"

Say = Callable[[str], npt.NDArray[np.float32]]


@pytest.fixture(scope="session")
def say() -> Say:
    """Speaks a text (one of ``tests.speech.SENTENCES``); mono float32 at 16 kHz.

    The samples come from committed WAV files, so they are the same in every run and no
    test needs Piper to make its input.
    """
    return spoken_float


@pytest.fixture(scope="session")
def question(say: Say) -> npt.NDArray[np.float32]:
    """The question ``QUESTION``, spoken (about 1.7 s)."""
    return say(QUESTION)

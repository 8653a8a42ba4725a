"""The process-wide count of model calls computing now."""

from __future__ import annotations

import threading

import pytest

from hark.engines.activity import computing, computing_now, marked


def test_calls_are_counted_while_they_run_in_any_thread() -> None:
    assert computing_now() == 0
    inside = threading.Event()
    release = threading.Event()

    def model_call() -> str:
        inside.set()
        release.wait(5)
        return "done"

    results: list[str] = []
    thread = threading.Thread(target=lambda: results.append(marked(model_call)()))
    thread.start()
    assert inside.wait(5)
    with computing():
        assert computing_now() == 2
    assert computing_now() == 1
    release.set()
    thread.join(5)
    assert results == ["done"]
    assert computing_now() == 0


def test_a_failing_call_is_no_longer_counted() -> None:
    def broken() -> None:
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError):
        marked(broken)()
    assert computing_now() == 0

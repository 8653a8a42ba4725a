"""Which model calls are computing in this process right now.

On a small CPU a model call that could spread over every core (the LLM reading a prompt) is
only faster when nothing else computes. When two calls spread threads over the same cores,
both get slower: llama.cpp's threads wait for each other at every layer. On the 2-core
development machine, reading a 13-token prompt took 84 ms on two threads and 121 ms on one
when alone, but 137 ms on two threads with the end-of-turn model running beside it.

Engines run their model calls inside :func:`computing`; :func:`computing_now` tells how many
are running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")


class _Count:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value = 0


_RUNNING = _Count()


@contextmanager
def computing() -> Iterator[None]:
    """Mark a model call for as long as it runs (any thread)."""
    with _RUNNING.lock:
        _RUNNING.value += 1
    try:
        yield
    finally:
        with _RUNNING.lock:
            _RUNNING.value -= 1


def computing_now() -> int:
    """How many marked model calls are running."""
    return _RUNNING.value


def marked(call: Callable[_P, _T]) -> Callable[_P, _T]:
    """``call``, run inside :func:`computing` (to hand to a thread)."""

    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with computing():
            return call(*args, **kwargs)

    return run

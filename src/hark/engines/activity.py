"""Which model calls are computing in this process right now, and which of them someone waits for.

On a small CPU a model call that could spread over every core (the LLM reading a prompt,
Piper voicing a reply's first piece) is only faster when nothing else computes. When two calls
spread threads over the same cores, both get slower: llama.cpp's and ONNX Runtime's threads
wait for each other. On the 2-core development machine, reading a 13-token prompt took 84 ms
on two threads and 121 ms on one when alone, but 137 ms on two threads with the end-of-turn
model running beside it; Piper voiced a 4-word piece in 68 ms on two threads and 116 ms on
one when alone, but 154 ms on two threads beside one busy thread.

Engines run their model calls inside :func:`computing`; :func:`computing_now` tells how many
are running. The LLM's batch scheduler is not counted there: it computes step by step, and
says through a :class:`Waited` how many of its jobs someone waits for (a reply's first words,
a reply whose audio runs dry). The rest of its work (replies already being voiced, prompts
read ahead of their turn) can wait a little: while an :func:`urgent` call runs on every core,
its steps :func:`hold_off`.
"""

from __future__ import annotations

import threading
import time
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
_WAITED = _Count()


class _Urgent:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.value = 0
        # When (time.monotonic) the latest urgent call began: what holds off waits for it no
        # longer than its bound.
        self.since = 0.0


_URGENT = _Urgent()


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


def marked(call: Callable[_P, _T], *, waited_for: bool = False) -> Callable[_P, _T]:
    """``call``, run inside :func:`computing` (to hand to a thread); ``waited_for``: someone
    waits for its result (a turn's verdict), counted with :func:`waited_for_now` meanwhile."""

    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with computing():
            if not waited_for:
                return call(*args, **kwargs)
            with _WAITED.lock:
                _WAITED.value += 1
            try:
                return call(*args, **kwargs)
            finally:
                with _WAITED.lock:
                    _WAITED.value -= 1

    return run


class Waited:
    """What one step-by-step engine (the LLM's batch scheduler) publishes: how many of its
    running jobs someone waits for. Set it at every step; only a change takes the lock."""

    def __init__(self) -> None:
        self._jobs = 0

    def set(self, jobs: int) -> None:
        """``jobs`` of this engine's running jobs are waited for now (0 when it idles)."""
        if jobs != self._jobs:
            with _WAITED.lock:
                _WAITED.value += jobs - self._jobs
            self._jobs = jobs


def waited_for_now() -> int:
    """How many jobs someone waits for: step-by-step engines' and :func:`marked` calls'."""
    return _WAITED.value


def someone_waits_now() -> bool:
    """Whether a model computes what someone waits for: a job :func:`waited_for_now`
    counts, or an :func:`urgent` call. Work that only tidies up (the times of words already
    delivered) waits meanwhile."""
    return _WAITED.value > 0 or _URGENT.value > 0


def spreads(computing: int, waited_for: int) -> bool:
    """Whether a call someone waits for, one of the ``computing`` calls running, should spread
    over every core: when it computes alone, beside at most one LLM job someone waits for.

    That one job is, but for a coincidence of two sessions, the reply whose first piece the
    call voices: the first piece is cut after about five tokens, and the LLM keeps a reply
    first in line for eight (:data:`hark.engines.llm.step_policy.OPENING_TOKENS`), so it
    still decodes a few tokens beside the call before its steps hold off. Two such jobs mean
    another session waits for the LLM: then the call stays on its own threads."""
    return computing <= 1 and waited_for <= 1


@contextmanager
def urgent() -> Iterator[None]:
    """Mark a call someone waits for in silence that runs on every core, for as long as it
    runs: work that can wait :func:`hold_off` meanwhile."""
    with _URGENT.cond:
        _URGENT.value += 1
        _URGENT.since = time.monotonic()
    try:
        yield
    finally:
        with _URGENT.cond:
            _URGENT.value -= 1
            if not _URGENT.value:
                _URGENT.cond.notify_all()


def urgent_now() -> int:
    """How many urgent calls are running."""
    return _URGENT.value


def hold_off(limit_s: float, stop: Callable[[], bool]) -> None:
    """Wait while an urgent call runs, for at most ``limit_s`` from when the latest one began
    (a call that runs long, or hangs, holds nothing for longer), or until ``stop()`` says
    that more pressing work came (checked again after each :func:`wake_holders`)."""
    with _URGENT.cond:
        until = _URGENT.since + limit_s
        while _URGENT.value and not stop():
            left = until - time.monotonic()
            if left <= 0:
                return
            _URGENT.cond.wait(left)


def wake_holders() -> None:
    """Have what waits in :func:`hold_off` look at its ``stop`` again."""
    with _URGENT.cond:
        _URGENT.cond.notify_all()

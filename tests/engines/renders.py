"""Counting what a sentence-at-a-time TTS engine (Piper, hibari) renders."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

import pytest

# A bound on a hang, not a measure.
LIVENESS_S = 30.0


class CountingRenders:
    """Counts the sentences a model renders (by wrapping ``model.render``, the method named)
    and keeps every call handed to the engine's workers (``queue``, a ``DueFirstScheduler``),
    so that a test can wait for all of them to be over."""

    def __init__(
        self, model: Any, render: str, queue: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.count = 0
        self.calls: list[concurrent.futures.Future[Any]] = []
        original = getattr(model, render)
        submit = queue.submit

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(*args, **kwargs)

        def kept(due: float, call: Callable[[], Any]) -> concurrent.futures.Future[Any]:
            future = submit(due, call)
            self.calls.append(future)
            return future

        monkeypatch.setattr(model, render, counted)
        monkeypatch.setattr(queue, "submit", kept)

    async def settled(self) -> None:
        """Wait until every call handed to the workers has run or been dropped."""
        _, running = await asyncio.to_thread(concurrent.futures.wait, self.calls, LIVENESS_S)
        assert not running, "a render never ended"

"""Batching across sessions: one model call per tick for every stream of the process.

A model that sessions call once per audio chunk (Silero VAD: a 32 ms chunk each) spends most
of a single-row call on fixed overhead. ``Batcher`` gathers the items that sessions submit
within a short window and runs them through the model as one batch in its own thread; each
caller awaits its own row's result. A batch leaves when it is full or when its oldest item
has waited ``max_wait_ms``, whichever comes first, so no item waits on a slow or silent
session; and at once when, at the recent rate of arrivals, nobody else would join it in
time, so that a lightly loaded process adds no wait at all. ``BatchedSileroVad`` is the
Silero VAD on top of it, a drop-in ``VadEngine``.

The deadline is kept by the batcher's thread, not by the event loop, so a busy loop does
not hold batches back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from hark.engines.vad.silero import (
    CHUNK_SAMPLES,
    CONTEXT_SAMPLES,
    SAMPLE_RATE,
    STATE_SIZE,
    SileroVad,
    run_batch,
)

T = TypeVar("T")
R = TypeVar("R")

# A 32 ms VAD chunk that waits 5 ms costs little latency, and at 200 sessions (6 250 chunks
# a second) 5 ms gathers batches of about 30 rows, where Silero's cost per row bottoms out.
DEFAULT_MAX_WAIT_MS = 5.0
DEFAULT_MAX_BATCH = 256
# The arrival rate is measured over windows at least this long.
_RATE_WINDOW_S = 0.1


class BatchObserver(Protocol):
    """Told about every batch the batcher runs (called in the batcher's thread)."""

    def batch(self, size: int, wait_s: float, run_s: float, backlog: int) -> None:
        """``size`` rows ran for ``run_s``; the oldest had waited ``wait_s`` before the run;
        ``backlog`` items were left waiting for the next batch."""
        ...


class BatcherClosedError(RuntimeError):
    """The batcher was closed: it takes no new items and fails the ones still waiting."""


@dataclass(slots=True)
class _Entry(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    loop: asyncio.AbstractEventLoop
    enqueued: float


class Batcher(Generic[T, R]):
    """Runs the items of many callers through one blocking function, a batch at a time.

    ``run`` takes a list of items and returns one result per item, in order; it runs in the
    batcher's own thread (start on first use), so it should release the GIL for its heavy
    part, as ONNX Runtime does. An exception from ``run`` fails every item of that batch.
    Callers on any event loop may submit; each result is delivered on the caller's loop.
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
        name: str = "batcher",
        observer: BatchObserver | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must not be negative, got {max_wait_ms}")
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self.name = name
        self.observer = observer
        self._run = run
        self._pending: deque[_Entry[T, R]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False
        # Arrivals per second, to judge whether waiting for more items is worth it.
        self._rate = 0.0
        self._arrivals = 0
        self._rate_since = time.monotonic()

    @property
    def pending(self) -> int:
        """Items waiting for a batch (not counting the batch running now)."""
        return len(self._pending)

    async def submit(self, item: T) -> R:
        """Run ``item`` in the next batch and return its result.

        Cancelling the call drops the item if its batch has not started yet, and otherwise
        discards its result. Raises ``BatcherClosedError`` once the batcher is closed.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        with self._cond:
            if self._closed:
                raise BatcherClosedError(f"the {self.name} batcher is closed")
            self._pending.append(_Entry(item, future, loop, time.monotonic()))
            self._arrivals += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name=f"hark-{self.name}-batcher", daemon=True
                )
                self._thread.start()
            count = len(self._pending)
            # The thread sleeps either until there is work (first item) or until the
            # deadline; only these two events can change what it does.
            if count == 1 or count >= self.max_batch:
                self._cond.notify()
        return await future

    def close(self) -> None:
        """Stop the thread once the running batch is done; waiting items fail. Blocking."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _work(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
                backlog = len(self._pending)
            if batch is None:
                return
            live = [entry for entry in batch if not entry.future.cancelled()]
            if not live:
                continue
            started = time.monotonic()
            results: Sequence[R] | None = None
            error: BaseException | None = None
            try:
                results = self._run([entry.item for entry in live])
                if len(results) != len(live):
                    raise RuntimeError(
                        f"the {self.name} model returned {len(results)} results "
                        f"for {len(live)} items"
                    )
            except Exception as exc:
                error = exc
            finished = time.monotonic()
            _deliver_all(live, results, error)
            if self.observer is not None:
                self.observer.batch(
                    len(live), started - live[0].enqueued, finished - started, backlog
                )

    def _next_batch(self) -> list[_Entry[T, R]] | None:
        """Wait (holding the condition) until a batch is due and take it; None once closed."""
        while not self._pending and not self._closed:
            self._cond.wait()
        if self._pending:
            now = time.monotonic()
            self._update_rate(now)
            deadline = self._pending[0].enqueued + self.max_wait_s
            while len(self._pending) < self.max_batch and not self._closed:
                remaining = deadline - now
                # Waiting only pays when someone else is likely to join before the deadline:
                # with few callers it would add the whole deadline to every item and gather
                # nobody.
                if remaining <= 0 or self._rate * remaining < 1:
                    break
                self._cond.wait(remaining)
                now = time.monotonic()
        if self._closed:
            waiting = list(self._pending)
            self._pending.clear()
            _deliver_all(waiting, None, BatcherClosedError(f"the {self.name} batcher is closed"))
            return None
        take = min(self.max_batch, len(self._pending))
        return [self._pending.popleft() for _ in range(take)]

    def _update_rate(self, now: float) -> None:
        """Follow how many items arrive per second (smoothed over about a fifth of a second)."""
        elapsed = now - self._rate_since
        if elapsed < _RATE_WINDOW_S:
            return
        self._rate = 0.5 * self._rate + 0.5 * self._arrivals / elapsed
        self._arrivals = 0
        self._rate_since = now


def _deliver_all(
    entries: list[_Entry[T, R]], results: Sequence[R] | None, error: BaseException | None
) -> None:
    """Hand each entry its result (or the error) on its own event loop, one wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[int]] = {}
    for index, entry in enumerate(entries):
        by_loop.setdefault(entry.loop, []).append(index)
    for loop, indices in by_loop.items():
        chosen = [entries[i] for i in indices]
        values = None if results is None else [results[i] for i in indices]
        # A closed loop raises RuntimeError: nobody is waiting for these results any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, chosen, values, error)


def _resolve(
    entries: list[_Entry[T, R]], values: list[R] | None, error: BaseException | None
) -> None:
    for index, entry in enumerate(entries):
        if entry.future.done():
            continue
        if values is None:
            entry.future.set_exception(error or RuntimeError("no result"))
        else:
            entry.future.set_result(values[index])


# ---------------------------------------------------------------------------- Silero VAD

_Row = tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]


class BatchedSileroVad:
    """Silero VAD with every stream's chunks batched into shared model calls.

    A ``VadEngine``: each stream keeps its own recurrent state and context, and its
    ``probability`` joins the next batch. Results are those of ``SileroVad`` row for row.
    ``max_batch`` caps a batch's rows, ``max_wait_ms`` how long a chunk waits for others;
    ``threads`` is ONNX Runtime's intra-op thread count for each batch.
    """

    sample_rate: int = SAMPLE_RATE
    chunk_samples: int = CHUNK_SAMPLES

    def __init__(
        self,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
        threads: int = 1,
    ) -> None:
        self._model = SileroVad(threads)
        self.batcher: Batcher[_Row, _Row] = Batcher(
            self._run, max_batch=max_batch, max_wait_ms=max_wait_ms, name="vad"
        )

    def open_stream(self) -> BatchedSileroVadStream:
        """A new, independent stream with fresh state."""
        return BatchedSileroVadStream(self.batcher)

    async def warmup(self) -> None:
        """Load the model and run one silent chunk through the batcher."""
        await asyncio.to_thread(self._model.load)
        await self.open_stream().probability(np.zeros(CHUNK_SAMPLES, dtype=np.float32))

    async def aclose(self) -> None:
        """Stop the batcher's thread."""
        await asyncio.to_thread(self.batcher.close)

    def _run(self, rows: list[_Row]) -> list[_Row]:
        windows = np.stack([window for window, _ in rows])
        states = np.stack([state for _, state in rows], axis=1)
        probabilities, next_states = run_batch(self._model.load(), windows, states)
        # Copies, so that a stream's state does not keep the whole batch's array alive.
        return [
            (probabilities[i : i + 1].copy(), next_states[:, i, :].copy()) for i in range(len(rows))
        ]


class BatchedSileroVadStream:
    """One stream of ``BatchedSileroVad``: its recurrent state and the previous chunk's tail.

    Calls to ``probability`` on one stream must not overlap (each chunk depends on the one
    before); an overlapping call raises ``RuntimeError``.
    """

    def __init__(self, batcher: Batcher[_Row, _Row]) -> None:
        self._batcher = batcher
        self._state = np.zeros((2, STATE_SIZE), dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self._busy = False

    async def probability(self, chunk: npt.NDArray[np.float32]) -> float:
        """Speech probability of one chunk of exactly 512 float32 samples in [-1, 1].

        Raises ``ValueError`` for a chunk of another size or a non-float dtype. When the
        call is cancelled the stream's state is left as if the chunk was never given.
        """
        samples = _checked_chunk(chunk)
        if self._busy:
            raise RuntimeError("probability() calls on one VAD stream must not overlap")
        self._busy = True
        try:
            window = np.concatenate((self._context, samples))
            probability, state = await self._batcher.submit((window, self._state))
        finally:
            self._busy = False
        self._state = state
        self._context = window[-CONTEXT_SAMPLES:].copy()
        return float(probability[0])

    def reset(self) -> None:
        """Forget the stream's history, as if it had just been opened."""
        self._state = np.zeros((2, STATE_SIZE), dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)


def _checked_chunk(chunk: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    array = np.asarray(chunk)
    if array.shape != (CHUNK_SAMPLES,):
        raise ValueError(f"a VAD chunk is {CHUNK_SAMPLES} samples, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"a VAD chunk is float32 samples in [-1, 1], got {array.dtype}")
    return array.astype(np.float32, copy=False)

"""Batching across sessions: one Silero VAD call per tick for every stream of the process.

A model that sessions call once per audio chunk (Silero VAD: a 32 ms chunk each) spends most
of a single-row call on fixed overhead. ``BatchedSileroVad`` gathers the chunks that sessions
push within a short window and runs them through the model as one batch in its own thread. A
batch leaves when it is full or when its oldest chunk has waited ``max_wait_ms`` since it
could run (a stream's next chunk can run once the one before it is answered), whichever
comes first, so no chunk waits on a slow or silent session; and at once when, at the recent
rate of arrivals, too few others would join it in time, so that a lightly loaded process adds
no wait at all, or when it carries the later rows of a push (a 100 ms append's second and
third chunks), which a session hears only together with the first. The deadline is kept
by the batcher's thread, not by the event loop, so a busy loop does not hold batches back.
Sessions push chunks and go on; the results come back to their event loops through
:mod:`hark.engines.vad.delivery`.

Failures: a batch whose model call raises answers each of its chunks with a miss that names
the error (sessions tell their clients) and marks the engine degraded
(:mod:`hark.engines.health`) until a batch succeeds. A thread that dies is started again, its
batch's chunks missed. A stream holds at most ``max_queued`` chunks waiting; when the thread
falls that far behind, the oldest waiting chunk is dropped and answered with a miss, so a
session's answers stay in step with its audio and the memory a stalled model holds is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from hark.engines import health
from hark.engines.scheduler import require_positive
from hark.engines.vad import Outcomes, silero_gemm
from hark.engines.vad.delivery import DROPPED, Mailbox, Missed
from hark.engines.vad.resample import CHUNK_MS, chunk_rate, chunk_resampler, chunk_samples
from hark.engines.vad.silero import (
    MODEL_RATES,
    SAMPLE_RATE,
    STATE_SIZE,
    context_samples,
    model_path,
)

if TYPE_CHECKING:
    from hark.engines import EngineMetrics

# The VAD waits up to 10 ms: at 200 sessions (6 250 chunks a second) that gathers batches of
# about 60 rows, where Silero's cost per row bottoms out (a third less than at 30 rows).
VAD_MAX_WAIT_MS = 10.0
# ... but only while at least this many more chunks are expected before the deadline, so
# that a process with a few sessions (4 of them send 125 chunks a second) never waits.
VAD_WORTH_WAITING_ROWS = 8.0
# A chunk pushed this many waits ago is behind: its batch waits for nobody. A stream's next
# chunk waits for others from when it could run (``_next_batch``), and without this a VAD
# that fell behind would still wait that long before every batch, never catching up.
VAD_BEHIND_WAITS = 5
DEFAULT_MAX_BATCH = 256
# What a batch holds: streams, each with the consecutive chunks of its own that it runs.
_Batch: TypeAlias = list[tuple["BatchedSileroVadStream", list["_Chunk"]]]
# Chunks a stream may have waiting: 262 s of audio, what one maximal append (15 MiB of base64,
# 245 s at 24 kHz) pushes at once, so that a client sending a recording faster than real time
# loses nothing; about 12 MB at 24 kHz. Only a model stalled for minutes fills it.
MAX_QUEUED_CHUNKS = 8192
# A stream's consecutive chunks of one push that one batch runs: its encoder rows at once,
# then its recurrent steps one after another. Four hold a 100 ms append at any rate (three
# 32 ms chunks, and one left over from the append before); a longer push (a recording sent at
# once) goes on in the next batch, so that it shares each batch with the other streams.
MAX_STEPS = 4
# The arrival rate is measured over windows at least this long.
_RATE_WINDOW_S = 0.1


class BatchObserver(Protocol):
    """Told about every batch the batcher runs (called in the batcher's thread)."""

    def batch(self, size: int, wait_s: float, run_s: float, backlog: int) -> None:
        """``size`` rows ran for ``run_s``; the oldest had waited ``wait_s`` before the run;
        ``backlog`` items were left waiting for the next batch."""
        ...


class VadModel(Protocol):
    """What runs a batch: Silero at one rate (:class:`hark.engines.vad.silero_gemm.SileroGemm`),
    in two parts, so that the rows of one stream's consecutive chunks share one ``encode``."""

    def encode(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The features ``[B, F]`` of ``windows`` ``[B, window]``, which need no state."""
        ...

    def step(
        self, features: npt.NDArray[np.float32], states: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Probabilities ``[B]`` and next states for ``features`` and ``states``."""
        ...


class BatcherClosedError(RuntimeError):
    """The batcher was closed: it takes no new chunks, and drops the ones still waiting."""


class ArrivalRate:
    """How many items arrive per second, to judge whether waiting for more is worth it.

    Not thread-safe by itself: callers hold their own lock.
    """

    def __init__(self) -> None:
        self.per_second = 0.0
        self._arrivals = 0
        self._since = time.monotonic()

    def count(self, items: int = 1) -> None:
        """``items`` more arrived."""
        self._arrivals += items

    def worth_waiting(self, deadline: float, rows: float) -> float | None:
        """Seconds to wait for more items before ``deadline``, or None to go now.

        Waiting only pays when at least ``rows`` more items are likely to join before the
        deadline: with few callers it would add the whole deadline to every item and gather
        nobody.
        """
        now = time.monotonic()
        elapsed = now - self._since
        if elapsed >= _RATE_WINDOW_S:
            # Smoothed over about a fifth of a second.
            self.per_second = 0.5 * self.per_second + 0.5 * self._arrivals / elapsed
            self._arrivals = 0
            self._since = now
        remaining = deadline - now
        if remaining <= 0 or self.per_second * remaining < rows:
            return None
        return remaining


_log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Chunk:
    samples: npt.NDArray[Any]
    epoch: int
    enqueued: float
    # When it could first run: when it was pushed, or when the chunk before it in its stream
    # was answered. A batch waits for others from then on (see ``_next_batch``).
    ready: float
    # Pushed with later chunks (the rows of one push): its answer waits for theirs.
    more: bool = False
    # Older chunks of the stream dropped from its full queue, answered just before this one:
    # those of its epoch, and those of earlier epochs (answered as such: stale to the stream).
    dropped_before: int = 0
    stale_dropped_before: int = 0


class BatchedSileroVad:
    """Silero VAD for every session of the process, in shared model calls: a ``VadEngine``.

    Sessions push 32 ms chunks at their input rate and go on; the engine's thread takes the
    oldest chunk of every stream that has one, resamples the batch to 16 kHz (one polyphase
    filter per input rate, :mod:`hark.engines.vad.resample`) and runs Silero once over it.
    A stream's later chunks wait for the next batch, since each depends on the state the one
    before leaves; the thread takes them without a round trip through the event loop. The
    probabilities come back on the stream's event loop, one wake-up per batch for all of
    them, through each stream's ``on_outcomes``; or sooner, when a session handling input calls
    ``deliver_ready`` first (see :mod:`hark.engines.vad.delivery`).

    The streams' recurrent states, Silero contexts and resampler histories live in shared
    arrays, a row per stream, so a batch gathers and scatters them in one step each.
    A batch leaves when it holds ``max_batch`` streams, when its oldest chunk has waited
    ``max_wait_ms`` since it could run, or at once when at the recent rate of arrivals nobody
    else would join it in time or when it carries the rest of a push whose first rows were
    just answered. The model runs as matrix products over the whole batch
    (:mod:`hark.engines.vad.silero_gemm`, about twice as fast per row as ONNX Runtime at
    batches of 32 and more), on the batcher's thread alone: numpy's BLAS is held to one
    thread, since a pool of spinning BLAS threads would take cores from the other models.

    ``model_rate`` is the rate the model hears: 16 kHz by default, or 8 kHz, where Silero
    costs about a quarter less per row but hears only the telephone band (enough to tell
    speech from silence, a little less sure of quiet fricatives). ``model`` runs the batches
    instead of Silero's weights at that rate (a wrapper of the real model, for instance).
    ``max_queued`` bounds each stream's waiting chunks (see the module doc).
    """

    chunk_ms: int = CHUNK_MS

    def __init__(
        self,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_wait_ms: float = VAD_MAX_WAIT_MS,
        model_rate: int = SAMPLE_RATE,
        *,
        model: VadModel | None = None,
        max_queued: int = MAX_QUEUED_CHUNKS,
    ) -> None:
        if model_rate not in MODEL_RATES:
            raise ValueError(f"the VAD model runs at 16000 or 8000 Hz, not {model_rate}")
        require_positive(max_batch=max_batch, max_queued=max_queued)
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must not be negative, got {max_wait_ms}")
        self.max_batch = max_batch
        self.max_queued = max_queued
        # While degraded, /readyz tries a chunk of silence (the model's own answer shows it works).
        self.health = health.EngineHealth("vad", probe=self._silence)
        self.max_wait_s = max_wait_ms / 1000
        self.sample_rate = model_rate
        self._observer: BatchObserver | None = None
        self._model: VadModel | None = model
        self._load_lock = threading.Lock()
        self._chunk = chunk_samples(model_rate)
        self._context = context_samples(model_rate)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Streams with a chunk waiting, oldest first; a stream is here at most once, and not
        # while its previous chunk is being run.
        self._ready: deque[BatchedSileroVadStream] = deque()
        self._arrivals = ArrivalRate()
        self._thread: threading.Thread | None = None
        # The batch the thread has taken and not yet answered: missed if the thread dies.
        self._in_flight: _Batch = []
        # A stream in the ready queue holds the rest of a push whose first rows were answered.
        self._push_waiting = False
        self._closed = False
        # Results on their way to each event loop that has streams open.
        self._mailboxes: dict[asyncio.AbstractEventLoop, Mailbox] = {}
        self._free_rows: list[int] = []
        self._rows_used = 0
        # Owned by the thread: a row per stream.
        self._states = np.zeros((2, 0, STATE_SIZE), dtype=np.float32)
        self._contexts = np.zeros((0, self._context), dtype=np.float32)
        self._histories: dict[int, npt.NDArray[np.float32]] = {}

    def observe(self, metrics: EngineMetrics) -> None:
        """Report every batch to ``metrics``'s ``vad`` batch observer, from now on."""
        self._observer = metrics.batch_observer("vad")

    @property
    def pending(self) -> int:
        """Streams with a chunk waiting for a batch (not counting the batch running now)."""
        return len(self._ready)

    def open_stream(self, on_outcomes: Callable[[Outcomes], None]) -> BatchedSileroVadStream:
        """A new stream with fresh state; each push's answers go to ``on_outcomes`` together,
        on the current loop (see ``VadEngine.open_stream``)."""
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._closed:
                raise BatcherClosedError("the vad batcher is closed")
            if self._free_rows:
                row = self._free_rows.pop()
            else:
                row = self._rows_used
                self._rows_used += 1
            mailbox = self._mailboxes.get(loop)
            if mailbox is None:
                mailbox = self._mailboxes[loop] = Mailbox(loop)
            mailbox.streams += 1
        return BatchedSileroVadStream(self, row, on_outcomes, mailbox)

    async def warmup(self) -> None:
        """Load the model and run one silent chunk through the batcher."""
        await asyncio.to_thread(self._load)
        await self._silence()

    async def _silence(self) -> float:
        """Run one silent chunk through the batcher; raises if the model fails on it."""
        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        def answered(outcomes: Outcomes) -> None:
            probability, _ = outcomes[-1]
            if done.done():
                return
            if isinstance(probability, Missed):
                done.set_exception(RuntimeError(f"the VAD failed: {probability.error}"))
            else:
                done.set_result(probability)

        stream = self.open_stream(answered)
        try:
            stream.push(np.zeros(self._chunk, dtype=np.int16), 0)
            return await done
        finally:
            stream.close()

    def _load(self) -> VadModel:
        with self._load_lock:
            if self._model is None:
                threadpool_limits(1, user_api="blas")
                self._model = silero_gemm.load(model_path())[self.sample_rate]
            return self._model

    async def aclose(self) -> None:
        """Stop the thread once the running batch is done; later pushes raise."""
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.health.close()

    # Called by streams, on their loop.

    def _push(self, stream: BatchedSileroVadStream, chunks: list[_Chunk]) -> None:
        # The condition's lock itself: entering the condition is a Python call per chunk.
        with self._lock:
            if self._closed:
                raise BatcherClosedError("the vad batcher is closed")
            if stream.closed:
                return
            queue = stream.queue
            queue.extend(chunks)
            while len(queue) > self.max_queued:
                _drop_oldest(queue)
            self._arrivals.count(len(chunks))
            if not stream.scheduled:
                stream.scheduled = True
                self._ready.append(stream)
                count = len(self._ready)
                # The thread sleeps until there is work or until a deadline: only a first
                # stream or a full batch changes what it does.
                if count == 1 or count >= self.max_batch:
                    self._cond.notify()
            if self._thread is None:
                self._start_thread(0.0)

    def _release(self, stream: BatchedSileroVadStream) -> None:
        with self._cond:
            if stream.closed:
                return
            stream.closed = True
            stream.queue.clear()
            # The callback holds the session; a closed stream must not keep it alive.
            stream.on_outcomes = _ignore
            mailbox = stream.mailbox
            mailbox.streams -= 1
            if not mailbox.streams and self._mailboxes.get(mailbox.loop) is mailbox:
                # Its last stream is gone: a test's short-lived loop is not kept alive here.
                del self._mailboxes[mailbox.loop]
            # A stream in a running batch gives its row back when that batch is done.
            if stream.running:
                return
            if stream.scheduled:
                self._ready.remove(stream)
            self._free_rows.append(stream.row)

    # The thread.

    def _start_thread(self, delay_s: float) -> None:
        """Start the batcher's thread (holding the lock), after ``delay_s`` of rest."""
        self._thread = threading.Thread(
            target=self._serve, args=(delay_s,), name="hark-vad-batcher", daemon=True
        )
        self._thread.start()

    def _serve(self, delay_s: float) -> None:
        """The thread: run batches until closed; if it dies, miss its batch and start again."""
        health.pause(delay_s)
        try:
            self._work()
        except BaseException as exc:
            _log.exception("the VAD batcher's thread died; starting it again")
            self._crashed(exc)

    def _crashed(self, exc: BaseException) -> None:
        delay = self.health.restarted(exc)
        with self._cond:
            batch, self._in_flight = self._in_flight, []
            self._finish_batch(batch, time.monotonic())
            if self._closed:
                self._thread = None
            else:
                self._start_thread(delay)
        if batch:
            _deliver_results(batch, Missed(health.describe(exc)))

    def _finish_batch(self, batch: _Batch, now: float) -> None:
        """``batch`` was answered at ``now`` (holding the lock): its streams may run again."""
        for stream, chunks in batch:
            stream.running = False
            if stream.closed:
                self._free_rows.append(stream.row)
            elif stream.queue:
                stream.queue[0].ready = now
                self._ready.append(stream)
                # The rest of a push is answered together: its session is waiting for the
                # last row, so the next batch goes at once (see ``_next_batch``).
                if chunks[-1].more:
                    self._push_waiting = True
            else:
                stream.scheduled = False

    def _work(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
                if batch is None:
                    return
                backlog = len(self._ready)
                self._in_flight = batch
            if not batch:
                continue
            started = time.monotonic()
            answers: npt.NDArray[np.float32] | Missed
            try:
                answers = self._run(batch)
            except Exception as exc:
                if self.health.problem is None:
                    # The first failure's trace; while it keeps failing, each batch would
                    # add one (health logs each new kind of failure).
                    _log.exception("the VAD failed on a batch of %d streams", len(batch))
                self.health.failed(exc)
                answers = Missed(health.describe(exc))
            else:
                self.health.working()
            finished = time.monotonic()
            with self._cond:
                self._in_flight = []
                self._finish_batch(batch, finished)
            _deliver_results(batch, answers)
            if self._observer is not None:
                oldest = min(chunks[0].enqueued for _, chunks in batch)
                size = sum(len(chunks) for _, chunks in batch)
                self._observer.batch(size, started - oldest, finished - started, backlog)
            # While the thread waits for the next batch, it must not keep this one's streams
            # (and through them their sessions, calls and codecs) alive.
            del batch

    def _next_batch(self) -> _Batch | None:
        """Wait (holding the condition) until a batch is due and take it; None once closed."""
        while not self._ready and not self._closed:
            self._cond.wait()
        if self._ready and not self._push_waiting:
            # Counted from when the oldest chunk could run, not from when it was pushed.
            # The rest of a push does not wait at all: a 100 ms append pushes three chunks,
            # each needing the state the one before leaves, and the session hears none of
            # them until the last is answered; waiting for others before each of the three
            # batches tripled the wait it saw (a median lag of 38 ms at 250 sessions on a
            # core half idle). New chunks that arrived meanwhile ride along.
            head = self._ready[0].queue[0]
            deadline = min(
                head.ready + self.max_wait_s,
                head.enqueued + VAD_BEHIND_WAITS * self.max_wait_s,
            )
            while len(self._ready) < self.max_batch and not self._closed:
                remaining = self._arrivals.worth_waiting(deadline, VAD_WORTH_WAITING_ROWS)
                if remaining is None:
                    break
                self._cond.wait(remaining)
        if self._closed:
            return None
        self._push_waiting = False
        batch: _Batch = []
        several = False
        while self._ready and len(batch) < self.max_batch:
            stream = self._ready.popleft()
            stream.running = True
            queue = stream.queue
            first = queue.popleft()
            taken = [first]
            # The rest of its push, as far as it is queued: same epoch, same rate.
            while (
                taken[-1].more
                and queue
                and len(taken) < MAX_STEPS
                and queue[0].epoch == first.epoch
                and len(queue[0].samples) == len(first.samples)
            ):
                taken.append(queue.popleft())
            several = several or len(taken) > 1
            batch.append((stream, taken))
        if several:
            # Most steps first: step k then runs the first streams of the batch (see _run).
            batch.sort(key=_steps, reverse=True)
        return batch

    def _run(self, batch: _Batch) -> npt.NDArray[np.float32]:
        """Run ``batch`` (streams with the most chunks first): the probabilities of the
        streams' first chunks, then of those that have a second, and so on."""
        streams = [stream for stream, _ in batch]
        rows = np.fromiter((stream.row for stream in streams), dtype=np.intp, count=len(streams))
        self._grow(self._rows_used)
        fresh = []
        for stream, chunks in batch:
            chunk = chunks[0]
            rate = chunk_rate(len(chunk.samples))
            if stream.epoch != chunk.epoch or stream.rate != rate:
                stream.epoch, stream.rate = chunk.epoch, rate
                fresh.append(stream.row)
        if fresh:
            self._states[:, fresh] = 0
            self._contexts[fresh] = 0
            for history in self._histories.values():
                history[fresh] = 0
        model = self._load()
        steps = len(batch[0][1])
        if steps == 1:
            windows = self._windows([chunks[0] for _, chunks in batch], streams, rows)
            probabilities, states = model.step(model.encode(windows), self._states[:, rows])
            self._states[:, rows] = states
            return probabilities
        # Each chunk's window is its audio after the one before it (the resampler's history
        # and the model's context): step by step. The encoder needs no state, so it runs once
        # over every step's rows; only the recurrent cell goes step by step.
        counts = [sum(1 for _, chunks in batch if len(chunks) > step) for step in range(steps)]
        windows = np.concatenate(
            [
                self._windows(
                    [chunks[step] for _, chunks in batch[:count]], streams[:count], rows[:count]
                )
                for step, count in enumerate(counts)
            ]
        )
        features = model.encode(windows)
        states = self._states[:, rows]
        answers = []
        start = 0
        for count in counts:
            probabilities, states[:, :count] = model.step(
                features[start : start + count], states[:, :count]
            )
            answers.append(probabilities)
            start += count
        self._states[:, rows] = states
        return np.concatenate(answers)

    def _windows(
        self,
        chunks: list[_Chunk],
        streams: list[BatchedSileroVadStream],
        rows: npt.NDArray[np.intp],
    ) -> npt.NDArray[np.float32]:
        """The model's windows for one chunk of each of ``streams``: each row's context, then
        its chunk at the model's rate (one filter run per input rate), which becomes the
        row's context for the next."""
        by_rate: dict[int, list[int]] = {}
        for index, stream in enumerate(streams):
            by_rate.setdefault(stream.rate, []).append(index)
        audio = np.empty((len(chunks), self._chunk), dtype=np.float32)
        for rate, indices in by_rate.items():
            resampler = chunk_resampler(rate, self.sample_rate)
            samples = _as_float(np.stack([chunks[i].samples for i in indices]))
            if resampler.history == 0:
                audio[indices] = samples
                continue
            history = self._histories.get(rate)
            if history is None:
                history = _grown(None, len(self._contexts), resampler.history)
                self._histories[rate] = history
            group = rows[indices]
            extended = np.concatenate((history[group], samples), axis=1)
            audio[indices] = resampler.run(extended)
            history[group] = extended[:, -resampler.history :]
        windows = np.concatenate((self._contexts[rows], audio), axis=1)
        self._contexts[rows] = audio[:, -self._context :]
        return windows

    def _grow(self, rows: int) -> None:
        if rows <= len(self._contexts):
            return
        capacity = max(64, 2 * rows)
        states = np.zeros((2, capacity, STATE_SIZE), dtype=np.float32)
        states[:, : self._states.shape[1]] = self._states
        self._states = states
        self._contexts = _grown(self._contexts, capacity, self._context)
        for rate, history in self._histories.items():
            self._histories[rate] = _grown(history, capacity, history.shape[1])


class BatchedSileroVadStream:
    """One session's stream of ``BatchedSileroVad``: push chunks, results come back in order.

    ``on_outcomes`` is called on the loop that opened the stream with the answers of each
    push, in order, until the stream is closed. A chunk with a new ``epoch``
    starts from fresh state, as does a change of sample rate.
    """

    __slots__ = (
        "_engine",
        "_length_checked",
        "closed",
        "epoch",
        "held",
        "mailbox",
        "on_outcomes",
        "queue",
        "rate",
        "row",
        "running",
        "scheduled",
    )

    def __init__(
        self,
        engine: BatchedSileroVad,
        row: int,
        on_outcomes: Callable[[Outcomes], None],
        mailbox: Mailbox,
    ) -> None:
        self._engine = engine
        self.mailbox = mailbox
        # A chunk length whose rate the resampler is known to support.
        self._length_checked = 0
        self.row = row
        self.on_outcomes = on_outcomes
        self.queue: deque[_Chunk] = deque()
        self.scheduled = False  # waiting in the ready queue or running
        self.running = False
        self.closed = False
        self.epoch: int | None = None
        self.rate = 0
        # Answers (or misses) held, with their epochs, until the last chunk of their push is
        # answered too; only the batcher's thread touches them.
        self.held: Outcomes = []

    def push(self, chunk: npt.NDArray[np.int16] | npt.NDArray[np.float32], epoch: int) -> None:
        """Queue one 32 ms chunk (int16, or float32 in [-1, 1]) at any supported rate, or
        several as the rows of a 2-D array, whose answers come back together once the last
        is ready.

        A session sees a 100 ms append's three chunks answered at once: its work on them
        then runs back to back, on objects still in the processor's cache, instead of once
        per batch among two hundred other sessions' (and their answers are late by a batch or
        two at most, as the last of them would be anyway).

        Raises ``ValueError`` for a chunk that is not 32 ms of mono audio at a rate the VAD
        can resample (8, 16, 24 or 48 kHz, among others).
        """
        array = chunk if type(chunk) is np.ndarray else np.asarray(chunk)
        # dtype.char: 'h' is int16, 'f' float32 (cheaper than comparing dtypes).
        if array.ndim not in (1, 2) or array.dtype.char not in ("h", "f"):
            raise ValueError(
                f"a VAD chunk is mono int16 or float32 audio, got {array.dtype} {array.shape}"
            )
        length = array.shape[-1]
        if length != self._length_checked:
            chunk_resampler(chunk_rate(length), self._engine.sample_rate)
            self._length_checked = length
        now = time.monotonic()
        if array.ndim == 1:
            self._engine._push(self, [_Chunk(array, epoch, now, now)])
            return
        last = len(array) - 1
        self._engine._push(
            self, [_Chunk(row, epoch, now, now, index < last) for index, row in enumerate(array)]
        )

    def take(self, outcomes: Outcomes) -> None:
        """On the loop: the answers of one push, to ``on_outcomes`` (the mailbox logs what
        it raises and goes on to the next stream)."""
        self.on_outcomes(outcomes)

    def deliver_ready(self) -> None:
        """Hand out now, in order, every result that is ready for the streams of this stream's
        loop (this session's and the others'). Call it on that loop, before handling input."""
        if self.mailbox.results:
            self.mailbox.deliver()

    def close(self) -> None:
        """Stop: queued chunks are dropped and no more results are delivered."""
        self._engine._release(self)


def _steps(take: tuple[BatchedSileroVadStream, list[_Chunk]]) -> int:
    return len(take[1])


def _deliver_results(batch: _Batch, answers: npt.NDArray[np.float32] | Missed) -> None:
    """Post each chunk's answer (or ``answers``, the one miss of a failed batch), after a miss
    for every chunk dropped before it. ``answers`` are in ``_run``'s order: the streams' first
    chunks, then their second ones (the streams with most chunks come first), and so on."""
    missed = answers if isinstance(answers, Missed) else None
    results = [] if isinstance(answers, Missed) else answers.tolist()
    mailboxes: set[Mailbox] = set()
    index = 0
    for step in range(len(batch[0][1]) if batch else 0):
        for stream, chunks in batch:
            if len(chunks) <= step:
                break
            chunk = chunks[step]
            held = stream.held
            # Any earlier epoch is stale to the stream: each still gets its place in the order.
            for _ in range(chunk.stale_dropped_before):
                held.append((DROPPED, chunk.epoch - 1))
            for _ in range(chunk.dropped_before):
                held.append((DROPPED, chunk.epoch))
            held.append((missed if missed is not None else results[index], chunk.epoch))
            index += 1
            if chunk.more:
                continue
            mailbox = stream.mailbox
            # Handed over whole: the loop reads it while this thread holds the next push's.
            mailbox.post(stream, held)
            stream.held = []
            mailboxes.add(mailbox)
    for mailbox in mailboxes:
        mailbox.wake()


def _drop_oldest(queue: deque[_Chunk]) -> None:
    """Drop the oldest of at least two chunks; the next one answers for it with a miss."""
    dropped = queue.popleft()
    head = queue[0]
    head.ready = dropped.ready
    head.stale_dropped_before += dropped.stale_dropped_before
    if dropped.epoch == head.epoch:
        head.dropped_before += dropped.dropped_before + 1
    else:
        head.stale_dropped_before += dropped.dropped_before + 1


def _ignore(outcomes: Outcomes) -> None:
    pass


def _as_float(samples: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    if samples.dtype == np.float32:
        return samples.astype(np.float32, copy=False)
    return samples.astype(np.float32) * np.float32(1 / 32768)


def _grown(array: npt.NDArray[np.float32] | None, rows: int, width: int) -> npt.NDArray[np.float32]:
    grown = np.zeros((rows, width), dtype=np.float32)
    if array is not None:
        grown[: len(array)] = array
    return grown

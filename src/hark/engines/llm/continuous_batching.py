"""Continuous batching: many generations share one embedded llama.cpp model, one decode per step.

One thread owns the model and a context whose KV cache holds up to ``sequences`` token
sequences in a single pool of cells (llama.cpp's unified KV cache, where a cell may belong to
several sequences). Each admitted job owns a sequence (:mod:`hark.engines.llm.kv_cache` says
which, and keeps conversations between turns). Each step builds one ``llama_batch`` of the work
:mod:`hark.engines.llm.step_policy` picks (the next token of generating sequences, bounded
chunks of prompt for sequences still reading theirs), calls ``llama_decode`` once
(:mod:`hark.engines.llm.llama_model`) and samples each generating sequence from its own row of
logits with its own sampler chain (:mod:`hark.engines.llm.sampling`). A cancelled job leaves at
the next step. When the cache is full and no idle sequence is left to move to RAM, the least
urgent running job goes back to the queue, to read its tokens again once another has left. A
job that does not fit alone fails.

Numerics: llama.cpp sums attention in cell order. With flash attention it skips other
sequences' cells, so a sequence whose cells are in position order gets the same logits whatever
else is batched or cached; without it every cell takes part in the sums (masked to zero), and
two runs of one request can part after a few dozen greedy tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from hark.engines import activity, health
from hark.engines.llm import shared_prefix, step_policy
from hark.engines.llm.kv_cache import CacheSequence, KvCache
from hark.engines.llm.llama_model import LlamaContext, LlamaModel, Row
from hark.engines.llm.sampling import Sampler

log = logging.getLogger(__name__)

# How long a step nobody waits for (see ``step_policy.can_wait``) holds off at most while an
# urgent call runs on every core (a reply's first piece in Piper: about 70 ms on two threads of
# the development machine), from when that call began.
HOLD_S = 0.15

StopReason = Literal["stop", "length"]


@dataclass(slots=True)
class Usage:
    """What one generation cost, counted as it runs."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class Reader(Protocol):
    """Turns a generation's text into engine events, on the scheduler thread."""

    def feed(self, piece: str) -> bool:
        """More text; returns True when the reply is complete and generation should stop."""
        ...

    def end(self, reason: StopReason) -> None:
        """The model stopped (a stop token) or ran out of tokens (``length``)."""
        ...


@dataclass(eq=False, slots=True)
class Plan:
    """What a job asks for: read ``prompt`` and, with a ``reader``, generate after it."""

    prompt: list[int]
    reader: Reader | None = None
    max_tokens: int = 0
    temperature: float = 0.0
    grammar: str | None = None
    usage: Usage = field(default_factory=Usage)


class Job:
    """One request to a :class:`BatchScheduler`.

    ``plan`` runs on the scheduler thread when the job arrives; ``speculative``, ``failed`` and
    ``done`` while and after it runs. ``cancelled`` may be set from any thread (then wake the
    scheduler): the job then leaves at the next step and no hook is called any more.
    """

    cancelled: bool = False

    def plan(self, model: LlamaModel) -> Plan | None:
        """Tokens to read, and how to generate; None when there is nothing to do."""
        raise NotImplementedError

    def speculative(self) -> bool:
        """Whether nobody waits for the reply yet (it may be read again at every step)."""
        return False

    def failed(self, error: BaseException) -> None:
        """The job cannot be served."""

    def done(self) -> None:
        """The job has left the scheduler (finished, or a prefill made unnecessary)."""


class _Probe(Job):
    """A job with nothing to do: its leaving shows the thread serves."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.left: asyncio.Future[None] = self._loop.create_future()

    def plan(self, model: LlamaModel) -> Plan | None:
        return None

    def failed(self, error: BaseException) -> None:
        self._loop.call_soon_threadsafe(_settle, self.left, error)

    def done(self) -> None:
        self._loop.call_soon_threadsafe(_settle, self.left, None)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


@dataclass(eq=False, slots=True)
class _Task:
    """A job inside the scheduler (a :class:`hark.engines.llm.step_policy.Work`)."""

    job: Job
    plan: Plan
    order: int
    # What the sequence must read next: the rest of the prompt, or the token just sampled.
    todo: list[int]
    sequence: CacheSequence | None = None
    sampler: Sampler | None = None
    admitted: bool = False
    last_served: float = 0.0
    # Put back in the queue for want of room: it waits until a running job has left.
    readmit_after: int = -1

    @property
    def generates(self) -> bool:
        return self.plan.reader is not None

    @property
    def speculative(self) -> bool:
        return self.job.speculative()

    @property
    def generated(self) -> int:
        return self.plan.usage.completion_tokens

    @property
    def to_read(self) -> int:
        return len(self.todo)


class BatchScheduler:
    """Serves :class:`Job` s on one model and context from one thread (see the module doc).

    ``n_ctx`` is the longest sequence the model serves; ``kv_cells`` the size of the shared KV
    cache (at least ``n_ctx``); ``sequences`` how many conversations it holds at once;
    ``step_tokens`` how many tokens one step may read (generating sequences get their token
    beyond it when they are urgent). ``flash_attention`` lets llama.cpp use it. Idle sequences
    beyond ``resident_idle_cells`` tokens move to RAM, up to ``ram_bytes``. Besides the
    model's end-of-generation tokens, the ``stop_markers`` that are single tokens end a
    generation. ``check`` vets the model after loading (raise to refuse it). A step that
    reads one job's prompt runs on ``wide_threads`` threads when no other model in the
    process is computing (see :mod:`hark.engines.activity`), else on ``n_threads``. A step
    that serves only work nobody waits for yet holds off, for at most ``hold_s`` per call,
    while an urgent call of another model runs on every core; the scheduler publishes how many
    of its jobs someone waits for, which such a call looks at before it spreads.
    """

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int,
        kv_cells: int,
        sequences: int,
        n_threads: int,
        step_tokens: int,
        seed: int,
        flash_attention: bool = False,
        resident_idle_cells: int = 1024,
        ram_bytes: int = 512 << 20,
        stop_markers: tuple[str, ...] = (),
        check: Callable[[LlamaModel], None] | None = None,
        wide_threads: int | None = None,
        hold_s: float = HOLD_S,
    ) -> None:
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.kv_cells = max(kv_cells, n_ctx)
        self.n_sequences = sequences
        self.n_threads = n_threads
        self.wide_threads = max(n_threads, wide_threads or n_threads)
        self._batch_threads = n_threads
        self.hold_s = hold_s
        self._waited = activity.Waited()
        self.step_tokens = step_tokens
        self.seed = seed
        self.flash_attention = flash_attention
        self.resident_idle_cells = resident_idle_cells
        self.ram_bytes = ram_bytes
        self._stop_markers = stop_markers
        self._check = check
        self._cond = threading.Condition()
        self._inbox: list[Job] = []
        self._closing = False
        self._thread: threading.Thread | None = None
        # Scheduler-thread state.
        self._model: LlamaModel | None = None
        self._context: LlamaContext | None = None
        self._cache: KvCache | None = None
        self._batch_size = max(512, step_tokens + sequences)
        self._stops: frozenset[int] = frozenset()
        self._waiting: list[_Task] = []
        self._running: list[_Task] = []
        self._order = itertools.count()
        self._departures = 0
        # While degraded, /readyz sends a job with nothing to do through the thread.
        self.health = health.EngineHealth("llama", probe=self._probe)

    # ------------------------------------------------------------------ any thread

    def submit(self, job: Job) -> None:
        """Queue ``job``; its hooks run on the scheduler thread."""
        with self._cond:
            if self._closing:
                raise RuntimeError("the LLM engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hark-llama", daemon=True)
                self._thread.start()
            self._inbox.append(job)
            self._cond.notify()
        activity.wake_holders()

    def wake(self) -> None:
        """Look at the jobs again (after setting a job's ``cancelled``)."""
        with self._cond:
            self._cond.notify()
        activity.wake_holders()

    def close(self) -> None:
        """Fail what is queued, stop the thread and free the model. Blocks until done."""
        with self._cond:
            self._closing = True
            thread = self._thread
            self._cond.notify()
        activity.wake_holders()
        if thread is not None:
            thread.join()

    async def _probe(self) -> None:
        """Hand the thread a job with nothing to do, and wait for it to leave."""
        probe = _Probe()
        self.submit(probe)
        await probe.left

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called, or the model failed to load."""
        return self._closing

    # ------------------------------------------------------------------ scheduler thread

    def _run(self) -> None:
        try:
            self._open()
        except BaseException as exc:
            log.error("could not load the LLM: %s", exc)
            self.health.failed(exc)
            with self._cond:
                self._closing = True
                inbox, self._inbox = self._inbox, []
            for job in inbox:
                job.failed(exc)
            self._free()
            return
        crash: BaseException | None = None
        try:
            while self._cycle():
                pass
        except BaseException as exc:
            log.exception("the LLM thread died; starting it again")
            crash = exc
        # Counted before the jobs hear of it; the successor starts once the model is freed.
        delay = 0.0 if crash is None else self.health.restarted(crash)
        error = (
            RuntimeError("the LLM engine is closed")
            if crash is None
            else health.EngineThreadCrashedError(f"the LLM thread died ({health.describe(crash)})")
        )
        with self._cond:
            inbox, self._inbox = self._inbox, []
        for job in inbox:
            job.failed(error)
        for task in [*self._running, *self._waiting]:
            self._drop(task)
            if not task.job.cancelled:
                task.job.failed(error)
        self._waited.set(0)
        # The model and cache may be half-way through a step: the next thread loads afresh.
        self._free()
        if crash is None:
            self.health.close()
            return
        with self._cond:
            if self._closing:
                return
            self._thread = threading.Thread(
                target=self._restart, args=(delay,), name="hark-llama", daemon=True
            )
            self._thread.start()

    def _restart(self, delay_s: float) -> None:
        health.pause(delay_s)
        self._run()

    def _open(self) -> None:
        model = LlamaModel(self.model_path)
        self._model = model
        if self._check is not None:
            self._check(model)
        stops = {model.eos}
        for marker in self._stop_markers:
            ids = model.tokenize(marker)
            if len(ids) == 1:
                stops.add(ids[0])
        self._stops = frozenset(stops)
        self._context = LlamaContext(
            model,
            kv_cells=self.kv_cells,
            sequences=self.n_sequences,
            batch_size=self._batch_size,
            n_threads=self.n_threads,
            flash_attention=self.flash_attention,
        )
        self._cache = KvCache(
            self._context, self.n_sequences, self.resident_idle_cells, self.ram_bytes
        )

    def _free(self) -> None:
        if self._cache is not None:
            self._cache.forget_saved()
            self._cache = None
        if self._context is not None:
            self._context.close()
            self._context = None
        if self._model is not None:
            self._model.close()
            self._model = None

    def _cycle(self) -> bool:
        with self._cond:
            while not (self._inbox or self._closing or self._running or self._waiting):
                self._waited.set(0)
                self._cond.wait()
            inbox, self._inbox = self._inbox, []
            if self._closing:
                self._inbox = inbox
                return False
        for job in inbox:
            self._accept(job)
        self._reap()
        self._admit()
        self._step()
        return True

    def _accept(self, job: Job) -> None:
        if job.cancelled:
            return
        assert self._model is not None
        try:
            plan = job.plan(self._model)
            if plan is None:
                self._served(job)
                return
            sampler = None
            if plan.reader is not None:
                sampler = Sampler(self._model, plan.temperature, plan.grammar, self.seed)
        except Exception as exc:
            job.failed(exc)
            return
        plan.usage.prompt_tokens = len(plan.prompt)
        task = _Task(job, plan, next(self._order), list(plan.prompt), sampler=sampler)
        self._waiting.append(task)

    def _reap(self) -> None:
        """Cancelled jobs leave: their sequences keep what they read, for the next turn."""
        for task in [t for t in self._running if t.job.cancelled]:
            self._drop(task)
        for task in [t for t in self._waiting if t.job.cancelled]:
            self._drop(task)

    def _drop(self, task: _Task) -> None:
        """Take ``task`` out of the scheduler without telling its job anything."""
        if task in self._running:
            self._running.remove(task)
            self._departures += 1
        if task in self._waiting:
            self._waiting.remove(task)
        if task.sequence is not None:
            assert self._cache is not None
            self._cache.release(task.sequence)
            task.sequence = None
        if task.sampler is not None:
            task.sampler.close()
            task.sampler = None

    def _leave(self, task: _Task) -> None:
        self._drop(task)
        self._served(task.job)

    def _served(self, job: Job) -> None:
        """``job`` leaves, done: the thread works (said before the job's owner hears)."""
        self.health.working()
        job.done()

    def _fail(self, task: _Task, error: BaseException) -> None:
        self._drop(task)
        task.job.failed(error)

    # ------------------------------------------------------------------ admission

    def _admit(self) -> None:
        assert self._cache is not None
        now = time.monotonic()
        for task in step_policy.admission_order(self._waiting, now):
            if task.readmit_after >= self._departures and self._running:
                continue
            sequence = self._place(task)
            if sequence is None:
                if not task.generates:
                    # A prefill only saves later work: with every sequence busy, skip it.
                    self._leave(task)
                continue
            self._waiting.remove(task)
            if not task.todo:
                # A prefill of tokens the cache already holds.
                self._cache.release(sequence)
                if task.sampler is not None:
                    task.sampler.close()
                    task.sampler = None
                self._served(task.job)
                continue
            sequence.busy = True
            task.sequence = sequence
            task.last_served = now
            self._running.append(task)

    def _place(self, task: _Task) -> CacheSequence | None:
        """Give ``task`` a sequence holding as much of its tokens as the cache (or RAM) has."""
        assert self._cache is not None
        if task.generates:
            self._supersede_prefills(task.todo)
        # A generation reads at least its last token again, for the logits to sample from.
        limit = len(task.todo) - 1 if task.generates else len(task.todo)
        placed = self._cache.place(task.todo, limit)
        if placed is None:
            return None
        sequence, cached = placed
        if not task.admitted:
            task.plan.usage.cached_tokens = cached
            task.admitted = True
        del task.todo[:cached]
        return sequence

    def _supersede_prefills(self, tokens: list[int]) -> None:
        """End the prefills that read the beginning of ``tokens``: the generation reads it now."""
        for task in [t for t in self._running if not t.generates]:
            assert task.sequence is not None
            read = task.sequence.tokens
            whole = read + task.todo
            # A token or two of slack: the prefill ends with the next user turn's opening,
            # which the BPE tokenizer may merge with its first word.
            if shared_prefix(read, tokens) == len(read) and (
                shared_prefix(whole, tokens) >= len(whole) - 2
            ):
                self._leave(task)

    # ------------------------------------------------------------------ one step

    def _step(self) -> None:
        if not self._running:
            return
        now = time.monotonic()
        self._waited.set(step_policy.waited_for(self._running, now))
        chosen = step_policy.next_step(self._running, now, self.step_tokens)
        if not chosen:
            return
        if activity.urgent_now() and step_policy.can_wait(chosen, now):
            # The other model voices a reply's first piece on every core: this step would
            # only slow it down, and the replies it serves are far ahead of their listeners.
            activity.hold_off(self.hold_s, self._pressed)
            now = time.monotonic()
        outputs = self._decode(chosen)
        if outputs is None:
            return
        for (task, n), output in zip(chosen, outputs, strict=True):
            sequence = task.sequence
            assert sequence is not None
            sequence.tokens.extend(task.todo[:n])
            del task.todo[:n]
            task.last_served = now
            if task.todo:
                continue
            try:
                if output < 0:
                    self._leave(task)
                else:
                    self._sample(task, output)
            except Exception as exc:
                log.exception("an LLM generation failed")
                self._fail(task, exc)

    def _pressed(self) -> bool:
        """Whether something came that a held step must not keep waiting (a new job, a
        cancellation, closing); read without the lock: a stale answer costs one more wait."""
        return bool(self._inbox) or self._closing or any(t.job.cancelled for t in self._running)

    def _decode(self, chosen: list[tuple[_Task, int]]) -> list[int] | None:
        """Run one batch; the batch index of each task's logits (-1: none). None: not run."""
        assert self._context is not None and self._cache is not None
        rows = []
        for task, n in chosen:
            assert task.sequence is not None
            last = task.generates and n == len(task.todo)
            rows.append(Row(task.sequence.id, len(task.sequence.tokens), task.todo[:n], last))
        self._spread(chosen)
        while True:
            rc, outputs = self._context.decode(rows)
            if rc == 0:
                return outputs
            if rc == 1 and self._cache.evict_idle():
                continue
            break
        if rc == 1:
            self._make_room()
            return None
        error = RuntimeError(f"llama_decode failed ({rc})")
        for task, _ in chosen:
            assert task.sequence is not None
            self._cache.truncate(task.sequence)
            self._fail(task, error)
        return None

    def _spread(self, chosen: list[tuple[_Task, int]]) -> None:
        """Read a lone prompt on every core while no other model computes: a turn's prompt,
        read after its transcript, is on the way to its first words (about 13 tokens: 84 ms
        on two threads against 121 on one). llama.cpp uses ``n_threads_batch`` for steps of
        more than one token, so single-token steps keep ``n_threads`` whatever is set here."""
        assert self._context is not None
        wide = len(chosen) == 1 and chosen[0][1] > 1 and activity.computing_now() == 0
        threads = self.wide_threads if wide else self.n_threads
        if threads != self._batch_threads:
            self._context.set_threads(self.n_threads, threads)
            self._batch_threads = threads

    def _make_room(self) -> None:
        """The cache is full of running work: put the least urgent job back in the queue, to
        read its tokens again later; a job that does not fit alone fails."""
        assert self._cache is not None
        victim = step_policy.least_urgent(self._running, time.monotonic())
        sequence = victim.sequence
        assert sequence is not None
        if len(self._running) == 1:
            self._fail(victim, ValueError("the prompt does not fit in the KV cache"))
            return
        if not victim.generates:
            self._leave(victim)
            return
        victim.todo = sequence.tokens + victim.todo
        self._cache.clear(sequence)
        self._running.remove(victim)
        sequence.busy = False
        victim.sequence = None
        victim.readmit_after = self._departures
        self._waiting.append(victim)
        log.info("the KV cache is full: a generation waits for room")

    def _sample(self, task: _Task, output: int) -> None:
        assert self._context is not None and self._model is not None
        sampler = task.sampler
        reader = task.plan.reader
        assert sampler is not None and reader is not None
        usage = task.plan.usage
        token = sampler.sample(self._context, output)
        if token in self._stops or self._model.is_end_of_generation(token):
            self._finish(task, "stop")
            return
        usage.completion_tokens += 1
        piece = sampler.text(token)
        if piece and reader.feed(piece):
            self._leave(task)
            return
        if usage.completion_tokens >= task.plan.max_tokens:
            self._finish(task, "length")
            return
        task.todo = [token]

    def _finish(self, task: _Task, reason: StopReason) -> None:
        reader = task.plan.reader
        sampler = task.sampler
        assert reader is not None and sampler is not None
        tail = sampler.flush()
        if not (tail and reader.feed(tail)):
            reader.end(reason)
        self._leave(task)

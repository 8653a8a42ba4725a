"""Continuous batching: many generations share one embedded llama.cpp model, one decode per step.

One thread owns the model and a context whose KV cache holds up to ``sequences`` token
sequences in a single pool of cells (llama.cpp's unified KV cache, where a cell may belong to
several sequences). Each admitted job owns a sequence. Each step builds one ``llama_batch`` of
the work the order below picks (the next token of generating sequences, bounded chunks of
prompt for sequences still reading theirs), calls ``llama_decode`` once and samples each
generating sequence from its own row of logits with its own sampler chain (and so its own
grammar state). A cancelled job leaves at the next step.

On a CPU a step costs about the same per token whatever the batch holds (one thread of the
development machine: one decode token 14 ms, four in one batch 53 ms), so batching does not make
the model faster; what it buys is order. A reply that has not yet said its first few words (its
"opening": the first clause, the first audio) goes before everything else, one at a time,
the one with the least work left first; replies already being spoken decode together after
them, and get a token at least every ``SPOKEN_TOKEN_GAP_S`` whatever waits, to keep ahead of
the voice; speculative replies come after replies someone waits for, and prefills last.

Conversations stay between turns. A job continues, in place, the idle sequence that holds the
beginning of its tokens (the same conversation, a turn further on); otherwise it takes an empty
sequence, or the least recently used idle one, and when another sequence holds more of its
beginning (another session with the same instructions) it shares that sequence's cells rather
than read those tokens again. Every token decoded attends over every occupied cell, so idle
conversations beyond ``resident_idle_cells`` move to RAM (``llama_state_seq_get_data``, about
16 ms for 1000 tokens) and come back when their session speaks again (3 ms); measured with
four sessions (flash attention on), a cache holding them all made a token cost 29 ms by the
twentieth turn, against 18 ms at the start. When the cache is full, idle sequences go to RAM,
least recently used first; then the least urgent running job goes back to the queue, to read
its tokens again once another has left. A job that does not fit alone fails.

Numerics: llama.cpp sums attention in cell order. With flash attention it skips other
sequences' cells, so a sequence whose cells are in position order gets the same logits whatever
else is batched or cached; without it every cell takes part in the sums (masked to zero), and
two runs of one request can part after a few dozen greedy tokens.
"""

from __future__ import annotations

import codecs
import ctypes
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import llama_cpp

from hark.engines.activity import computing_now

log = logging.getLogger(__name__)

# A reply has said its first clause (the first audio) after about this many tokens; until then
# it is served before replies already being spoken.
OPENING_TOKENS = 8
# Idle sequences shorter than this are forgotten rather than moved to RAM.
SPILL_MIN_TOKENS = 32
# A reply being spoken gets a token at least this often, whatever else waits: about the pace
# of speech, so that its audio does not run dry behind a burst of new turns.
SPOKEN_TOKEN_GAP_S = 0.25

StopReason = Literal["stop", "length"]

# Urgency tiers, most urgent first: a reply being spoken that has waited too long for a token;
# replies that have not said their first words yet (a turn's, then a speculative one's); replies
# being spoken; speculative replies past their first words; prefills.
_OVERDUE, _OPENING, _SPECULATIVE_OPENING, _SPOKEN, _SPECULATIVE, _PREFILL = range(6)
_OPENINGS = (_OPENING, _SPECULATIVE_OPENING)


class ModelError(RuntimeError):
    """llama.cpp could not load the model or create its context."""


class LlamaModel:
    """A GGUF model loaded by llama.cpp, with its vocabulary."""

    def __init__(self, path: str) -> None:
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not model:
            raise ModelError(f"llama.cpp could not load {path}")
        self.model = model
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self._piece = ctypes.create_string_buffer(64)

    @property
    def chat_template(self) -> str | None:
        """The model's default chat template (GGUF ``tokenizer.chat_template``)."""
        template = llama_cpp.llama_model_chat_template(self.model, None)
        return template.decode("utf-8", "replace") if template else None

    @property
    def eos(self) -> int:
        """The end-of-sequence token."""
        return int(llama_cpp.llama_vocab_eos(self.vocab))

    def is_end_of_generation(self, token: int) -> bool:
        """Whether ``token`` ends a generation (end of sequence, end of turn …)."""
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def tokenize(self, text: str) -> list[int]:
        """``text`` as tokens, special tokens (``<|im_start|>``) included, no BOS added."""
        data = text.encode()
        room = len(data) + 8
        while True:
            tokens = (llama_cpp.llama_token * room)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), tokens, room, False, True)
            if n >= 0:
                return list(tokens[:n])
            room = -n

    def piece(self, token: int) -> bytes:
        """The bytes of ``token`` (nothing for special tokens)."""
        n = llama_cpp.llama_token_to_piece(
            self.vocab, token, self._piece, len(self._piece), 0, False
        )
        if n < 0:
            self._piece = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(
                self.vocab, token, self._piece, len(self._piece), 0, False
            )
        return self._piece.raw[:n]

    def close(self) -> None:
        """Free the model."""
        llama_cpp.llama_model_free(self.model)


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


@dataclass(eq=False, slots=True)
class _Sequence:
    """A KV-cache sequence: the tokens it holds at positions 0…n-1, and the job using it."""

    id: int
    tokens: list[int] = field(default_factory=list)
    task: _Task | None = None
    last_used: int = 0


@dataclass(eq=False, slots=True)
class _Snapshot:
    """An idle sequence moved out of the KV cache (``llama_state_seq_get_data``)."""

    tokens: list[int]
    data: bytearray
    size: int


@dataclass(eq=False, slots=True)
class _Task:
    """A job inside the scheduler."""

    job: Job
    plan: Plan
    order: int
    # What the sequence must read next: the rest of the prompt, or the token just sampled.
    todo: list[int]
    sequence: _Sequence | None = None
    sampler: llama_cpp.llama_sampler_p | None = None
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    admitted: bool = False
    last_served: float = 0.0
    # Put back in the queue for want of room: it waits until a running job has left.
    readmit_after: int = -1

    @property
    def generates(self) -> bool:
        return self.plan.reader is not None

    def tier(self, now: float) -> int:
        if self.plan.reader is None:
            return _PREFILL
        speculative = self.job.speculative()
        if self.plan.usage.completion_tokens < OPENING_TOKENS:
            return _SPECULATIVE_OPENING if speculative else _OPENING
        if speculative:
            return _SPECULATIVE
        if len(self.todo) == 1 and now - self.last_served > SPOKEN_TOKEN_GAP_S:
            return _OVERDUE
        return _SPOKEN

    def rank(self, now: float) -> tuple[int, int, int]:
        """Sort key, most urgent first: by tier; openings by the work left before the first
        words (shortest first); then by arrival."""
        tier = self.tier(now)
        left = 0
        if tier in _OPENINGS:
            left = len(self.todo) + OPENING_TOKENS - self.plan.usage.completion_tokens
        return tier, left, self.order


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` have in common from the start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


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
    process is computing (see :mod:`hark.engines.activity`), else on ``n_threads``.
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
    ) -> None:
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.kv_cells = max(kv_cells, n_ctx)
        self.n_sequences = sequences
        self.n_threads = n_threads
        self.wide_threads = max(n_threads, wide_threads or n_threads)
        self._batch_threads = n_threads
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
        self._ctx: llama_cpp.llama_context_p | None = None
        self._memory: llama_cpp.llama_memory_t | None = None
        self._batch: llama_cpp.llama_batch | None = None
        self._batch_size = max(512, step_tokens + sequences)
        self._stops: frozenset[int] = frozenset()
        self._sequences: list[_Sequence] = []
        # Least recently used first.
        self._snapshots: list[_Snapshot] = []
        self._waiting: list[_Task] = []
        self._running: list[_Task] = []
        self._order = itertools.count()
        self._clock = itertools.count(1)
        self._departures = 0

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

    def wake(self) -> None:
        """Look at the jobs again (after setting a job's ``cancelled``)."""
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        """Fail what is queued, stop the thread and free the model. Blocks until done."""
        with self._cond:
            self._closing = True
            thread = self._thread
            self._cond.notify()
        if thread is not None:
            thread.join()

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
            with self._cond:
                self._closing = True
                inbox, self._inbox = self._inbox, []
            for job in inbox:
                job.failed(exc)
            self._free()
            return
        try:
            while self._cycle():
                pass
        finally:
            error = RuntimeError("the LLM engine is closed")
            with self._cond:
                inbox, self._inbox = self._inbox, []
            for job in inbox:
                job.failed(error)
            for task in [*self._running, *self._waiting]:
                self._drop(task)
                if not task.job.cancelled:
                    task.job.failed(error)
            self._free()

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
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self.kv_cells
        params.n_batch = params.n_ubatch = self._batch_size
        params.n_seq_max = self.n_sequences
        params.kv_unified = True
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
            if self.flash_attention
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.n_threads = params.n_threads_batch = self.n_threads
        ctx = llama_cpp.llama_init_from_model(model.model, params)
        if not ctx:
            raise ModelError("llama.cpp could not create a context")
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(self._batch_size, 0, 1)
        self._sequences = [_Sequence(i) for i in range(self.n_sequences)]

    def _free(self) -> None:
        self._snapshots.clear()
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            self._model.close()
            self._model = None

    def _cycle(self) -> bool:
        with self._cond:
            while not (self._inbox or self._closing or self._running or self._waiting):
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
                job.done()
                return
            sampler = self._sampler(plan) if plan.reader is not None else None
        except Exception as exc:
            job.failed(exc)
            return
        plan.usage.prompt_tokens = len(plan.prompt)
        task = _Task(job, plan, next(self._order), list(plan.prompt), sampler=sampler)
        self._waiting.append(task)

    def _sampler(self, plan: Plan) -> llama_cpp.llama_sampler_p:
        """A sampler chain as llama-cpp-python's ``Llama.generate`` builds one (so that results
        match it): the grammar first, then greedy at temperature 0, else top-k 40, top-p 0.95,
        min-p 0.05, the temperature, and a draw from a fixed seed."""
        assert self._model is not None
        grammar = None
        if plan.grammar is not None:
            grammar = llama_cpp.llama_sampler_init_grammar(
                self._model.vocab, plan.grammar.encode(), b"root"
            )
            if not grammar:
                # llama.cpp says why in its log; a bad schema fails only this request.
                raise ValueError("the tool schema produced a grammar llama.cpp rejects")
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if grammar is not None:
            llama_cpp.llama_sampler_chain_add(chain, grammar)
        if plan.temperature == 0.0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if plan.temperature > 0.0:
                for sampler in (
                    llama_cpp.llama_sampler_init_top_k(40),
                    llama_cpp.llama_sampler_init_top_p(0.95, 1),
                    llama_cpp.llama_sampler_init_min_p(0.05, 1),
                    llama_cpp.llama_sampler_init_temp(plan.temperature),
                ):
                    llama_cpp.llama_sampler_chain_add(chain, sampler)
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(self.seed))
        return chain

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
            task.sequence.task = None
            task.sequence.last_used = next(self._clock)
            task.sequence = None
        if task.sampler is not None:
            llama_cpp.llama_sampler_free(task.sampler)
            task.sampler = None

    def _leave(self, task: _Task) -> None:
        self._drop(task)
        task.job.done()

    def _fail(self, task: _Task, error: BaseException) -> None:
        self._drop(task)
        task.job.failed(error)

    # ------------------------------------------------------------------ admission

    def _admit(self) -> None:
        now = time.monotonic()
        for task in sorted(self._waiting, key=lambda t: (t.tier(now), t.order)):
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
                sequence.last_used = next(self._clock)
                task.sequence = None
                if task.sampler is not None:
                    llama_cpp.llama_sampler_free(task.sampler)
                    task.sampler = None
                task.job.done()
                continue
            sequence.task = task
            task.sequence = sequence
            task.last_served = now
            self._running.append(task)

    def _place(self, task: _Task) -> _Sequence | None:
        """Give ``task`` a sequence holding as much of its tokens as the cache (or RAM) has."""
        assert self._memory is not None
        tokens = task.todo
        # A generation reads at least its last token again, for the logits to sample from.
        limit = len(tokens) - 1 if task.generates else len(tokens)

        def shared(held: _Sequence | _Snapshot) -> int:
            return min(shared_prefix(held.tokens, tokens), limit)

        if task.generates:
            self._supersede_prefills(tokens)
        idle = [s for s in self._sequences if s.task is None]
        if not idle:
            return None
        # The same conversation, further on or gone astray (a speculative reply to words the
        # user did not finish): continue it in place. Another conversation is left whole.
        best = max(self._sequences, key=shared)
        same = [s for s in idle if shared(s) > 0 and 2 * shared(s) >= len(s.tokens)]
        if same:
            target = max(same, key=shared)
        else:
            # An empty sequence, else the least recently used, sparing the one shared from.
            target = min(idle, key=lambda s: (bool(s.tokens), s is best, s.last_used))
        cached = shared(target)
        stored = max(self._snapshots, key=shared, default=None)
        if stored is not None and shared(stored) > max(cached, shared(best)):
            if target.tokens:
                self._spill(target)
            self._restore(stored, target)
            cached = shared(target)
        if shared(best) > cached:
            # Another sequence holds more of the beginning (the same instructions, say):
            # share its cells rather than read those tokens again.
            if target.tokens:
                self._spill(target)
            cached = shared(best)
            llama_cpp.llama_memory_seq_cp(self._memory, best.id, target.id, 0, cached)
            target.tokens = best.tokens[:cached]
        llama_cpp.llama_memory_seq_rm(self._memory, target.id, cached, -1)
        del target.tokens[cached:]
        if not task.admitted:
            task.plan.usage.cached_tokens = cached
            task.admitted = True
        del task.todo[:cached]
        self._limit_idle(target)
        return target

    def _limit_idle(self, keep: _Sequence) -> None:
        """Move idle sequences to RAM, least recently used first, until those left in the
        cache hold at most ``resident_idle_cells``: every token decoded attends over every
        occupied cell, so a cache full of idle conversations slows down the busy ones."""
        idle = sorted(
            (s for s in self._sequences if s.task is None and s.tokens and s is not keep),
            key=lambda s: s.last_used,
        )
        held = sum(len(s.tokens) for s in idle)
        for sequence in idle:
            if held <= self.resident_idle_cells:
                break
            held -= len(sequence.tokens)
            self._spill(sequence)

    def _spill(self, sequence: _Sequence) -> None:
        """Move an idle sequence's cells to RAM (short ones are not worth it) and free them."""
        assert self._ctx is not None and self._memory is not None
        tokens = sequence.tokens
        kept = any(s.tokens[: len(tokens)] == tokens for s in self._snapshots)
        if len(tokens) >= SPILL_MIN_TOKENS and self.ram_bytes > 0 and not kept:
            size = llama_cpp.llama_state_seq_get_size(self._ctx, sequence.id)
            data = bytearray(size)
            written = llama_cpp.llama_state_seq_get_data(
                self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size, sequence.id
            )
            if written:
                self._snapshots = [
                    s for s in self._snapshots if s.tokens != tokens[: len(s.tokens)]
                ]
                self._snapshots.append(_Snapshot(tokens, data, written))
                total = sum(s.size for s in self._snapshots)
                while total > self.ram_bytes:
                    total -= self._snapshots.pop(0).size
        llama_cpp.llama_memory_seq_rm(self._memory, sequence.id, -1, -1)
        sequence.tokens = []

    def _restore(self, snapshot: _Snapshot, sequence: _Sequence) -> None:
        """Bring a conversation back from RAM into ``sequence`` (empty), making room if need be;
        the sequence stays empty if there is no room."""
        assert self._ctx is not None
        data = (ctypes.c_uint8 * snapshot.size).from_buffer(snapshot.data)
        while not llama_cpp.llama_state_seq_set_data(self._ctx, data, snapshot.size, sequence.id):
            if not self._evict_idle(spare=sequence):
                return
        if snapshot in self._snapshots:
            self._snapshots.remove(snapshot)
        sequence.tokens = snapshot.tokens

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
        chosen: list[tuple[_Task, int]] = []
        budget = self.step_tokens
        opening = False
        for task in sorted(self._running, key=lambda t: t.rank(now)):
            tier = task.tier(now)
            if tier == _OVERDUE:
                n = 1
            elif tier in _OPENINGS:
                # On a CPU a step costs what its tokens cost: anything beside the opening in
                # the lead would delay its first words. One opening at a time, shortest first.
                if opening:
                    continue
                opening = True
                n = min(len(task.todo), max(budget, 1))
            elif opening:
                break
            else:
                n = min(len(task.todo), budget)
            if n <= 0:
                continue
            chosen.append((task, n))
            budget -= n
        if not chosen:
            return
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

    def _decode(self, chosen: list[tuple[_Task, int]]) -> list[int] | None:
        """Run one batch; the batch index of each task's logits (-1: none). None: not run."""
        batch = self._batch
        assert batch is not None and self._ctx is not None and self._memory is not None
        outputs = []
        # llama-cpp-python declares ``pos`` as an array of arrays; it is one of positions.
        positions: Any = batch.pos
        i = 0
        for task, n in chosen:
            sequence = task.sequence
            assert sequence is not None
            start = len(sequence.tokens)
            for j, token in enumerate(task.todo[:n]):
                batch.token[i] = token
                positions[i] = start + j
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = sequence.id
                batch.logits[i] = False
                i += 1
            last = task.generates and n == len(task.todo)
            if last:
                batch.logits[i - 1] = True
            outputs.append(i - 1 if last else -1)
        batch.n_tokens = i
        self._spread(chosen)
        while True:
            rc = llama_cpp.llama_decode(self._ctx, batch)
            if rc == 0:
                return outputs
            if rc == 1 and self._evict_idle():
                continue
            break
        if rc == 1:
            self._make_room(chosen)
            return None
        error = RuntimeError(f"llama_decode failed ({rc})")
        for task, _ in chosen:
            assert task.sequence is not None
            llama_cpp.llama_memory_seq_rm(
                self._memory, task.sequence.id, len(task.sequence.tokens), -1
            )
            self._fail(task, error)
        return None

    def _spread(self, chosen: list[tuple[_Task, int]]) -> None:
        """Read a lone prompt on every core while no other model computes: a turn's prompt,
        read after its transcript, is on the way to its first words (about 13 tokens: 84 ms
        on two threads against 121 on one). llama.cpp uses ``n_threads_batch`` for steps of
        more than one token, so single-token steps keep ``n_threads`` whatever is set here."""
        assert self._ctx is not None
        wide = len(chosen) == 1 and chosen[0][1] > 1 and computing_now() == 0
        threads = self.wide_threads if wide else self.n_threads
        if threads != self._batch_threads:
            llama_cpp.llama_set_n_threads(self._ctx, self.n_threads, threads)
            self._batch_threads = threads

    def _evict_idle(self, spare: _Sequence | None = None) -> bool:
        """Move the least recently used idle conversation to RAM; False if there is none."""
        idle = [s for s in self._sequences if s.task is None and s.tokens and s is not spare]
        if not idle:
            return False
        self._spill(min(idle, key=lambda s: s.last_used))
        return True

    def _make_room(self, chosen: list[tuple[_Task, int]]) -> None:
        """The cache is full of running work: put the least urgent job back in the queue, to
        read its tokens again later; a job that does not fit alone fails."""
        assert self._memory is not None
        now = time.monotonic()
        victim = max(self._running, key=lambda t: (t.tier(now), t.order))
        sequence = victim.sequence
        assert sequence is not None
        if len(self._running) == 1:
            self._fail(victim, ValueError("the prompt does not fit in the KV cache"))
            return
        if not victim.generates:
            self._leave(victim)
            return
        victim.todo = sequence.tokens + victim.todo
        llama_cpp.llama_memory_seq_rm(self._memory, sequence.id, -1, -1)
        sequence.tokens = []
        self._running.remove(victim)
        sequence.task = None
        victim.sequence = None
        victim.readmit_after = self._departures
        self._waiting.append(victim)
        log.info("the KV cache is full: a generation waits for room")

    def _sample(self, task: _Task, output: int) -> None:
        assert self._ctx is not None and self._model is not None and task.sampler is not None
        reader = task.plan.reader
        assert reader is not None
        usage = task.plan.usage
        token = llama_cpp.llama_sampler_sample(task.sampler, self._ctx, output)
        if token in self._stops or self._model.is_end_of_generation(token):
            self._finish(task, "stop")
            return
        usage.completion_tokens += 1
        piece = task.decoder.decode(self._model.piece(token))
        if piece and reader.feed(piece):
            self._leave(task)
            return
        if usage.completion_tokens >= task.plan.max_tokens:
            self._finish(task, "length")
            return
        task.todo = [token]

    def _finish(self, task: _Task, reason: StopReason) -> None:
        reader = task.plan.reader
        assert reader is not None
        tail = task.decoder.decode(b"", final=True)
        if not (tail and reader.feed(tail)):
            reader.end(reason)
        self._leave(task)

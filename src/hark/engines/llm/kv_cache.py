"""Which token sequences the shared KV cache holds, and which wait in RAM.

Conversations stay between turns. A generation continues, in place, the idle sequence that
holds the beginning of its tokens (the same conversation, a turn further on); otherwise it
takes an empty sequence, or the least recently used idle one, and when another sequence holds
more of its beginning (another session with the same instructions) it shares that sequence's
cells rather than read those tokens again. Every token decoded attends over every occupied
cell, so idle conversations beyond ``resident_idle_cells`` move to RAM
(``llama_state_seq_get_data``, about 16 ms for 1000 tokens) and come back when their session
speaks again (3 ms); measured with four sessions (flash attention on), a cache holding them all
made a token cost 29 ms by the twentieth turn, against 18 ms at the start. When the cache is
full, idle sequences go to RAM, least recently used first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hark.engines.llm import shared_prefix
from hark.engines.llm.llama_model import LlamaContext

# Idle sequences shorter than this are forgotten rather than moved to RAM.
SPILL_MIN_TOKENS = 32


@dataclass(eq=False, slots=True)
class CacheSequence:
    """A KV-cache sequence: the tokens it holds at positions 0…n-1, and whether a job uses it."""

    id: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: int = 0


@dataclass(eq=False, slots=True)
class _Snapshot:
    """An idle sequence moved out of the KV cache (``llama_state_seq_get_data``)."""

    tokens: list[int]
    data: bytearray
    size: int


class KvCache:
    """The ``sequences`` sequences of ``context``'s KV cache and the conversations saved in RAM.

    Idle sequences beyond ``resident_idle_cells`` tokens move to RAM, up to ``ram_bytes``
    (least recently used forgotten first).
    """

    def __init__(
        self, context: LlamaContext, sequences: int, resident_idle_cells: int, ram_bytes: int
    ) -> None:
        self._context = context
        self.sequences = [CacheSequence(i) for i in range(sequences)]
        self.resident_idle_cells = resident_idle_cells
        self.ram_bytes = ram_bytes
        # Least recently used first.
        self._snapshots: list[_Snapshot] = []
        self._clock = itertools.count(1)

    def place(self, tokens: list[int], limit: int) -> tuple[CacheSequence, int] | None:
        """An idle sequence for a job that reads ``tokens``, holding as much of their beginning
        (at most ``limit`` of them) as the cache or RAM has, and how many that is; the sequence
        holds exactly those. None when every sequence is busy."""

        def shared(held: CacheSequence | _Snapshot) -> int:
            return min(shared_prefix(held.tokens, tokens), limit)

        idle = [s for s in self.sequences if not s.busy]
        if not idle:
            return None
        # The same conversation, further on or gone astray (a speculative reply to words the
        # user did not finish): continue it in place. Another conversation is left whole.
        best = max(self.sequences, key=shared)
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
                self.spill(target)
            self._restore(stored, target)
            cached = shared(target)
        if shared(best) > cached:
            # Another sequence holds more of the beginning (the same instructions, say):
            # share its cells rather than read those tokens again.
            if target.tokens:
                self.spill(target)
            cached = shared(best)
            self._context.copy(best.id, target.id, cached)
            target.tokens = best.tokens[:cached]
        del target.tokens[cached:]
        self.truncate(target)
        self._limit_idle(target)
        return target, cached

    def release(self, sequence: CacheSequence) -> None:
        """Its job has left: the sequence keeps what it read, for the conversation's next turn."""
        sequence.busy = False
        sequence.last_used = next(self._clock)

    def truncate(self, sequence: CacheSequence) -> None:
        """Free the cells of ``sequence`` past the tokens it holds (those of a failed step)."""
        self._context.remove(sequence.id, len(sequence.tokens), -1)

    def clear(self, sequence: CacheSequence) -> None:
        """Free every cell of ``sequence``."""
        self._context.remove(sequence.id)
        sequence.tokens = []

    def evict_idle(self, spare: CacheSequence | None = None) -> bool:
        """Move the least recently used idle conversation to RAM; False if there is none."""
        idle = [s for s in self.sequences if not s.busy and s.tokens and s is not spare]
        if not idle:
            return False
        self.spill(min(idle, key=lambda s: s.last_used))
        return True

    def spill(self, sequence: CacheSequence) -> None:
        """Move an idle sequence's cells to RAM (short ones are not worth it) and free them."""
        tokens = sequence.tokens
        kept = any(s.tokens[: len(tokens)] == tokens for s in self._snapshots)
        if len(tokens) >= SPILL_MIN_TOKENS and self.ram_bytes > 0 and not kept:
            data, written = self._context.save(sequence.id)
            if written:
                self._snapshots = [
                    s for s in self._snapshots if s.tokens != tokens[: len(s.tokens)]
                ]
                self._snapshots.append(_Snapshot(tokens, data, written))
                total = sum(s.size for s in self._snapshots)
                while total > self.ram_bytes:
                    total -= self._snapshots.pop(0).size
        self.clear(sequence)

    def forget_saved(self) -> None:
        """Drop every conversation saved in RAM."""
        self._snapshots.clear()

    def _limit_idle(self, keep: CacheSequence) -> None:
        """Move idle sequences to RAM, least recently used first, until those left in the
        cache hold at most ``resident_idle_cells``: every token decoded attends over every
        occupied cell, so a cache full of idle conversations slows down the busy ones."""
        idle = sorted(
            (s for s in self.sequences if not s.busy and s.tokens and s is not keep),
            key=lambda s: s.last_used,
        )
        held = sum(len(s.tokens) for s in idle)
        for sequence in idle:
            if held <= self.resident_idle_cells:
                break
            held -= len(sequence.tokens)
            self.spill(sequence)

    def _restore(self, snapshot: _Snapshot, sequence: CacheSequence) -> None:
        """Bring a conversation back from RAM into ``sequence`` (empty), making room if need be;
        the sequence stays empty if there is no room."""
        while not self._context.load(snapshot.data, snapshot.size, sequence.id):
            if not self.evict_idle(spare=sequence):
                return
        if snapshot in self._snapshots:
            self._snapshots.remove(snapshot)
        sequence.tokens = snapshot.tokens

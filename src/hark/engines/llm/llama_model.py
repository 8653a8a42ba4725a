"""The llama.cpp calls of the batch scheduler: a GGUF model with its vocabulary, and a context
whose unified KV cache many token sequences share.

Everything here is a thin typed layer over llama-cpp-python's low-level bindings; what to
decode, which sequence holds what, and how to sample are decided elsewhere
(:mod:`hark.engines.llm.continuous_batching`, :mod:`hark.engines.llm.kv_cache`,
:mod:`hark.engines.llm.step_policy`, :mod:`hark.engines.llm.sampling`). The bindings are looked
up on the ``llama_cpp`` module at every call, so that a test may wrap one of them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp


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


@dataclass(frozen=True, slots=True)
class Row:
    """Part of one decode: ``tokens`` of sequence ``sequence`` placed from position ``start``;
    ``logits`` asks for the logits after the last of them."""

    sequence: int
    start: int
    tokens: Sequence[int]
    logits: bool


class LlamaContext:
    """A llama.cpp context over ``model`` with one unified KV cache of ``kv_cells`` cells shared
    by up to ``sequences`` sequences, decoding batches of up to ``batch_size`` tokens."""

    def __init__(
        self,
        model: LlamaModel,
        *,
        kv_cells: int,
        sequences: int,
        batch_size: int,
        n_threads: int,
        flash_attention: bool,
    ) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = kv_cells
        params.n_batch = params.n_ubatch = batch_size
        params.n_seq_max = sequences
        params.kv_unified = True
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
            if flash_attention
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.n_threads = params.n_threads_batch = n_threads
        ctx = llama_cpp.llama_init_from_model(model.model, params)
        if not ctx:
            raise ModelError("llama.cpp could not create a context")
        self.ctx: llama_cpp.llama_context_p = ctx
        self._memory: llama_cpp.llama_memory_t = llama_cpp.llama_get_memory(ctx)
        self._batch: llama_cpp.llama_batch = llama_cpp.llama_batch_init(batch_size, 0, 1)

    def decode(self, rows: Sequence[Row]) -> tuple[int, list[int]]:
        """Run one batch made of ``rows``: llama.cpp's return code (0 done, 1 no room in the KV
        cache, else an error), and for each row the batch index of its logits (-1: none)."""
        batch = self._batch
        outputs = []
        # llama-cpp-python declares ``pos`` as an array of arrays; it is one of positions.
        positions: Any = batch.pos
        i = 0
        for row in rows:
            for j, token in enumerate(row.tokens):
                batch.token[i] = token
                positions[i] = row.start + j
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = row.sequence
                batch.logits[i] = False
                i += 1
            if row.logits:
                batch.logits[i - 1] = True
            outputs.append(i - 1 if row.logits else -1)
        batch.n_tokens = i
        return int(llama_cpp.llama_decode(self.ctx, batch)), outputs

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """Threads for single-token steps and for steps of more than one token."""
        llama_cpp.llama_set_n_threads(self.ctx, n_threads, n_threads_batch)

    def remove(self, sequence: int, start: int = -1, end: int = -1) -> None:
        """Free ``sequence``'s cells at positions ``start``…``end``-1 (-1: open-ended)."""
        llama_cpp.llama_memory_seq_rm(self._memory, sequence, start, end)

    def copy(self, source: int, target: int, end: int) -> None:
        """Let ``target`` share ``source``'s cells at positions 0…``end``-1."""
        llama_cpp.llama_memory_seq_cp(self._memory, source, target, 0, end)

    def save(self, sequence: int) -> tuple[bytearray, int]:
        """``sequence``'s cells as bytes, and how many of them were written (0: failed)."""
        size = llama_cpp.llama_state_seq_get_size(self.ctx, sequence)
        data = bytearray(size)
        written = llama_cpp.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, sequence
        )
        return data, int(written)

    def load(self, data: bytearray, size: int, sequence: int) -> bool:
        """Put cells saved by :meth:`save` back into ``sequence`` (empty); False: no room."""
        buffer = (ctypes.c_uint8 * size).from_buffer(data)
        return bool(llama_cpp.llama_state_seq_set_data(self.ctx, buffer, size, sequence))

    def close(self) -> None:
        """Free the batch and the context (not the model)."""
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self.ctx)

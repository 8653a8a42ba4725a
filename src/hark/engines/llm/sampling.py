"""How a generation picks its next token, and turns tokens back into text."""

from __future__ import annotations

import codecs

import llama_cpp

from hark.engines.llm.llama_model import LlamaContext, LlamaModel


class Sampler:
    """One generation's sampler chain (and so its own grammar state) and the decoder of its
    UTF-8 text, whose characters may span tokens.

    The chain is the one llama-cpp-python's ``Llama.generate`` builds (so that results match
    it): the grammar first, then greedy at temperature 0, else top-k 40, top-p 0.95, min-p
    0.05, the temperature, and a draw from a fixed ``seed``. Raises ``ValueError`` for a
    grammar llama.cpp rejects.
    """

    def __init__(
        self, model: LlamaModel, temperature: float, grammar: str | None, seed: int
    ) -> None:
        self._model = model
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        rules = None
        if grammar is not None:
            rules = llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
            if not rules:
                # llama.cpp says why in its log; a bad schema fails only this request.
                raise ValueError("the tool schema produced a grammar llama.cpp rejects")
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if rules is not None:
            llama_cpp.llama_sampler_chain_add(chain, rules)
        if temperature == 0.0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if temperature > 0.0:
                for sampler in (
                    llama_cpp.llama_sampler_init_top_k(40),
                    llama_cpp.llama_sampler_init_top_p(0.95, 1),
                    llama_cpp.llama_sampler_init_min_p(0.05, 1),
                    llama_cpp.llama_sampler_init_temp(temperature),
                ):
                    llama_cpp.llama_sampler_chain_add(chain, sampler)
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
        self._chain: llama_cpp.llama_sampler_p | None = chain

    def sample(self, context: LlamaContext, output: int) -> int:
        """The next token, from the logits at batch index ``output`` of the last decode."""
        assert self._chain is not None
        return int(llama_cpp.llama_sampler_sample(self._chain, context.ctx, output))

    def text(self, token: int) -> str:
        """The text ``token`` completes (empty while a character is still incomplete)."""
        return self._decoder.decode(self._model.piece(token))

    def flush(self) -> str:
        """What is left of an incomplete character at the end of the generation."""
        return self._decoder.decode(b"", final=True)

    def close(self) -> None:
        """Free the chain."""
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

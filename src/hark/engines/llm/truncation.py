"""Which messages of a conversation go into a prompt that must fit the model's context.

The policy is pure: it sees the chat messages (the instructions first, as a system message),
the tools, a token counter and the prompt budget (the context size less what the reply may
use), and returns the messages to send. The instructions and tool definitions always stay;
what goes is the oldest conversation, preferably whole turns (a cut before a user message),
and never a tool call without its result or a result without its call.

``retention_ratio`` is replayed over the conversation's history: walking forward one user turn
at a time, whenever what is kept outgrows the limit it drops down to the ratio at once. The cut
therefore moves only every few turns, and between moves every prompt begins with the same
tokens, which a prompt cache reuses; being a function of the messages alone, it needs no state
and gives the same cut to a prefill and to the generation after it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from hark.engines.llm import ChatMessage, FunctionTool, Truncation

# How often a prompt that the per-message counts said would fit is measured and cut again.
_VERIFY_ROUNDS = 4


class ContextOverflow(ValueError):
    """The prompt cannot fit the model's context: truncation is disabled, or what must stay
    (the instructions, the tools, the last message) is already too long."""


class TokenCounter(Protocol):
    """Counts tokens the way one model does (exactly, or as an estimate)."""

    def prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]) -> int:
        """The tokens of the whole prompt for ``messages`` and ``tools``."""
        ...

    def message(self, message: ChatMessage) -> int:
        """The tokens ``message`` adds to a prompt."""
        ...


def fit(
    messages: Sequence[ChatMessage],
    tools: Sequence[FunctionTool],
    counter: TokenCounter,
    budget: int,
    truncation: Truncation,
) -> tuple[ChatMessage, ...]:
    """The messages to send so that the prompt takes at most ``budget`` tokens.

    Raises :class:`ContextOverflow` when it cannot: truncation ``disabled`` and the
    conversation too long, or the instructions, tools and last message too long by themselves.
    """
    head = 1 if messages and messages[0].role == "system" else 0
    instructions, conversation = tuple(messages[:head]), tuple(messages[head:])
    fixed = counter.prompt(instructions, tools)
    if fixed > budget:
        raise ContextOverflow(
            f"the instructions and tool definitions take {fixed} tokens, more than the "
            f"{budget} the model's context leaves for the prompt"
        )
    # The messages' own counts first: a long conversation is not measured whole for nothing.
    costs = [counter.message(m) for m in conversation]
    whole = fixed + sum(costs)
    if whole <= budget:
        whole = counter.prompt(messages, tools)
        if whole <= budget:
            return tuple(messages)
    if truncation.mode == "disabled":
        raise ContextOverflow(
            f"the conversation ({whole} tokens) no longer fits the model's context ({budget} "
            "tokens for the prompt) and truncation is disabled"
        )
    limit = budget - fixed
    for _ in range(_VERIFY_ROUNDS):
        cut = choose_cut(conversation, costs, limit, truncation)
        kept = instructions + conversation[cut:]
        total = counter.prompt(kept, tools)
        if total <= budget:
            return kept
        # The per-message counts missed how the messages join: measure again with less room.
        limit -= total - budget
    raise ContextOverflow(f"the conversation does not fit {budget} tokens for the prompt")


def choose_cut(
    conversation: Sequence[ChatMessage],
    costs: Sequence[int],
    limit: int,
    truncation: Truncation,
) -> int:
    """The index of the first message kept so that the kept messages cost at most ``limit``
    (``costs`` are the messages' tokens; the instructions are not among them)."""
    cuts = Cuts(conversation, costs)
    if truncation.mode != "retention_ratio":
        cut = cuts.first_within(0, len(conversation), limit)
    else:
        if truncation.post_instructions_tokens is not None:
            limit = min(limit, truncation.post_instructions_tokens)
        target = math.floor(truncation.retention_ratio * limit)
        cut = 0
        for end in cuts.turn_ends():
            if cuts.cost(cut, end) > limit:
                cut = cuts.retain(cut, end, target)
        if cuts.cost(cut, len(conversation)) > limit:
            cut = cuts.first_within(cut, len(conversation), limit)
    if cut is None:
        last = len(conversation) - 1
        raise ContextOverflow(
            f"the last message alone ({costs[last] if last >= 0 else 0} tokens) does not fit "
            f"the {limit} tokens the model's context leaves after the instructions"
        )
    return cut


class Cuts:
    """Where a conversation may be cut, and what the rest costs.

    A cut at ``i`` keeps messages ``i`` onwards. It is allowed unless it separates a tool
    result from the call it answers; it is preferred before a user message (a whole turn
    goes). At least the last message is always kept.
    """

    def __init__(self, conversation: Sequence[ChatMessage], costs: Sequence[int]) -> None:
        self.conversation = conversation
        self._suffix = [0] * (len(costs) + 1)
        for i in range(len(costs) - 1, -1, -1):
            self._suffix[i] = self._suffix[i + 1] + costs[i]
        calls: dict[str, int] = {}
        # answered_from[i]: the earliest call, among the results at i or later, that a cut
        # at i would separate from its result.
        answered_from = [len(conversation)] * (len(conversation) + 1)
        for i, message in enumerate(conversation):
            for call in message.tool_calls:
                calls[call.call_id] = i
        for i in range(len(conversation) - 1, -1, -1):
            message = conversation[i]
            earliest = answered_from[i + 1]
            if message.role == "tool" and message.tool_call_id in calls:
                earliest = min(earliest, calls[message.tool_call_id])
            answered_from[i] = earliest
        self.allowed = [
            answered_from[i] >= i and conversation[i].role != "tool"
            for i in range(len(conversation))
        ]

    def cost(self, start: int, end: int) -> int:
        """The tokens of messages ``start`` to ``end`` (exclusive)."""
        return self._suffix[start] - self._suffix[end]

    def preferred(self, i: int) -> bool:
        """Whether a cut at ``i`` drops whole turns."""
        return self.allowed[i] and self.conversation[i].role == "user"

    def turn_ends(self) -> list[int]:
        """Where the prompts of the conversation's history ended: after each user message,
        and at its end."""
        ends = [i + 1 for i, m in enumerate(self.conversation) if m.role == "user"]
        if not ends or ends[-1] != len(self.conversation):
            ends.append(len(self.conversation))
        return ends

    def first_within(self, start: int, end: int, limit: int) -> int | None:
        """The earliest cut from ``start`` keeping messages up to ``end`` within ``limit``: a
        preferred one if any fits, else any allowed one; None when none fits."""
        fitting = [i for i in range(start, end) if self.cost(i, end) <= limit]
        for wanted in (self.preferred, lambda i: self.allowed[i]):
            found = next((i for i in fitting if wanted(i)), None)
            if found is not None:
                return found
        return None

    def retain(self, start: int, end: int, target: int) -> int:
        """A new cut after ``start`` that keeps messages up to ``end`` within ``target``, at a
        turn when one fits; else the latest turn that leaves something (or ``start``)."""
        turns = [i for i in range(start + 1, end) if self.preferred(i)]
        within = next((i for i in turns if self.cost(i, end) <= target), None)
        if within is not None:
            return within
        return turns[-1] if turns else start

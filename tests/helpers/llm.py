"""Language-model helpers: a reply, collected, and the text in it."""

from __future__ import annotations

from collections.abc import Iterable

from hark.engines.llm import GenerationRequest, LlmEngine, LlmEvent, TextDelta
from tests.helpers.streams import collect


async def reply(llm: LlmEngine, request: GenerationRequest) -> list[LlmEvent]:
    """Every event of ``llm``'s reply to ``request``, in order, once the reply ends."""
    return await collect(llm.generate(request))


def text_of(events: Iterable[LlmEvent]) -> str:
    """The reply's text: its text deltas joined."""
    return "".join(event.text for event in events if isinstance(event, TextDelta))

"""How long each engine stage of a turn may take before it counts as stalled.

An engine that stops answering (a remote LLM that accepted the request and sends nothing, a
model thread stuck in a call) must fail the one response or transcription waiting for it,
not hold it forever: the client would get ``response.created`` and then nothing, and every
later in-band response would wait behind it. Each stage has its own limit, measured from the
moment the stage starts waiting, so a long reply that keeps streaming never times out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["StageTimeoutError", "StageTimeouts", "limit", "within"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class StageTimeouts:
    """Seconds each stage may wait for its engine.

    ``llm_first_token``: from the request to the LLM's first output (reading a long prompt
    on a CPU, or behind other sessions on a shared model, takes seconds). ``llm_token_gap``:
    between two of its outputs. ``tts_clause``: to synthesise one clause (from asking to its
    last audio). ``asr_request``: one transcription or recognition step, start to end.
    """

    llm_first_token: float = 30.0
    llm_token_gap: float = 15.0
    tts_clause: float = 30.0
    asr_request: float = 60.0


class StageTimeoutError(TimeoutError):
    """An engine stage waited longer than its limit; the message names the stage."""

    def __init__(self, stage: str, seconds: float) -> None:
        super().__init__(f"{stage} timed out: no answer from the engine within {seconds:g} s")
        self.stage = stage
        self.seconds = seconds


async def within(
    items: AsyncIterator[_T], *, first_s: float, gap_s: float, stage: str, gap_stage: str
) -> AsyncGenerator[_T, None]:
    """``items``, failing with ``StageTimeoutError`` when the first takes longer than
    ``first_s`` (named ``stage``) or any later one longer than ``gap_s`` after the one before
    (named ``gap_stage``). ``items`` is closed when this ends, however it ends."""
    seconds, name = first_s, stage
    try:
        while True:
            try:
                async with limit(seconds, name):
                    item = await anext(items)
            except StopAsyncIteration:
                return
            yield item
            seconds, name = gap_s, gap_stage
    finally:
        close = getattr(items, "aclose", None)
        if close is not None:
            await close()


@asynccontextmanager
async def limit(seconds: float, stage: str) -> AsyncIterator[None]:
    """Fail the block with ``StageTimeoutError`` (naming ``stage``) once it has run for
    ``seconds``; a ``TimeoutError`` the engine raises itself passes unchanged."""
    timeout = asyncio.timeout(seconds)
    try:
        async with timeout:
            yield
    except TimeoutError:
        if timeout.expired():
            raise StageTimeoutError(stage, seconds) from None
        raise

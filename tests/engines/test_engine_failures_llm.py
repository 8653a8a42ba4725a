"""The embedded LLM's batch thread killed by an exception in its work (issue 16, point 12):
what it held fails, the thread starts again with the model loaded afresh, and serves.

On the real SmolLM2 through ``BatchScheduler``; the job that kills the thread is an ordinary
job whose ``plan`` raises what no engine code catches.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from hark.engines import health
from hark.engines.health import EngineThreadCrashedError
from hark.engines.llm.continuous_batching import BatchScheduler, Job, Plan, StopReason
from hark.engines.llm.llama_cpp import default_model_path
from hark.engines.llm.llama_model import LlamaModel

from .test_engine_failures import ThreadKiller

# Loads SmolLM2 twice.
pytestmark = pytest.mark.slow

LIVENESS_S = 120.0


class Ask(Job):
    """Generate up to ``max_tokens`` after ``text``; ``outcome`` gets the reply or the error.

    With ``hold``, its first piece of text waits (on the scheduler thread) until it is set.
    """

    def __init__(self, text: str, max_tokens: int, hold: threading.Event | None = None) -> None:
        self.text = text
        self.max_tokens = max_tokens
        self.hold = hold
        self.pieces: list[str] = []
        self.loop = asyncio.get_running_loop()
        self.outcome: asyncio.Future[str] = self.loop.create_future()

    def plan(self, model: LlamaModel) -> Plan:
        return Plan(prompt=model.tokenize(self.text), reader=self, max_tokens=self.max_tokens)

    def feed(self, piece: str) -> bool:
        if self.hold is not None:
            self.hold.wait(LIVENESS_S)
            self.hold = None
        self.pieces.append(piece)
        return False

    def end(self, reason: StopReason) -> None:
        pass

    def failed(self, error: BaseException) -> None:
        self.loop.call_soon_threadsafe(_settle, self.outcome, error)

    def done(self) -> None:
        self.loop.call_soon_threadsafe(_settle, self.outcome, "".join(self.pieces))


class Kill(Job):
    """A job whose planning kills the scheduler thread."""

    def plan(self, model: LlamaModel) -> Plan:
        raise ThreadKiller("killed by the test")


def _settle(future: asyncio.Future[str], outcome: str | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


async def test_a_killed_llm_thread_fails_what_it_held_and_serves_again() -> None:
    scheduler = BatchScheduler(
        default_model_path(),
        n_ctx=512,
        kv_cells=1024,
        sequences=2,
        n_threads=1,
        step_tokens=64,
        seed=0,
    )
    try:
        killer_queued = threading.Event()
        held = Ask("Tell me a story about a dragon.", max_tokens=32, hold=killer_queued)
        scheduler.submit(held)
        scheduler.submit(Kill())
        # The held job is generating (or about to) when the thread next looks at its inbox.
        killer_queued.set()
        with pytest.raises(EngineThreadCrashedError, match="ThreadKiller: killed by the test"):
            await asyncio.wait_for(held.outcome, LIVENESS_S)
        assert scheduler.health.restarts == 1
        assert health.degraded()["llama"] == {"code": "engine_thread_died", "error": "ThreadKiller"}
        assert not scheduler.closed

        # Asked by /readyz, the probe (a job with nothing to do) finds the new thread serving.
        probes = health.probe_degraded()
        assert probes
        async with asyncio.timeout(LIVENESS_S):
            await asyncio.gather(*probes)
        assert "llama" not in health.degraded()

        answer = Ask("Once upon a time, there was a", max_tokens=8)
        scheduler.submit(answer)
        assert (await asyncio.wait_for(answer.outcome, LIVENESS_S)).strip()
    finally:
        await asyncio.to_thread(scheduler.close)

"""Engines: the models behind the session (VAD, ASR, LLM, TTS), behind small streaming interfaces.

An engine knows nothing about sessions or transports. Heavy compute runs off the event loop.
An engine that has figures worth watching implements ``ObservableEngine``: the server hands it
its metrics once, and the engine takes the observers it needs from them, so that the server
need not know which engine batches or fails over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hark.engines.llm.failover import BackendObserver
    from hark.engines.vad.batcher import BatchObserver

__all__ = ["EngineMetrics", "ObservableEngine"]


class EngineMetrics(Protocol):
    """The observers a server's metrics hand to engines (``hark.observability.Metrics``)."""

    def batch_observer(self, model: str) -> BatchObserver:
        """An observer of the batches of ``model`` (e.g. ``vad``)."""
        ...

    def llm_backend_observer(self) -> BackendObserver:
        """An observer of an LLM's backends: requests, failures, failovers and health."""
        ...

    def engine_restarted(self, engine: str) -> None:
        """A thread of ``engine`` died and was started again (:mod:`hark.engines.health`)."""
        ...


@runtime_checkable
class ObservableEngine(Protocol):
    """An engine that reports figures of its own (batches, backends) to the server's metrics."""

    def observe(self, metrics: EngineMetrics) -> None:
        """Take the observers this engine reports to from ``metrics``; called once, at start."""
        ...

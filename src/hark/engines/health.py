"""Whether the engines' shared parts work: what ``/readyz`` says once the engines are warm.

A request that fails for a reason of its own fails alone. A shared part that fails for every
session (a VAD batch that raises, a scheduler thread that died) makes the process unfit for
new sessions until it works again: it reports itself here as degraded, and as working after
its next success. A thread that dies is started again by its owner, which says so here too;
observers (the server's metrics) count the restarts.

``/readyz`` is public, so what it shows of a problem is only a stable code and the
exception's type: a message may carry what an operator must not publish (a backend's URL, a
header it echoed). The message goes to the log, once each time a part becomes degraded (or
fails in a new way); the engines keep their own secrets out of their messages at the source
(:mod:`hark.engines.openai_http` scrubs API keys and URL credentials).

The record is process-wide, like the engines' threads it describes (see also
:mod:`hark.engines.activity`): a part is listed only while it is degraded. A degraded worker
gets no new sessions, so a part need not wait for traffic to show it works again: one that
has a probe (a request of its own, such as a chunk of silence for the VAD) is tried whenever
``/readyz`` is asked (:func:`probe_degraded`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from hark.engines.activity import computing

_T = TypeVar("_T")

__all__ = [
    "ENGINE_FAILED",
    "ENGINE_THREAD_DIED",
    "EngineHealth",
    "EngineThreadCrashedError",
    "RestartObserver",
    "degraded",
    "describe",
    "pause",
    "probe_degraded",
    "restart_delay",
    "watch",
]

_log = logging.getLogger(__name__)

# The codes /readyz gives a degraded part: it failed on a request of everyone's, or its thread
# died (and was started again).
ENGINE_FAILED = "engine_failed"
ENGINE_THREAD_DIED = "engine_thread_died"
# What error events show of an error: its type and the start of its message.
_MAX_PROBLEM = 200
# A thread that dies again at once waits before its next start: it must not spin.
_FIRST_RESTART_DELAY_S = 0.01
_MAX_RESTART_DELAY_S = 5.0
# A probe that takes longer than this has failed (the part stays degraded).
_PROBE_TIMEOUT_S = 10.0


class EngineThreadCrashedError(RuntimeError):
    """The engine thread serving a request died with an exception; the thread was started
    again, the request fails."""


class RestartObserver(Protocol):
    """Told whenever an engine thread is started again after dying."""

    def engine_restarted(self, engine: str) -> None:
        """A thread of ``engine`` (``vad``, ``asr``, ``tts``, ``llm``, ``turn``) died and was
        started again."""
        ...


class EngineHealth:
    """One shared part of an engine (a model, the thread that runs it): thread-safe.

    ``working`` is cheap while nothing is wrong, so that a part can call it after every
    success.
    """

    def __init__(self, engine: str, probe: Callable[[], Awaitable[object]] | None = None) -> None:
        """``engine``: the kind it belongs to, as ``/readyz`` names it (``vad``, ``llama`` …).
        ``probe``: a request of the part's own, whose success calls :meth:`working`."""
        self.engine = engine
        self.restarts = 0
        self._probe = probe
        self._probing = False
        self._problem: dict[str, str] | None = None
        self._consecutive_restarts = 0

    @property
    def problem(self) -> dict[str, str] | None:
        """What is wrong as ``/readyz`` shows it (``code`` and the exception's type,
        ``error``), or None while the part works."""
        return self._problem

    def failed(self, error: BaseException, code: str = ENGINE_FAILED) -> None:
        """The part failed for everyone: degraded until :meth:`working`."""
        problem = {"code": code, "error": type(error).__name__}
        with _LOCK:
            new = problem != self._problem
            self._problem = problem
            _DEGRADED[self] = problem
        if new:
            # Once per change: a part failing on every batch must not flood the log.
            _log.warning("the %s engine is degraded (%s): %s", self.engine, code, describe(error))

    def working(self) -> None:
        """The part served a request: no longer degraded."""
        if self._problem is None and not self._consecutive_restarts:
            return
        with _LOCK:
            self._problem = None
            self._consecutive_restarts = 0
            _DEGRADED.pop(self, None)

    def restarted(self, error: BaseException) -> float:
        """A thread of the part died of ``error`` and is being started again: degraded,
        counted, observers told. Returns how long the new thread should wait before it
        serves (0 at first; longer while it keeps dying before any success)."""
        self.failed(error, ENGINE_THREAD_DIED)
        with _LOCK:
            self.restarts += 1
            delay = restart_delay(self._consecutive_restarts)
            self._consecutive_restarts += 1
            observers = list(_OBSERVERS)
        for observer in observers:
            try:
                observer.engine_restarted(self.engine)
            except Exception:
                _log.exception("a restart observer failed")
        return delay

    def close(self) -> None:
        """The part is gone (its engine closed): nothing to report any more."""
        with _LOCK:
            _DEGRADED.pop(self, None)

    async def _run_probe(self, probe: Callable[[], Awaitable[object]]) -> None:
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                await probe()
        except Exception as exc:
            _log.info("the %s engine is still failing: %s", self.engine, describe(exc))
        finally:
            self._probing = False


def describe(error: BaseException) -> str:
    """A short description of ``error`` for the log and error events (not ``/readyz``)."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text if len(text) <= _MAX_PROBLEM else text[: _MAX_PROBLEM - 1] + "…"


def restart_delay(restarts: int) -> float:
    """Seconds a thread waits before serving after ``restarts`` restarts with no success
    between them: none for the first, then doubling up to a few seconds."""
    if restarts == 0:
        return 0.0
    return min(_MAX_RESTART_DELAY_S, _FIRST_RESTART_DELAY_S * 2 ** (restarts - 1))


def degraded() -> dict[str, dict[str, str]]:
    """The engines with a part degraded now, each with its most recent problem (``code`` and
    the exception's type, ``error``)."""
    with _LOCK:
        parts = list(_DEGRADED.items())
    return {health.engine: dict(problem) for health, problem in parts}


def probe_degraded() -> list[asyncio.Task[None]]:
    """Start the probe of every degraded part that has one and is not being probed already,
    on the running loop; the answer shows in :func:`degraded` once the probe gets through.
    Returns the probes started (nobody need wait for them)."""
    with _LOCK:
        parts = [
            (part, part._probe)
            for part in _DEGRADED
            if part._probe is not None and not part._probing
        ]
        for part, _ in parts:
            part._probing = True
    started = []
    for part, probe in parts:
        task = asyncio.create_task(part._run_probe(probe), name=f"probe {part.engine}")
        _PROBES.add(task)
        task.add_done_callback(_PROBES.discard)
        started.append(task)
    return started


def watch(observer: RestartObserver) -> None:
    """Tell ``observer`` about every restart from now on, for as long as it lives."""
    with _LOCK:
        _OBSERVERS.add(observer)


def pause(seconds: float) -> None:
    """Wait ``seconds`` in a restarted thread before it serves again."""
    if seconds > 0:
        time.sleep(seconds)


class ThreadKeeper:
    """Keeps ``work`` served by daemon threads named ``name``: a thread that dies is replaced
    by another, after ``engine``'s restart delay, and the engine is reported degraded."""

    def __init__(self, name: str, work: Callable[[], None], engine: EngineHealth) -> None:
        self._name = name
        self._work = work
        self._engine = engine

    def start(self, delay_s: float = 0.0) -> None:
        """Start a thread running ``work`` after ``delay_s`` of rest."""
        threading.Thread(target=self._serve, args=(delay_s,), name=self._name, daemon=True).start()

    def replace(self, exc: BaseException) -> EngineThreadCrashedError:
        """The calling thread dies of ``exc``: another takes its place. Returns the error
        for the requests it was serving (to be handed to them once the successor started)."""
        _log.error("a %s thread died; starting another", self._name, exc_info=exc)
        self.start(self._engine.restarted(exc))
        return EngineThreadCrashedError(f"the {self._name} thread died ({describe(exc)})")

    def run(self, call: Callable[[], _T]) -> tuple[_T | None, BaseException | None, bool]:
        """Run ``call`` (model work, counted as computing) on the calling thread, one of
        this keeper's: ``(result, None, True)`` when it returned, the engine then reported
        working; ``(None, exc, True)`` when it raised an ``Exception``, for its requests
        alone; ``(None, crash, False)`` when anything else killed the thread, whose
        successor has started (``crash`` is ``replace``'s error for the requests)."""
        try:
            with computing():
                result = call()
        except Exception as exc:
            return None, exc, True
        except BaseException as exc:
            return None, self.replace(exc), False
        self._engine.working()
        return result, None, True

    def _serve(self, delay_s: float) -> None:
        pause(delay_s)
        try:
            self._work()
        except BaseException as exc:
            self.replace(exc)


_LOCK = threading.Lock()
# The parts degraded now, with their problem (an engine with several shows one of them).
_DEGRADED: dict[EngineHealth, dict[str, str]] = {}
_OBSERVERS: weakref.WeakSet[RestartObserver] = weakref.WeakSet()
# Probes running, kept until they end.
_PROBES: set[asyncio.Task[None]] = set()

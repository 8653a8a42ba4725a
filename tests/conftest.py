"""What the tests of a run share: one end-of-turn model (SmolLM2), loaded once, and one
real redis-server."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from hark.config import Settings
from hark.engines.registry import Engines, build_engines
from hark.engines.turn.llama_cpp import LlamaCppEndOfTurn
from tests.redis_server import RedisServer, running_redis


class BorrowedEndOfTurn:
    """The run's shared end-of-turn model, lent to one engine set.

    It has no ``aclose``, so closing the engine set leaves the model loaded for the next
    server; the model is closed once, when the run ends.
    """

    def __init__(self, turn: LlamaCppEndOfTurn) -> None:
        self._turn = turn

    async def probability(self, transcript: str, *, context: str | None = None) -> float:
        """The shared model's probability that ``transcript`` is a finished turn."""
        return await self._turn.probability(transcript, context=context)

    async def warmup(self) -> None:
        """Load the shared model (once per run) and score one utterance."""
        await self._turn.warmup()


_shared_turn: LlamaCppEndOfTurn | None = None


def shared_end_of_turn_model() -> LlamaCppEndOfTurn:
    """The run's one end-of-turn model, for tests of the model itself; never close it."""
    global _shared_turn
    if _shared_turn is None:
        _shared_turn = LlamaCppEndOfTurn()
    return _shared_turn


def shared_end_of_turn() -> BorrowedEndOfTurn:
    """The end-of-turn model every test server uses, instead of loading one per server."""
    return BorrowedEndOfTurn(shared_end_of_turn_model())


def engines_sharing_turn(settings: Settings) -> Engines:
    """``build_engines(settings)`` with the shared end-of-turn model in place of its own.

    The engine set's own model is never loaded (that happens on warm-up), so dropping it
    costs nothing.
    """
    return dataclasses.replace(build_engines(settings), turn=shared_end_of_turn())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--realtime",
        choices=("only", "skip"),
        default=None,
        help="run only the tests marked realtime, or all but them (scripts/test runs the rest "
        "in parallel first, then these alone); the default runs both",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--realtime only|skip``: keep only the realtime tests, or only the others. This
    narrows whatever ``-m``, ``-k`` and paths chose, so that scripts/test can hand a caller's
    own selection to both of its phases."""
    which = config.getoption("--realtime")
    if which is None:
        return
    want = which == "only"
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        realtime = item.get_closest_marker("realtime") is not None
        (kept if realtime == want else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session", autouse=True)
def _close_shared_end_of_turn() -> Iterator[None]:
    yield
    if _shared_turn is not None:
        _shared_turn.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the run; tests keep apart by key prefix. A missing redis-server
    fails the tests that need it (it is never skipped)."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client for the test, closed after it. Its connections are pooled; a test that
    needs a new connection per request (to be spread over workers) declares its own."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """The cycle collector off for the test (and on again after it, as it was)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

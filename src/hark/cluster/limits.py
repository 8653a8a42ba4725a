"""Per-key limits counted across the fleet: open sessions, requests and tokens per minute.

A key is its owner (``hark.server.auth.Principal.owner``): a real API key and the ephemeral
keys it minted share one budget, whichever worker they reach. Sessions are counted per
worker in the store, so the sessions of a worker that dies stop counting when its heartbeat
expires. Requests (new sessions, calls, client secrets) are counted as they come; response
tokens are added when a response ends, and a key over its tokens per minute gets no new
sessions until the window turns. A limit that is not set costs no store traffic at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from hark.cluster.store import ClusterStore, ClusterUnavailableError

logger = logging.getLogger(__name__)

WINDOW_S = 60
# Token reports waiting for the store; beyond this a new report is dropped (and logged).
MAX_PENDING_REPORTS = 1000


@dataclass(eq=False)
class FleetLimits:
    """The fleet-wide limits of one worker's keys; None for a limit means no limit."""

    store: ClusterStore
    worker_id: str
    _: KW_ONLY
    max_sessions: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    clock: Callable[[], float] = time.time
    _reports: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    async def admit_request(self, owner: str) -> str | None:
        """Count a request of ``owner``; the reason it is refused, or None.

        Raises ``ClusterUnavailableError`` when a limit is set and the store is down.
        """
        now = self.clock()
        if self.requests_per_minute is not None:
            count = await self.store.add_usage(owner, "requests", 1, now, WINDOW_S)
            if count > self.requests_per_minute:
                return (
                    f"Rate limit reached: {self.requests_per_minute} requests per minute for "
                    "this API key. Try again in a minute."
                )
        if self.tokens_per_minute is not None:
            used = await self.store.add_usage(owner, "tokens", 0, now, WINDOW_S)
            if used >= self.tokens_per_minute:
                return (
                    f"Rate limit reached: {self.tokens_per_minute} tokens per minute for this "
                    "API key. Try again in a minute."
                )
        return None

    async def open_session(self, owner: str) -> str | None:
        """Count an open session of ``owner``; the reason it is refused, or None.

        Raises ``ClusterUnavailableError`` when a session limit is set and the store is down.
        """
        if self.max_sessions is None:
            return None
        if await self.store.acquire_session(owner, self.worker_id, self.max_sessions):
            return None
        return (
            f"This API key already has {self.max_sessions} open sessions, the most it may "
            "have at once. Close one and try again."
        )

    async def close_session(self, owner: str) -> None:
        """A session counted by ``open_session`` ended (best effort: a store that is down
        forgets the count with this worker's heartbeat if it never comes back)."""
        if self.max_sessions is None:
            return
        try:
            await self.store.release_session(owner, self.worker_id)
        except ClusterUnavailableError as exc:
            logger.warning("could not release a session count: %s", exc)

    def add_tokens(self, owner: str, tokens: int) -> None:
        """Count a response's tokens, in the background (a response never waits on it)."""
        if self.tokens_per_minute is None or tokens <= 0:
            return
        if len(self._reports) >= MAX_PENDING_REPORTS:
            logger.warning("token usage reports are backed up; one was dropped")
            return
        task = asyncio.create_task(self._report(owner, tokens), name="hark-token-usage")
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _report(self, owner: str, tokens: int) -> None:
        try:
            await self.store.add_usage(owner, "tokens", tokens, self.clock(), WINDOW_S)
        except ClusterUnavailableError as exc:
            logger.warning("could not count %d tokens: %s", tokens, exc)

    async def aclose(self) -> None:
        """Wait for the token reports in flight."""
        if self._reports:
            await asyncio.gather(*self._reports, return_exceptions=True)

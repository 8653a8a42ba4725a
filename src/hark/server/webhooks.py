"""Webhooks as OpenAI sends them: signed the Standard Webhooks way, retried with backoff.

Each delivery is a JSON ``POST`` with three headers: ``webhook-id`` (the event's id, the
same on every attempt, so a receiver can drop duplicates), ``webhook-timestamp`` (UNIX
seconds of this attempt) and ``webhook-signature`` (``hark.protocol.webhook_signing``). A
2xx answer is a delivery; anything else, or no answer, is tried again after a delay that
doubles each time, up to ``max_attempts``. Deliveries wait in a bounded set: when it is
full a new event is dropped (and logged), never queued without end. The secret never
appears in logs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from hark.protocol.webhook_signing import secret_key, signed_headers
from hark.session.ids import IdGenerator

logger = logging.getLogger(__name__)

INCOMING_CALL_EVENT = "realtime.call.incoming"
# Attempts per event: the first try and the retries after it.
DEFAULT_MAX_ATTEMPTS = 6
DEFAULT_FIRST_DELAY_S = 0.5
DEFAULT_MAX_DELAY_S = 30.0
# How long one attempt may take before it counts as failed.
DEFAULT_ATTEMPT_TIMEOUT_S = 10.0
# Deliveries in progress or waiting to retry, all events together.
MAX_PENDING_DELIVERIES = 1000
# A receiver's answer is read only this far (for the log line).
_MAX_ANSWER_BYTES = 1024
# Headers that carry credentials: the webhook passes INVITE headers on, but not these.
_PRIVATE_SIP_HEADERS = frozenset({"authorization", "proxy-authorization"})


def incoming_call_event(
    event_id: str,
    call_id: str,
    sip_headers: Iterable[tuple[str, str]],
    *,
    created_at: int,
    media_security: str | None = "rtp",
) -> dict[str, Any]:
    """The ``realtime.call.incoming`` event of a new SIP call, as the SDK's
    ``RealtimeCallIncomingWebhookEvent`` reads it: the INVITE's headers in order, repeats
    kept, without the authorization headers."""
    data: dict[str, Any] = {
        "call_id": call_id,
        "sip_headers": [
            {"name": name, "value": value}
            for name, value in sip_headers
            if name.lower() not in _PRIVATE_SIP_HEADERS
        ],
    }
    if media_security is not None:
        data["sip_media_security"] = media_security
    return {
        "id": event_id,
        "object": "event",
        "created_at": created_at,
        "type": INCOMING_CALL_EVENT,
        "data": data,
    }


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one event's delivery ended: ``delivered``, after ``attempts`` tries, the last
    answered ``status`` (None: no answer)."""

    event_id: str
    delivered: bool
    attempts: int
    status: int | None


class WebhookSender:
    """Delivers events to one URL, each signed with ``secret``, retried with backoff.

    ``send`` hands an event over and returns at once; ``on_result`` (if given) hears how
    each delivery ended. ``sleep`` waits between attempts (tests pass one that records).
    """

    def __init__(
        self,
        url: str,
        secret: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        first_delay_s: float = DEFAULT_FIRST_DELAY_S,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        max_pending: int = MAX_PENDING_DELIVERIES,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_result: Callable[[Delivery], None] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.url = url
        # Only the derived key is kept; the secret itself is not needed again.
        self._key = secret_key(secret)
        self.max_attempts = max_attempts
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self._timeout = aiohttp.ClientTimeout(total=attempt_timeout_s)
        self.max_pending = max_pending
        self._clock = clock
        self._sleep = sleep
        self.on_result = on_result
        self._ids = IdGenerator()
        self._pending: set[asyncio.Task[Delivery]] = set()
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        # The URL may carry a token in its query; neither it nor the key belongs in a log.
        return f"WebhookSender(pending={len(self._pending)})"

    def new_event_id(self) -> str:
        """A fresh event id (``evt_…``)."""
        return self._ids.new("evt")

    @property
    def pending(self) -> int:
        """Deliveries in progress or waiting to retry."""
        return len(self._pending)

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1 for the first)."""
        return float(min(self.max_delay_s, self.first_delay_s * 2 ** (attempt - 1)))

    def send(self, event: dict[str, Any]) -> asyncio.Task[Delivery] | None:
        """Deliver ``event`` (with an ``id``) in the background; the delivery's task, or
        None when too many are pending already (the event is dropped)."""
        if len(self._pending) >= self.max_pending:
            logger.error(
                "webhook %s dropped: %d deliveries already pending", event["id"], self.max_pending
            )
            return None
        task = asyncio.create_task(self._deliver(event), name=f"webhook {event['id']}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def aclose(self) -> None:
        """Give up the deliveries still pending and close the HTTP session."""
        tasks = list(self._pending)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _deliver(self, event: dict[str, Any]) -> Delivery:
        event_id = str(event["id"])
        body = json.dumps(event, separators=(",", ":")).encode()
        status: int | None = None
        attempt = 0
        while attempt < self.max_attempts:
            attempt += 1
            status = await self._attempt(event_id, body)
            if status is not None and 200 <= status < 300:
                logger.info("webhook %s delivered (attempt %d)", event_id, attempt)
                return self._result(Delivery(event_id, True, attempt, status))
            if attempt < self.max_attempts:
                delay = self.delay(attempt)
                logger.warning(
                    "webhook %s attempt %d failed (%s); retrying in %.1f s",
                    event_id,
                    attempt,
                    status if status is not None else "no answer",
                    delay,
                )
                await self._sleep(delay)
        logger.error("webhook %s not delivered after %d attempts", event_id, attempt)
        return self._result(Delivery(event_id, False, attempt, status))

    def _result(self, delivery: Delivery) -> Delivery:
        if self.on_result is not None:
            try:
                self.on_result(delivery)
            except Exception:
                logger.exception("webhook %s: the result callback failed", delivery.event_id)
        return delivery

    async def _attempt(self, event_id: str, body: bytes) -> int | None:
        """One POST; the answer's status, or None when there was none."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = signed_headers(self._key, event_id, int(self._clock()), body)
        try:
            async with self._session.post(self.url, data=body, headers=headers) as response:
                await response.content.read(_MAX_ANSWER_BYTES)
                return response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The exception's text may name the URL; its type says enough.
            logger.info("webhook %s: no answer (%s)", event_id, type(exc).__name__)
            return None

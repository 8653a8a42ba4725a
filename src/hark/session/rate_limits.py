"""Per-session rate limits over a sliding minute of wall time."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hark.protocol import server_events as se

WINDOW_S = 60


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Per-session limits over a sliding minute, reported in ``rate_limits.updated``."""

    requests_per_minute: int = 600
    tokens_per_minute: int = 200_000


class RateWindow:
    """The responses of the last minute and the tokens they used.

    It slides on the wall time handed in with each response, so a session whose only inputs
    are audio frames (a WebRTC or SIP call) slides it as well as one sending events.
    """

    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits
        # (when a response was admitted, the tokens counted since): one entry per response
        # admitted in the last minute, so at most ``requests_per_minute`` of them.
        self._window: deque[tuple[float, int]] = deque()

    def admit(self, now: float) -> tuple[se.RateLimitsUpdated, bool]:
        """Count a new response at ``now``: the ``rate_limits.updated`` event to send, and
        whether the response goes over a limit."""
        window = self._window
        while window and window[0][0] <= now - WINDOW_S:
            window.popleft()
        window.append((now, 0))
        requests = len(window)
        tokens = sum(t for _, t in window)
        reset = round(max(0.0, window[0][0] + WINDOW_S - now), 3)
        limits = self.limits
        event = se.RateLimitsUpdated(
            rate_limits=[
                se.RateLimit(
                    name="requests",
                    limit=limits.requests_per_minute,
                    remaining=max(0, limits.requests_per_minute - requests),
                    reset_seconds=reset,
                ),
                se.RateLimit(
                    name="tokens",
                    limit=limits.tokens_per_minute,
                    remaining=max(0, limits.tokens_per_minute - tokens),
                    reset_seconds=reset,
                ),
            ]
        )
        over = requests > limits.requests_per_minute or tokens >= limits.tokens_per_minute
        if over:
            # A refused response uses nothing: it must not keep the window full.
            window.pop()
        return event, over

    def count_tokens(self, tokens: int) -> None:
        """A response finished having used ``tokens``: they count until the newest response
        of the window leaves it."""
        if self._window:
            when, counted = self._window[-1]
            self._window[-1] = (when, counted + tokens)

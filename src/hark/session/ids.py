"""Identifiers in OpenAI's style (``item_…``, ``resp_…``), optionally reproducible."""

from __future__ import annotations

import random
import secrets
import string

_ALPHABET = string.ascii_letters + string.digits
# Two base-62 digits at a time, low digit first: half the divisions of one digit at a time.
_PAIRS = [_ALPHABET[d % 62] + _ALPHABET[d // 62] for d in range(62 * 62)]


class IdGenerator:
    """Makes ``prefix_`` + 22 random characters; a seed makes the sequence reproducible."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng: random.Random | None = random.Random(seed) if seed is not None else None

    def new(self, prefix: str) -> str:
        """A fresh identifier such as ``item_Bq3…``: 128 random bits in 22 base-62 digits."""
        # One random integer rather than a choice per character, cut two digits at a time:
        # ids are made for every server event, so this sits on the hot path (about 3 µs).
        n = secrets.randbits(128) if self._rng is None else self._rng.getrandbits(128)
        pairs = []
        for _ in range(11):
            n, pair = divmod(n, 3844)
            pairs.append(_PAIRS[pair])
        return f"{prefix}_{''.join(pairs)}"

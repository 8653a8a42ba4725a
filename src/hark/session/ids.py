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
        """A fresh identifier such as ``item_Bq3…``."""
        if self._rng is None:
            body = "".join(secrets.choice(_ALPHABET) for _ in range(22))
        else:
            body = "".join(self._rng.choice(_ALPHABET) for _ in range(22))
        return f"{prefix}_{body}"

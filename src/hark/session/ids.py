"""Identifiers in OpenAI's style (``item_…``, ``resp_…``), optionally reproducible."""

from __future__ import annotations

import os
import random
import string
import struct
from collections.abc import Iterator

_ALPHABET = string.ascii_letters + string.digits
# Two base-62 digits at a time, low digit first: half the divisions of one digit at a time.
_PAIRS = [_ALPHABET[d % 62] + _ALPHABET[d // 62] for d in range(62 * 62)]
# Random bytes are read from the system this many at a time (256 ids): a read per id was a
# system call for every server event, which a virtual machine makes dear.
_POOL_BYTES = 4096


def _secure_draws() -> Iterator[tuple[int, int]]:
    # A C iterator: taking the next pair is atomic under the GIL, so threads sharing a
    # generator never get the same bits.
    return struct.iter_unpack("<QQ", os.urandom(_POOL_BYTES))


class IdGenerator:
    """Makes ``prefix_`` + 22 random characters; a seed makes the sequence reproducible."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng: random.Random | None = random.Random(seed) if seed is not None else None
        # A seeded generator never reads the system's bytes.
        self._draws: Iterator[tuple[int, int]] = iter(()) if seed is not None else _secure_draws()

    def new(self, prefix: str) -> str:
        """A fresh identifier such as ``item_Bq3…``: 128 random bits in 22 base-62 digits."""
        # One random integer rather than a choice per character, cut two digits at a time:
        # ids are made for every server event, so this sits on the hot path (about 3 µs).
        if self._rng is None:
            draw = next(self._draws, None)
            if draw is None:
                self._draws = _secure_draws()
                draw = next(self._draws)
            n = draw[1] << 64 | draw[0]
        else:
            n = self._rng.getrandbits(128)
        pairs = []
        for _ in range(11):
            n, pair = divmod(n, 3844)
            pairs.append(_PAIRS[pair])
        return f"{prefix}_{''.join(pairs)}"

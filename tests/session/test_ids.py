"""Identifiers: OpenAI's shape, 128 random bits each, reproducible with a seed."""

from __future__ import annotations

import random
import string

import pytest

from hark.session.ids import IdGenerator

ALPHABET = string.ascii_letters + string.digits


def test_ids_are_a_prefix_and_22_base62_digits_of_128_random_bits() -> None:
    ids = IdGenerator(seed=11)
    reference = random.Random(11)
    for _ in range(200):
        made = ids.new("item")
        prefix, _, digits = made.partition("_")
        assert prefix == "item"
        assert len(digits) == 22 and set(digits) <= set(ALPHABET)
        # The digits, low first, spell out exactly the 128-bit number drawn.
        value = sum(ALPHABET.index(c) * 62**i for i, c in enumerate(digits))
        assert value == reference.getrandbits(128)


def test_unseeded_ids_differ_and_seeded_ones_repeat() -> None:
    fresh = IdGenerator()
    assert len({fresh.new("event") for _ in range(1000)}) == 1000
    assert [IdGenerator(seed=3).new("resp") for _ in range(2)] == [
        IdGenerator(seed=3).new("resp") for _ in range(2)
    ]


def test_unseeded_ids_are_the_systems_random_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Read in bulk from os.urandom, 16 bytes (little-endian) per id, and read again once used.
    reads: list[int] = []

    def urandom(size: int) -> bytes:
        reads.append(size)
        return bytes(range(256)) * (size // 256)

    monkeypatch.setattr("hark.session.ids.os.urandom", urandom)
    ids = IdGenerator()
    drawn = [ids.new("event") for _ in range(300)]
    expected = [
        int.from_bytes(bytes(range(k % 16 * 16, k % 16 * 16 + 16)), "little") for k in range(300)
    ]
    values = [sum(ALPHABET.index(c) * 62**i for i, c in enumerate(d.split("_")[1])) for d in drawn]
    assert values == expected
    assert reads == [4096, 4096]

"""The signed routing hint: what a worker writes in its ufrag and what a relay accepts."""

from __future__ import annotations

import base64
import time

import pytest
from aioice.ice import validate_username

from hark.edge.route_hint import (
    HINT_LENGTH,
    HINT_TTL_S,
    HintError,
    Route,
    RouteSigner,
    RouteVerifier,
)

SECRET = "fleet-secret-for-tests-0123456789"
WORKER = "wrk_0123456789ab"


def test_a_signed_ufrag_names_its_worker_and_is_a_valid_ice_ufrag() -> None:
    signer = RouteSigner(SECRET, WORKER)
    ufrag = signer.ufrag()
    validate_username(ufrag)
    assert len(ufrag) == HINT_LENGTH
    assert signer.ufrag() != ufrag
    route = RouteVerifier(SECRET).verify(ufrag)
    assert isinstance(route, Route) and route.worker_id == WORKER


def test_a_hint_carries_its_expiry_and_the_mac_covers_it() -> None:
    signed_at = 1_800_000_000.5
    ufrag = RouteSigner(SECRET, WORKER, clock=lambda: signed_at).ufrag()
    assert RouteVerifier(SECRET).verify(ufrag) == Route(WORKER, int(signed_at) + HINT_TTL_S)
    # Pushing the expiry back (byte 12 is its last) breaks the MAC.
    token = bytearray(base64.b64decode(ufrag))
    token[12] ^= 1
    forged = base64.b64encode(bytes(token)).decode()
    assert RouteVerifier(SECRET).verify(forged) is HintError.BAD_MAC
    fresh = RouteVerifier(SECRET).verify(RouteSigner(SECRET, WORKER).ufrag())
    assert isinstance(fresh, Route) and fresh.expires_at > time.time()


def test_a_hint_rewritten_for_another_worker_is_refused() -> None:
    token = bytearray(base64.b64decode(RouteSigner(SECRET, WORKER).ufrag()))
    token[8] ^= 1  # the last byte of the worker id
    forged = base64.b64encode(bytes(token)).decode()
    assert RouteVerifier(SECRET).verify(forged) is HintError.BAD_MAC


def test_a_hint_signed_with_another_secret_is_of_another_fleet() -> None:
    ufrag = RouteSigner("another-fleet-secret-987654321", WORKER).ufrag()
    assert RouteVerifier(SECRET).verify(ufrag) is HintError.OTHER_FLEET


@pytest.mark.parametrize(
    "ufrag",
    [
        "hark0123456789ab",  # a worker without a fleet secret
        "A" * HINT_LENGTH,  # base64, but version 0
        "AQ" + "A" * (HINT_LENGTH - 2),  # version 1: no expiry
        "!" * HINT_LENGTH,
        "",
    ],
)
def test_malformed_hints_are_refused(ufrag: str) -> None:
    assert RouteVerifier(SECRET).verify(ufrag) is HintError.MALFORMED


def test_secrets_and_worker_ids_are_checked_and_never_shown() -> None:
    with pytest.raises(ValueError):
        RouteSigner("short", WORKER)
    with pytest.raises(ValueError):
        RouteSigner(SECRET, "worker-1")
    assert SECRET not in repr(RouteSigner(SECRET, WORKER))
    assert SECRET not in repr(RouteVerifier(SECRET))

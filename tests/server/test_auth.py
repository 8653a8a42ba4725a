"""API keys, ephemeral keys and the bind policy, without a server."""

from __future__ import annotations

import logging

import pytest

from hark.protocol.session_config import parse_session_config
from hark.server.auth import (
    Authenticator,
    InsecureBindError,
    Principal,
    bearer_key,
    check_bind_policy,
    is_loopback_host,
    owner_of,
    subprotocol_key,
)

KEY = "sk-unit-first"
KEY2 = "sk-unit-second"


class Clock:
    """A settable clock."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_configured_keys_accept_each_key_and_reject_others() -> None:
    auth = Authenticator([KEY, KEY2])
    assert not auth.open
    first, second = auth.authenticate(KEY), auth.authenticate(KEY2)
    assert first is not None and second is not None
    assert first.owner != second.owner
    assert first.ephemeral is None
    for wrong in ("sk-unit", KEY + "x", "", None, "ключ", "\udcff"):
        assert auth.authenticate(wrong) is None


def test_owner_is_stable_and_does_not_contain_the_key() -> None:
    assert owner_of(KEY) == owner_of(KEY)
    assert owner_of(KEY) != owner_of(KEY2)
    assert KEY not in owner_of(KEY) and KEY[:6] not in owner_of(KEY)


def test_no_keys_accepts_any_real_key_but_no_unknown_ephemeral_key() -> None:
    auth = Authenticator([])
    assert auth.open
    principal = auth.authenticate("anything")
    assert principal is not None and principal.owner == owner_of("anything")
    assert auth.authenticate("ek_made_up") is None
    assert auth.authenticate(None) is None


def test_minted_key_carries_session_and_owner_until_it_expires() -> None:
    clock = Clock()
    auth = Authenticator([KEY], clock=clock)
    owner = auth.authenticate(KEY)
    assert owner is not None
    session = parse_session_config({"instructions": "Speak like a pirate."})
    value, record = auth.mint(owner, session, "sess_1", 10)
    assert value.startswith("ek_") and len(value) > 32
    assert record.expires_at == int(clock.now) + 10
    assert value not in repr(record)

    principal = auth.authenticate(value)
    assert principal is not None and principal.ephemeral is record
    assert principal.owner == owner.owner
    assert principal.ephemeral.session.instructions == "Speak like a pirate."

    clock.now += 9.5
    assert auth.authenticate(value) is not None
    clock.now += 0.5
    assert auth.authenticate(value) is None


def test_ephemeral_key_cannot_mint() -> None:
    auth = Authenticator([KEY])
    owner = auth.authenticate(KEY)
    assert owner is not None
    value, _ = auth.mint(owner, parse_session_config({}), "sess_1", 600)
    ephemeral = auth.authenticate(value)
    assert ephemeral is not None
    with pytest.raises(PermissionError):
        auth.mint(ephemeral, parse_session_config({}), "sess_2", 600)


def test_mint_checks_the_lifetime_and_prunes_expired_keys() -> None:
    clock = Clock()
    auth = Authenticator([KEY], clock=clock)
    owner = Principal(owner=owner_of(KEY))
    for seconds in (9, 7201):
        with pytest.raises(ValueError):
            auth.mint(owner, parse_session_config({}), "sess_x", seconds)
    auth.mint(owner, parse_session_config({}), "sess_1", 10)
    auth.mint(owner, parse_session_config({}), "sess_2", 7200)
    assert auth.live_ephemeral_keys() == 2
    clock.now += 11
    auth.mint(owner, parse_session_config({}), "sess_3", 10)
    assert auth.live_ephemeral_keys() == 2


@pytest.mark.parametrize("host", ["127.0.0.1", "127.5.6.7", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.1", "example.com", "192.168.1.2"])
def test_non_loopback_hosts(host: str) -> None:
    assert not is_loopback_host(host)


def test_bind_policy(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(InsecureBindError, match="HARK_API_KEYS"):
        check_bind_policy("0.0.0.0", [])
    check_bind_policy("0.0.0.0", [KEY])
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        check_bind_policy("127.0.0.1", [])
    assert any(r.levelno == logging.WARNING and "NO API KEYS" in r.message for r in caplog.records)


def test_key_extraction() -> None:
    assert bearer_key({"Authorization": f"Bearer {KEY}"}) == KEY
    assert bearer_key({"Authorization": f"bearer   {KEY} "}) == KEY
    assert bearer_key({"Authorization": f"Basic {KEY}"}) is None
    assert bearer_key({"Authorization": "Bearer "}) is None
    assert bearer_key({}) is None
    offered = f"realtime, openai-insecure-api-key.{KEY}, openai-beta.realtime-v1"
    assert subprotocol_key({"Sec-WebSocket-Protocol": offered}) == KEY
    assert subprotocol_key({"Sec-WebSocket-Protocol": "realtime"}) is None

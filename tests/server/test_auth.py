"""API keys, ephemeral keys (in a real embedded cluster store) and the bind policy, without
a server."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hark.cluster import open_store
from hark.cluster.store import ClusterStore
from hark.config import is_loopback_host
from hark.protocol.session_config import parse_session_config
from hark.server.auth import (
    Authenticator,
    InsecureBindError,
    Principal,
    bearer_key,
    check_bind_policy,
    owner_of,
    subprotocol_key,
)

KEY = "sk-unit-first"
KEY2 = "sk-unit-second"


class Clock:
    """A settable clock, starting now: the store also prunes by its own (real) clock."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ClusterStore]:
    """An embedded cluster store of its own."""
    opened = open_store(None, tmp_path)
    await opened.start()
    yield opened
    await opened.aclose()


async def test_configured_keys_accept_each_key_and_reject_others(store: ClusterStore) -> None:
    auth = Authenticator([KEY, KEY2], store)
    assert not auth.open
    first, second = await auth.authenticate(KEY), await auth.authenticate(KEY2)
    assert first is not None and second is not None
    assert first.owner != second.owner
    assert first.ephemeral is None
    for wrong in ("sk-unit", KEY + "x", "", None, "ключ", "\udcff"):
        assert await auth.authenticate(wrong) is None


def test_owner_is_stable_and_does_not_contain_the_key() -> None:
    assert owner_of(KEY) == owner_of(KEY)
    assert owner_of(KEY) != owner_of(KEY2)
    assert KEY not in owner_of(KEY) and KEY[:6] not in owner_of(KEY)


async def test_no_keys_accepts_any_real_key_but_no_unknown_ephemeral_key(
    store: ClusterStore,
) -> None:
    auth = Authenticator([], store)
    assert auth.open
    principal = await auth.authenticate("anything")
    assert principal is not None and principal.owner == owner_of("anything")
    assert await auth.authenticate("ek_made_up") is None
    assert await auth.authenticate(None) is None


async def test_minted_key_carries_session_and_owner_until_it_expires(
    store: ClusterStore,
) -> None:
    clock = Clock()
    auth = Authenticator([KEY], store, clock=clock)
    owner = await auth.authenticate(KEY)
    assert owner is not None
    session = parse_session_config({"instructions": "Speak like a pirate."})
    value, record = await auth.mint(owner, session, "sess_1", 10)
    assert value.startswith("ek_") and len(value) > 32
    assert record.expires_at == int(clock.now) + 10
    assert value not in repr(record)

    principal = await auth.authenticate(value)
    assert principal is not None and principal.ephemeral == record
    assert principal.owner == owner.owner
    assert principal.ephemeral.session.instructions == "Speak like a pirate."

    clock.now += 9.5
    assert await auth.authenticate(value) is not None
    clock.now += 0.5
    assert await auth.authenticate(value) is None


async def test_a_key_minted_by_one_worker_is_valid_on_another_until_it_expires(
    store: ClusterStore,
) -> None:
    clock = Clock()
    minting = Authenticator([KEY], store, clock=clock)
    other = Authenticator([KEY], store, clock=clock)
    owner = Principal(owner=owner_of(KEY))
    session = parse_session_config({"instructions": "Be brief."})
    value, record = await minting.mint(owner, session, "sess_1", 60)
    found = await other.authenticate(value)
    assert found is not None and found.ephemeral is not None
    assert (found.owner, found.ephemeral.session_id) == (owner.owner, "sess_1")
    assert found.ephemeral.session.instructions == "Be brief."
    assert found.ephemeral.expires_at == record.expires_at
    clock.now += 60
    assert await other.authenticate(value) is None
    assert await minting.authenticate(value) is None


async def test_ephemeral_key_cannot_mint(store: ClusterStore) -> None:
    auth = Authenticator([KEY], store)
    owner = await auth.authenticate(KEY)
    assert owner is not None
    value, _ = await auth.mint(owner, parse_session_config({}), "sess_1", 600)
    ephemeral = await auth.authenticate(value)
    assert ephemeral is not None
    with pytest.raises(PermissionError):
        await auth.mint(ephemeral, parse_session_config({}), "sess_2", 600)


async def test_mint_checks_the_lifetime(store: ClusterStore) -> None:
    auth = Authenticator([KEY], store)
    owner = Principal(owner=owner_of(KEY))
    for seconds in (9, 7201):
        with pytest.raises(ValueError):
            await auth.mint(owner, parse_session_config({}), "sess_x", seconds)
    for seconds in (10, 7200):
        value, record = await auth.mint(owner, parse_session_config({}), "sess_1", seconds)
        assert record.expires_at - record.created_at == seconds
        assert await auth.authenticate(value) is not None


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

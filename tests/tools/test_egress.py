"""The egress policy: which addresses a client-named URL may reach, in every form an address
can take, and the allow-list that opens more."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import pytest

from hark.tools.egress import EgressPolicy, EgressPolicyError, EgressRefused, refused_range


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "shared (CGNAT)"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.251", "multicast"),
        ("255.255.255.255", "reserved"),
        ("198.18.0.1", "benchmarking"),
        ("192.0.2.1", "documentation"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fd00::1", "unique local"),
        ("fe80::1", "link-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        # IPv6 forms of an IPv4 address are judged by that address.
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("::127.0.0.1", "loopback"),
        ("64:ff9b::10.0.0.1", "private"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("2002:7f00:1::", "loopback"),
        ("2002:c0a8:101::1", "private"),
    ],
)
def test_non_public_addresses_are_refused(address: str, why: str) -> None:
    assert refused_range(ipaddress.ip_address(address)) == why
    assert EgressPolicy().refusal(ipaddress.ip_address(address)) == why


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "100.128.0.1",
        "172.32.0.1",
        "2606:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::8.8.8.8",
        "2002:0808:0808::1",
    ],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert refused_range(ipaddress.ip_address(address)) is None


def test_the_allow_list_opens_networks_and_their_mapped_forms() -> None:
    policy = EgressPolicy.parse(["10.0.0.0/8", " 127.0.0.2 ", "fd00::/8", ""])
    assert policy.refusal(ipaddress.ip_address("10.9.9.9")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:10.9.9.9")) is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.2")) is None
    assert policy.refusal(ipaddress.ip_address("fd12::1")) is None
    # Only what it names.
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) == "loopback"
    assert policy.refusal(ipaddress.ip_address("192.168.0.1")) == "private"
    assert policy.refusal(ipaddress.ip_address("169.254.169.254")) == "link-local"


def test_allowed_host_names() -> None:
    policy = EgressPolicy.parse(["mcp.internal", "*.svc.cluster.local"])
    assert policy.allows_host("mcp.internal")
    assert policy.allows_host("MCP.Internal.")
    assert policy.allows_host("tools.ns.svc.cluster.local")
    assert not policy.allows_host("svc.cluster.local.evil.example")
    assert not policy.allows_host("other.internal")


@pytest.mark.parametrize("entry", ["http://10.0.0.1/", "10.0.0.0/33", "a b", "under_score.x"])
def test_bad_allow_list_entries_are_refused(entry: str) -> None:
    with pytest.raises(EgressPolicyError):
        EgressPolicy.parse([entry])


async def test_literal_addresses_are_refused_without_a_lookup() -> None:
    policy = EgressPolicy()
    for host in ("127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "[::ffff:127.0.0.1]"):
        with pytest.raises(EgressRefused, match="does not connect"):
            await policy.addresses(host, 80)
    assert await policy.addresses("8.8.8.8", 80) == ["8.8.8.8"]
    assert await EgressPolicy.parse(["127.0.0.1"]).addresses("127.0.0.1", 80) == ["127.0.0.1"]


async def test_a_name_that_resolves_to_loopback_is_refused() -> None:
    # localhost resolves to 127.0.0.1 (and ::1) on every machine.
    with pytest.raises(EgressRefused, match="localhost resolves only to"):
        await EgressPolicy().addresses("localhost", 80)
    allowed = await EgressPolicy.parse(["127.0.0.0/8", "::1"]).addresses("localhost", 80)
    assert "127.0.0.1" in allowed
    assert await EgressPolicy.parse(["localhost"]).addresses("localhost", 80)


def answers(*addresses: str) -> Any:
    """A stand-in for the loop's ``getaddrinfo`` that answers ``addresses``, in order."""

    async def getaddrinfo(host: str, port: int, **_: Any) -> list[Any]:
        return [
            (
                socket.AF_INET6 if ":" in a else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (a, port),
            )
            for a in addresses
        ]

    return getaddrinfo


async def test_only_the_public_addresses_of_a_name_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "getaddrinfo", answers("10.0.0.7", "93.184.215.14", "::1"))
    assert await EgressPolicy().addresses("mixed.example", 443) == ["93.184.215.14"]
    monkeypatch.setattr(loop, "getaddrinfo", answers("169.254.169.254", "fd00::1"))
    with pytest.raises(EgressRefused) as refused:
        await EgressPolicy().addresses("metadata.example", 80)
    # The client learns the name was refused, not what it resolved to.
    assert "169.254" not in str(refused.value)

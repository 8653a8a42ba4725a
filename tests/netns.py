"""Hosts a test makes for itself: network namespaces on one bridge, joined to the test's own
namespace. Addresses are inside a /16 the caller names; nothing else is contacted."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


@dataclass
class Lan:
    """The hosts (namespace, address) in the order they were asked for, and the test's own
    address on their bridge."""

    hosts: list[tuple[str, str]]
    gateway: str


def _bridge_port(link: str, bridge_ns: str) -> None:
    """Move ``link`` into the bridge's namespace and plug it into the bridge."""
    _ip("link", "set", link, "netns", bridge_ns)
    _ip("link", "set", link, "master", "br0", netns=bridge_ns)
    _ip("link", "set", link, "up", netns=bridge_ns)


@contextlib.contextmanager
def bridged_hosts(prefix: str, network: str, names: Sequence[str]) -> Iterator[Lan]:
    """One namespace per name, each with a veth on a bridge (in a namespace of its own) that
    the test's namespace joins too; all removed on exit.

    ``prefix`` (two letters) keeps the namespace and link names of one test apart from
    another's; ``network`` is the first two octets of the test's own address range (a random
    /24 inside it is used, the test at .1 and the hosts from .11). Where namespaces are not
    permitted the test is skipped, except in CI, which runs as root: there it fails.
    """
    if shutil.which("ip") is None:
        pytest.fail("the ip command (iproute2) is missing; scripts/test installs it")
    tag = secrets.token_hex(2)
    subnet = f"{network}.{100 + secrets.randbelow(100)}"
    bridge_ns = f"{prefix}-br-{tag}"
    root_link = f"{prefix}r{tag}"
    try:
        _ip("netns", "add", bridge_ns)
    except subprocess.CalledProcessError as exc:
        reason = f"network namespaces are not permitted here: {exc.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    namespaces = [bridge_ns]
    try:
        _ip("link", "add", "br0", "type", "bridge", netns=bridge_ns)
        _ip("link", "set", "br0", "up", netns=bridge_ns)
        hosts = []
        for index, name in enumerate(names, start=1):
            ns = f"{prefix}-{name}-{tag}"
            _ip("netns", "add", ns)
            namespaces.append(ns)
            near, far = f"{prefix}{index}{tag}", f"{prefix}{index}{tag}b"
            _ip("link", "add", near, "type", "veth", "peer", "name", far)
            _ip("link", "set", near, "netns", ns)
            _bridge_port(far, bridge_ns)
            address = f"{subnet}.{10 + index}"
            _ip("addr", "add", f"{address}/24", "dev", near, netns=ns)
            _ip("link", "set", near, "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)
            hosts.append((ns, address))
        _ip("link", "add", root_link, "type", "veth", "peer", "name", f"{root_link}b")
        _bridge_port(f"{root_link}b", bridge_ns)
        _ip("addr", "add", f"{subnet}.1/24", "dev", root_link)
        _ip("link", "set", root_link, "up")
        yield Lan(hosts, f"{subnet}.1")
    finally:
        for ns in namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", root_link], capture_output=True)

"""TLS on the worker-to-worker hop: a front worker's ``Forwarder`` passing a client's request,
bearer key and all, to an owner's hop listener, over real sockets with certificates from a
CA made for the test."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hark.cluster.forwarding import FORWARDED_HEADER, Forwarder, ForwardError
from hark.cluster.hop_tls import HopTls, HopTlsError, hop_url
from hark.cluster.store import WorkerInfo
from hark.config import ConfigError, load_settings
from hark.server.workers import worker_settings

from .fleet_ca import FleetCa

KEY = "sk-hop-tls-test-0123456789"
PATH = "/v1/realtime/calls/rtc_hop/hangup"


@contextlib.asynccontextmanager
async def serving(app: web.Application, tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """``app`` on a free loopback port (TLS with ``tls``); yields the port."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def owner(seen: list[dict[str, Any]]) -> web.Application:
    """The worker that owns the call: records what reached it and how."""

    async def hangup(request: web.Request) -> web.Response:
        assert request.transport is not None
        peer = request.transport.get_extra_info("peercert")
        seen.append(
            {
                "secure": request.secure,
                "authorization": request.headers.get("Authorization"),
                "forwarded_by": request.headers.get(FORWARDED_HEADER),
                "peer": dict(item for rdn in peer["subject"] for item in rdn) if peer else None,
            }
        )
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post(PATH, hangup)
    return app


def front(forwarder: Forwarder, target: str) -> web.Application:
    """The worker the client reached, which passes the request to ``target``."""

    async def hangup(request: web.Request) -> web.Response:
        worker = WorkerInfo(id="wrk_owner", url=target)
        try:
            return await forwarder.http(request, worker, await request.read())
        except ForwardError as exc:
            return web.Response(status=503, text=str(exc))

    app = web.Application()
    app.router.add_post(PATH, hangup)
    app.on_cleanup.append(lambda _: forwarder.aclose())
    return app


async def hang_up_through(front_port: int) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as client,
        client.post(
            f"http://127.0.0.1:{front_port}{PATH}", headers={"Authorization": f"Bearer {KEY}"}
        ) as response,
    ):
        return response.status, await response.text()


def hop_tls(ca: FleetCa, name: str) -> HopTls:
    cert, key = ca.issue(name)
    return HopTls.load(str(cert), str(key), str(ca.cert))


async def test_the_clients_key_crosses_the_hop_over_mutual_tls(tmp_path: Path) -> None:
    ca = FleetCa(tmp_path / "ca")
    seen: list[dict[str, Any]] = []
    async with serving(owner(seen), hop_tls(ca, "worker-b").server) as owner_port:
        forwarder = Forwarder("wrk_front", tls=hop_tls(ca, "worker-a").client)
        target = hop_url("http://127.0.0.1:8000", owner_port)
        assert target == f"https://127.0.0.1:{owner_port}"
        async with serving(front(forwarder, target)) as front_port:
            assert await hang_up_through(front_port) == (200, '{"ok": true}')
    assert seen == [
        {
            "secure": True,
            "authorization": f"Bearer {KEY}",
            "forwarded_by": "wrk_front",
            "peer": {"commonName": "worker-a"},
        }
    ]


async def test_a_fleet_with_a_hop_ca_never_forwards_to_a_plain_url(tmp_path: Path) -> None:
    # A worker that registered http:// (configured without TLS) gets no key in clear.
    ca = FleetCa(tmp_path / "ca")
    seen: list[dict[str, Any]] = []
    async with serving(owner(seen)) as owner_port:
        forwarder = Forwarder("wrk_front", tls=hop_tls(ca, "worker-a").client)
        async with serving(front(forwarder, f"http://127.0.0.1:{owner_port}")) as front_port:
            status, text = await hang_up_through(front_port)
    assert status == 503 and "plain http URL" in text
    assert seen == []


async def test_no_hop_goes_to_a_worker_another_ca_certified(tmp_path: Path) -> None:
    ca, stranger_ca = FleetCa(tmp_path / "ca"), FleetCa(tmp_path / "other", "another CA")
    seen: list[dict[str, Any]] = []
    async with serving(owner(seen), hop_tls(stranger_ca, "impostor").server) as owner_port:
        forwarder = Forwarder("wrk_front", tls=hop_tls(ca, "worker-a").client)
        target = f"https://127.0.0.1:{owner_port}"
        async with serving(front(forwarder, target)) as front_port:
            status, text = await hang_up_through(front_port)
    assert status == 503 and "did not answer" in text
    assert seen == []


@pytest.mark.parametrize("client_cert", ["none", "another CA's"])
async def test_the_hop_listener_takes_only_workers_the_ca_certified(
    tmp_path: Path, client_cert: str
) -> None:
    ca = FleetCa(tmp_path / "ca")
    seen: list[dict[str, Any]] = []
    context = ssl.create_default_context(cafile=str(ca.cert))
    context.check_hostname = False
    if client_cert != "none":
        cert, key = FleetCa(tmp_path / "other", "another CA").issue("stranger")
        context.load_cert_chain(cert, key)
    async with (
        serving(owner(seen), hop_tls(ca, "worker-b").server) as owner_port,
        aiohttp.ClientSession() as client,
    ):
        with pytest.raises(aiohttp.ClientError):
            async with client.post(
                f"https://127.0.0.1:{owner_port}{PATH}",
                headers={"Authorization": f"Bearer {KEY}"},
                ssl=context,
            ) as response:
                await response.read()
    assert seen == []


def test_a_missing_or_mismatched_file_is_a_clear_error(tmp_path: Path) -> None:
    ca = FleetCa(tmp_path / "ca")
    cert, key = ca.issue("worker-a")
    _, other_key = ca.issue("worker-b")
    with pytest.raises(HopTlsError, match="hop TLS"):
        HopTls.load(str(cert), str(other_key), str(ca.cert))
    with pytest.raises(HopTlsError, match="hop TLS"):
        HopTls.load(str(cert), str(key), str(tmp_path / "missing.pem"))


def test_the_hop_settings_go_together_and_give_each_worker_a_port() -> None:
    with pytest.raises(ConfigError, match="go together"):
        load_settings({"hop_tls_cert": "a.pem", "hop_tls_key": "a.key"}, env={})
    files = {"HARK_HOP_TLS_CERT": "a.pem", "HARK_HOP_TLS_KEY": "a.key", "HARK_HOP_TLS_CA": "ca"}
    settings = load_settings({}, env={**files, "HARK_HOP_PORT": "9000"})
    assert [worker_settings(settings, i).hop_port for i in range(2)] == [9000, 9001]
    assert worker_settings(load_settings({}, env=files), 1).hop_port == 0

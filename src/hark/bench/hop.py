"""``hark bench hop``: what the internal hop between workers adds to a call's requests.

Two workers of one fleet are given (``--url`` and ``--other``). A WebRTC call is made on
one of them (its owner); a sideband socket is opened on the owner and another on the other
worker, which pipes it to the owner. The bench then alternates ``session.update`` round
trips (sent, until ``session.updated`` comes back) on the two sockets, and hangs up calls
alternately on the owner and through the other worker. The difference of the two sides'
percentiles is what the hop costs. Offers for the hangup calls carry ``X-Hark-Forwarded``
so that they stay on the owner instead of being placed; they are never connected and are
hung up within their setup time.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from hark.bench.command import Bench, Result, arguments, config_from
from hark.bench.report import ServerUrl, api_key, percentiles
from hark.bench.webrtc import CallClient, post_offer
from hark.cluster.forwarding import WORKER_HEADER
from hark.config.options import BenchOption, shared


async def _worker_of(http: aiohttp.ClientSession, server: ServerUrl) -> str:
    async with http.get(server.http("/healthz")) as response:
        return response.headers[WORKER_HEADER]


async def _round_trips(
    direct: aiohttp.ClientWebSocketResponse,
    via: aiohttp.ClientWebSocketResponse,
    count: int,
) -> dict[str, list[float]]:
    """``session.update`` → ``session.updated`` times (ms) on each socket, alternating.

    Every sideband sees every event of the call, so each side also reads the copy of the
    other side's answer before it sends again.
    """
    times: dict[str, list[float]] = {"direct": [], "via": []}
    sockets = {"direct": direct, "via": via}

    async def next_updated(ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            message = await ws.receive()
            if message.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"the sideband closed: {message.type!r}")
            if json.loads(message.data)["type"] == "session.updated":
                return

    for i in range(count):
        for side in ("direct", "via") if i % 2 else ("via", "direct"):
            ws = sockets[side]
            started = time.perf_counter()
            await ws.send_json(
                {"type": "session.update", "session": {"type": "realtime", "instructions": str(i)}}
            )
            await next_updated(ws)
            times[side].append((time.perf_counter() - started) * 1000)
            other = sockets["via" if side == "direct" else "direct"]
            await next_updated(other)
    return times


async def _offer() -> str:
    """An offer as the bench's WebRTC client makes it, never connected: it is posted once
    per call of the hangup round trips."""
    client = CallClient()
    try:
        return await client.offer()
    finally:
        await client.close()


async def _hangups(
    http: aiohttp.ClientSession, owner: ServerUrl, other: ServerUrl, api_key: str, count: int
) -> dict[str, list[float]]:
    """Hang-up times (ms) of calls on the owner, alternately direct and through the other."""
    offer = await _offer()
    headers = {"Authorization": f"Bearer {api_key}"}
    times: dict[str, list[float]] = {"direct": [], "via": []}
    for i in range(count):
        # Kept on the owner: the hop measured is the hangup's, not the offer's.
        answer = await post_offer(
            http, owner.http(), api_key, offer, headers={"X-Hark-Forwarded": "bench"}
        )
        call_id = answer.location.rsplit("/", 1)[-1]
        side, server = ("direct", owner) if i % 2 else ("via", other)
        started = time.perf_counter()
        async with http.post(
            server.http(f"/v1/realtime/calls/{call_id}/hangup"), headers=headers
        ) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"hangup: {response.status}")
        times[side].append((time.perf_counter() - started) * 1000)
    return times


def _summary(times: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, values in times.items():
        out[side] = {"n": len(values), **percentiles(values, (50, 90, 99), digits=3)}
    out["added"] = {
        f"p{q}": round(out["via"][f"p{q}"] - out["direct"][f"p{q}"], 3) for q in (50, 90, 99)
    }
    return out


async def run_hop_bench(url: str, other: str, *, api_key: str, count: int) -> dict[str, Any]:
    """Measure the hop between the workers at ``url`` and ``other``; the report."""
    first, second = ServerUrl.parse(url), ServerUrl.parse(other)
    async with aiohttp.ClientSession() as http:
        workers = {await _worker_of(http, first): first, await _worker_of(http, second): second}
        if len(workers) != 2:
            raise RuntimeError("--url and --other reach the same worker")
        client = CallClient()
        try:
            await client.connect(http, first.http(), api_key=api_key)
            await asyncio.wait_for(client.opened.wait(), 30)
            if client.worker not in workers:
                raise RuntimeError(f"the call landed on worker {client.worker}, not on either")
            owner = workers[client.worker]
            via = second if owner == first else first
            sideband = f"/v1/realtime?call_id={client.call_id}"
            headers = {"Authorization": f"Bearer {api_key}"}
            async with (
                http.ws_connect(owner.ws(sideband), headers=headers) as d,
                http.ws_connect(via.ws(sideband), headers=headers) as v,
            ):
                events = await _round_trips(d, v, count)
        finally:
            await client.close()
        hangups = await _hangups(http, owner, via, api_key, count)
    return {
        "owner": owner.http(),
        "via": via.http(),
        "sideband_round_trip_ms": _summary(events),
        "hangup_ms": _summary(hangups),
    }


def format_summary(report: dict[str, Any]) -> str:
    """A human summary of the report."""
    lines = [f"owner {report['owner']}, reached directly and through {report['via']}"]
    for name, title in (
        ("sideband_round_trip_ms", "sideband session.update round trip"),
        ("hangup_ms", "hangup"),
    ):
        figures = report[name]
        lines.append(f"{title} (n={figures['direct']['n']} each way):")
        for side in ("direct", "via", "added"):
            row = figures[side]
            lines.append(
                f"  {side:7s} p50 {row['p50']:7.2f} ms  p90 {row['p90']:7.2f} ms  "
                f"p99 {row['p99']:7.2f} ms"
            )
    return "\n".join(lines)


OPTIONS: tuple[BenchOption | str, ...] = (
    shared("url", help="one worker's HTTP root"),
    BenchOption("other", "another worker of the same fleet", required=True),
    BenchOption("count", "round trips each way", int, 200),
    "api_key",
    "json",
)


@dataclass(frozen=True)
class HopBenchConfig:
    """What ``hark bench hop`` measures: ``run_hop_bench``'s arguments."""

    url: str
    other: str
    api_key: str
    count: int


def hop_config(options: dict[str, Any]) -> HopBenchConfig:
    """The config of ``hark bench hop``'s parsed options."""
    return config_from(HopBenchConfig, options, api_key=api_key(options["api_key"]))


def run(config: HopBenchConfig) -> Result:
    """Measure; the report and its summary."""
    report = asyncio.run(run_hop_bench(**arguments(config)))
    return Result(report, format_summary(report))


BENCH = Bench("hop", OPTIONS, hop_config, run, errors=(RuntimeError, aiohttp.ClientError))
configure_parser, command = BENCH.configure_parser, BENCH.command

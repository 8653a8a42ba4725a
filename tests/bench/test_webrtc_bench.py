"""``hark bench webrtc`` against a real server on the fake engines."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from hark.bench import webrtc as webrtc_bench
from hark.bench.webrtc import (
    ReceivedFrame,
    format_summary,
    measure_capacity,
    measure_setup,
    run_webrtc_bench,
)
from hark.cli import build_parser
from hark.config import Settings
from hark.server.app import create_app, make_runner
from tests.conftest import engines_sharing_turn

# Bounds a hang, never speed.
LIVENESS_S = 30


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    settings = Settings(engines="fake", rtc_port=0)
    engines = engines_sharing_turn(settings)
    runner = make_runner(create_app(settings, engines))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(LIVENESS_S):
            while True:
                async with http.get(url + "/readyz") as response:
                    if response.status == 200:
                        break
                await asyncio.sleep(0.05)
    yield url
    await runner.cleanup()
    await engines.aclose()


async def test_setup_is_timed_step_by_step(server_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        result = await measure_setup(http, server_url, "any-key")
    assert result.error is None
    assert result.answer_ms is not None and result.first_audio_ms is not None
    assert result.channel_open_ms is not None and result.session_created_ms is not None
    assert 0 < result.answer_ms <= result.channel_open_ms <= result.first_audio_ms


async def test_an_unreachable_server_is_a_failure_not_a_crash() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    async with aiohttp.ClientSession() as http:
        result = await measure_setup(http, f"http://127.0.0.1:{closed_port}", "k")
    assert result.error is not None
    assert result.answer_ms is None


@pytest.mark.slow
async def test_capacity_steps_measure_the_received_audio(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How many frames land in a 2 s window depends on the machine; that they are the
    # frames each call received in it, in order, does not.
    windows: list[list[ReceivedFrame]] = []
    lateness_ms = webrtc_bench._lateness_ms

    def seen(frames: Sequence[ReceivedFrame]) -> list[float]:
        windows.append(list(frames))
        return lateness_ms(frames)

    monkeypatch.setattr(webrtc_bench, "_lateness_ms", seen)
    async with aiohttp.ClientSession() as http:
        steps, carried = await measure_capacity(
            http,
            server_url,
            "any-key",
            step=2,
            max_calls=2,
            hold_s=2.0,
            threshold_ms=1000.0,
            progress=False,
        )
    (step,) = steps
    assert step.calls == 2 and step.setup_failures == 0
    # One window per call (two if the first was late), every call heard in its window.
    assert len(windows) in (2, 4) and all(windows)
    assert step.frames == sum(len(window) for window in windows[-2:])
    for window in windows:
        pts = [frame.pts for frame in window]
        assert pts == sorted(set(pts)), "frames counted twice or out of order"
    assert step.p50_lateness_ms >= 0 and step.p99_lateness_ms >= step.p50_lateness_ms
    assert carried == 2


async def test_report_and_json(server_url: str, tmp_path: Path) -> None:
    report = await run_webrtc_bench(server_url, api_key="k", calls=2, capacity=False)
    summary = format_summary(report)
    assert "POST → data channel open" in summary and "2 calls, 0 failed" in summary
    data = report.to_json()
    assert data["setup"]["calls"] == 2 and data["setup"]["failures"] == 0
    assert data["setup"]["percentiles"]["first_audio_ms"]["count"] == 2
    json.dumps(data)


def test_the_command_line_reaches_the_bench() -> None:
    args = build_parser().parse_args(
        ["bench", "webrtc", "--url", "http://127.0.0.1:1", "--calls", "3", "--capacity"]
    )
    assert args.calls == 3 and args.capacity and args.threshold_ms == 20.0
    assert args.handler.__module__ == "hark.bench.webrtc"

"""`hark bench load`: its arithmetic, and a short run against a real server."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from hark.bench.load import LoadConfig, run_load_bench
from hark.bench.load.chart import write_chart
from hark.bench.load.config import parse_duration
from hark.bench.load.generator import LoadGenerator
from hark.bench.load.script import build_script
from hark.bench.load.server_metrics import histogram_quantile, parse_metrics
from hark.bench.load.summary import format_summary, passed
from hark.bench.report import BenchError
from hark.bench.spoken_questions import RATE, SpokenQuestion
from hark.config import Settings
from hark.server.app import create_app, make_runner
from tests.conftest import engines_sharing_turn

pytestmark = pytest.mark.realtime

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("3m", 180), ("1h", 3600), ("1h30m", 5400), ("2.5s", 2.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "3x", "3m-", "-1"])
def test_parse_duration_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_the_generator_talks_to_the_servers_realtime_and_metrics_urls() -> None:
    script = build_script([], chunk_ms=20)
    local = LoadGenerator(LoadConfig(url="ws://127.0.0.1:8000", sessions=1), script, False)
    assert local.ws_url == "ws://127.0.0.1:8000/v1/realtime?model=gpt-realtime"
    assert local.metrics_url == "http://127.0.0.1:8000/metrics"
    config = LoadConfig(url="https://h/base/v1/", sessions=1, model="m")
    remote = LoadGenerator(config, script, False)
    assert remote.ws_url == "wss://h/base/v1/realtime?model=m"
    assert remote.metrics_url == "https://h/base/metrics"
    with pytest.raises(BenchError):
        LoadGenerator(LoadConfig(url="127.0.0.1:8000", sessions=1), script, False)


def test_the_parameters_are_the_runs_fields_without_the_key_or_the_machine() -> None:
    config = LoadConfig(url="ws://h", sessions=2, api_key="sk-secret", server_pid=7)
    parameters = config.parameters()
    assert "sk-secret" not in json.dumps(parameters)
    assert parameters["think_s"] == [0.5, 2.0] and parameters["transcribe"] is False
    assert list(parameters)[:3] == ["url", "sessions", "ramp_s"]
    assert not {"api_key", "server_pid", "connect_timeout_s", "cache_dir"} & set(parameters)


def test_histogram_quantile_between_two_scrapes() -> None:
    text = """# TYPE lag_seconds histogram
lag_seconds_bucket{le="0.01"} %d
lag_seconds_bucket{le="0.02"} %d
lag_seconds_bucket{le="+Inf"} %d
lag_seconds_sum 0
lag_seconds_count %d
"""
    before = parse_metrics(text % (10, 10, 10, 10))
    # Since then: 50 observations under 10 ms, 50 between 10 and 20 ms.
    now = parse_metrics(text % (60, 110, 110, 110))
    assert histogram_quantile(0.5, now, before, "lag_seconds") == pytest.approx(0.01)
    assert histogram_quantile(0.75, now, before, "lag_seconds") == pytest.approx(0.015)
    assert histogram_quantile(0.25, now, None, "lag_seconds") == pytest.approx(0.01 * 27.5 / 60)
    assert histogram_quantile(0.5, before, before, "lag_seconds") is None
    assert histogram_quantile(0.5, now, before, "missing_seconds") is None


def test_the_script_is_cut_into_append_events() -> None:
    pcm = (1000 * np.sin(np.arange(RATE) / 5)).astype(np.int16)
    question = SpokenQuestion("hello?", pcm, last_voiced=RATE // 2)
    script = build_script([question], chunk_ms=20)
    (cut,) = script.questions
    assert len(cut.frames) == 50
    assert cut.last_voiced_chunk == 25
    event = json.loads(cut.frames[0])
    assert event["type"] == "input_audio_buffer.append"
    assert len(base64.b64decode(event["audio"])) == 2 * RATE // 50
    assert len(script.silence) > 1


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    settings = Settings(engines="fake", rtc_port=0)
    engines = engines_sharing_turn(settings)
    app = create_app(settings, engines)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    await engines.warmup()
    yield f"ws://{host}:{port}"
    await runner.cleanup()
    await engines.aclose()


@pytest.mark.slow
async def test_a_short_run_against_a_server(
    server_url: str, tmp_path: Path, recorded_questions: Path
) -> None:
    config = LoadConfig(
        url=server_url,
        cache_dir=recorded_questions,
        sessions=3,
        ramp_s=1.0,
        duration_s=9.0,
        call_s=600.0,
        think_s=(0.2, 0.5),
        pause_s=(2.0, 2.5),
        sample_s=2.0,
    )
    report = await run_load_bench(config)
    client = report["client"]
    assert client["calls_started"] == 3
    assert client["calls_failed"] == 0, client["failures"]
    # How many turns a 9 s run holds, and whether the server decided each one before its
    # caller hung up, are the machine's speed (the figures the bench is for): the report
    # adds up, and it timed a turn.
    assert client["turns_detected"] >= 1
    assert client["missed_turns"] >= client["turns_expected"] - client["turns_detected"]
    assert 1 <= client["vad_decision_lag_ms"]["count"] <= client["turns_detected"]
    assert 1 <= client["e2a_ms"]["count"] <= client["turns_detected"]
    assert client["responses"].get("completed", 0) >= 1
    # The server's own figures came from /metrics, read before the first call and after the
    # last (and every 2 s between, as many times as the run's pace allowed).
    server = report["server"]
    assert server["scrapes"] >= 2
    assert server["end"]["rss_mib"] > 10
    assert server["end"]["open_fds"] > 3
    assert server["end"]["batch_mean"] is not None
    assert len(report["timeline"]) >= 2
    assert passed(report) == (client["missed_turns"] == 0)
    assert format_summary(report).splitlines()[-1] == ("PASS" if passed(report) else "FAIL")
    chart = tmp_path / "load.png"
    write_chart(report, chart)
    assert chart.read_bytes().startswith(PNG_MAGIC)
    json.dumps(report)


async def test_refuses_bad_options() -> None:
    with pytest.raises(BenchError):
        await run_load_bench(LoadConfig(url="ws://127.0.0.1:1", sessions=0))
    with pytest.raises(BenchError):
        await run_load_bench(LoadConfig(url="ws://127.0.0.1:1", sessions=1, chunk_ms=7))

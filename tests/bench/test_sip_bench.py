"""``hark bench sip``: its figures on made-up packets, and a short run against a real
``hark serve --engines fake`` with SIP."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hark.bench import sip as sip_bench
from hark.bench.sip import (
    CLOCK,
    FRAME,
    Received,
    SipBenchConfig,
    SipReport,
    format_summary,
    jitter_ms,
    lost,
    measure_setup,
    run_sip_bench,
)
from hark.cli import build_parser
from tests.transports.sip.conftest import SECRET, SipServer, free_sip_port, sip_serve

pytestmark = pytest.mark.realtime


def sip_config(server: tuple[str, int], *options: str) -> SipBenchConfig:
    """The bench's config as ``hark bench sip --sip HOST:PORT OPTIONS`` makes it."""
    address = f"{server[0]}:{server[1]}"
    parsed = build_parser().parse_args(["bench", "sip", "--sip", address, *options])
    return SipBenchConfig.from_options(vars(parsed))


def packets(arrivals_ms: list[float], *, ssrc: int = 7, first_ts: int = 0) -> list[Received]:
    """One stream's packets, 20 ms of timestamps apart, arriving at ``arrivals_ms``."""
    return [
        Received(arrival / 1000, index, (first_ts + index * FRAME) % (1 << 32), ssrc, False)
        for index, arrival in enumerate(arrivals_ms)
    ]


def test_jitter_is_the_delay_behind_the_timestamp_schedule() -> None:
    on_time = [0.0, 20.0, 40.0, 60.0]
    assert jitter_ms(packets(on_time)) == pytest.approx([0, 0, 0, 0])
    # The third packet comes 30 ms late; the fourth is on time again.
    assert jitter_ms(packets([0.0, 20.0, 70.0, 60.0])) == pytest.approx([0, 0, 30, 0])
    # The earliest packet sets the schedule, whichever it is.
    assert jitter_ms(packets([5.0, 20.0, 40.0, 60.0])) == pytest.approx([5, 0, 0, 0])


def test_jitter_survives_a_timestamp_wrap_and_keeps_streams_apart() -> None:
    wrapping = packets([0.0, 20.0, 40.0, 60.0], first_ts=(1 << 32) - 2 * FRAME)
    assert jitter_ms(wrapping) == pytest.approx([0, 0, 0, 0])
    # A second stream (a new SSRC) has a schedule of its own.
    other = packets([1000.0, 1020.0], ssrc=8, first_ts=123456)
    assert jitter_ms(packets([0.0, 20.0]) + other) == pytest.approx([0, 0, 0, 0])
    assert CLOCK // FRAME == 50


def test_lost_counts_the_missing_sequence_numbers() -> None:
    stream = packets([0, 20, 40, 60, 80, 100])
    assert lost(stream) == 0
    del stream[2:4]
    assert lost(stream) == 2


def test_the_command_is_wired() -> None:
    args = build_parser().parse_args(
        ["bench", "sip", "--sip", "127.0.0.1:5070", "--capacity", "--max-calls", "100"]
    )
    assert args.handler is sip_bench.command
    assert args.sip == ("127.0.0.1", 5070)
    assert args.capacity and args.max_calls == 100
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "sip", "--sip", "no-port"])


@pytest.fixture
def sip_server(tmp_path: Path) -> Iterator[SipServer]:
    with sip_serve(tmp_path / "hark.log") as server:
        yield server


async def test_setup_times_the_answer(sip_server: SipServer) -> None:
    result = await measure_setup(("127.0.0.1", sip_server.sip_port))
    assert result.error is None
    assert result.answer_ms is not None and result.answer_ms > 0


async def test_setup_of_a_server_that_is_not_there_fails_cleanly() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        silent = sock.getsockname()[1]
        result = await measure_setup(("127.0.0.1", silent), limit_s=1.0)
    assert result.error is not None
    assert result.answer_ms is None


@pytest.mark.slow
async def test_a_short_run_measures_every_figure(
    tmp_path: Path, recorded_questions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(recorded_questions.parent.parent))
    listen = ("127.0.0.1", free_sip_port())
    webhook = f"http://{listen[0]}:{listen[1]}/"
    with sip_serve(
        tmp_path / "hark.log",
        "--sip-webhook-url",
        webhook,
        env={"HARK_SIP_WEBHOOK_SECRET": SECRET},
    ) as server:
        assert server.process.proc is not None
        config = sip_config(
            ("127.0.0.1", server.sip_port),
            *("--calls", "3", "--turns", "1", "--api-key", "local", "--url", server.url),
            *("--webhook-listen", f"{listen[0]}:{listen[1]}"),
        )
        report = await run_sip_bench(config)
    # With a webhook the bench answers its own calls: setup and turns both went through it.
    assert [r.error for r in report.setup] == [None, None, None]
    (turn,) = report.turns
    assert turn.error is None
    assert turn.v2v_ms is not None and turn.e2a_ms is not None
    # The end of turn is decided after the last voiced sample was sent.
    assert turn.e2a_ms < turn.v2v_ms
    data = report.to_json()
    assert data["turns"]["e2a_ms"]["count"] == 1
    assert "end of turn → first reply audio" in format_summary(report)


@pytest.mark.slow
async def test_capacity_steps_watch_the_servers_rtp(
    sip_server: SipServer, recorded_questions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(recorded_questions.parent.parent))
    assert sip_server.process.proc is not None
    config = sip_config(
        ("127.0.0.1", sip_server.sip_port),
        *("--calls", "0", "--capacity", "--step", "2", "--max-calls", "4", "--hold", "2"),
        # Thresholds no run can pass: the ramp goes on to --max-calls whatever the machine.
        *("--threshold-ms", "1e9", "--late-ms", "1e9"),
        *("--ask-every", "3", "--server-pid", str(sip_server.process.proc.pid)),
    )
    report = await run_sip_bench(config)
    assert [step.calls for step in report.capacity] == [2, 4]
    assert report.capacity_calls == 4
    for step in report.capacity:
        assert step.packets > 0 and step.setup_failures == 0
        assert step.lost_packets == 0
        assert step.p50_jitter_ms <= step.p99_jitter_ms <= step.max_jitter_ms
        assert step.server_cpu_ms_per_call_s is not None and step.server_cpu_ms_per_call_s > 0
    json.dumps(report.to_json())
    assert "capacity: 4 simultaneous calls" in format_summary(report)
    assert isinstance(report, SipReport)

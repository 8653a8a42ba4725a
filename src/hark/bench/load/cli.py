"""``hark bench load``'s command line."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from hark.bench.command import Bench, Result, config_from
from hark.bench.load.chart import write_chart
from hark.bench.load.config import TRANSPORTS, LoadConfig, parse_duration
from hark.bench.load.generator import run_load_bench
from hark.bench.load.summary import format_summary, passed
from hark.bench.report import ServerUrl, api_key
from hark.config.options import BenchOption, session_bench_options, shared
from hark.eventloop import run_event_loop

OPTIONS: tuple[BenchOption | str, ...] = (
    BenchOption("sessions", "simulated callers at once", int, required=True),
    BenchOption(
        "ramp",
        "start the callers evenly over this long (default 10s)",
        parse_duration,
        10.0,
        metavar="S",
    ),
    BenchOption(
        "duration",
        "run this long after the ramp, e.g. 90s, 30m (default 60s)",
        parse_duration,
        60.0,
        metavar="S",
    ),
    BenchOption("transport", "(default ws)", str, "ws", choices=TRANSPORTS),
    BenchOption("chunk_ms", "audio per append event (default 20)", int, 20),
    BenchOption(
        "call_duration",
        "a call lasts this long ±50%%, then the caller dials again (default 3m)",
        parse_duration,
        180.0,
        metavar="S",
    ),
    BenchOption(
        "sample",
        "read the server's /metrics this often (default 5s)",
        parse_duration,
        5.0,
        metavar="S",
    ),
    BenchOption(
        "transcribe",
        "turn input_audio_transcription on: every turn is transcribed as it is spoken",
        None,
    ),
    *session_bench_options("the callers' behaviour"),
    shared(
        "server_pid",
        help="the local server's process: report its CPU time per session-second after the ramp",
    ),
    BenchOption("quiet", "no progress lines", None),
)


@dataclass(frozen=True)
class LoadRun:
    """One ``hark bench load`` run: what the callers do, and whether to show progress."""

    config: LoadConfig
    progress: bool

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> LoadRun:
        """The run of the parsed options; ``BenchError`` when ``--url`` is not a URL."""
        config = config_from(
            LoadConfig,
            options,
            call_s=options["call_duration"],
            api_key=api_key(options["api_key"]),
        )
        ServerUrl.parse(config.url)
        return cls(config, not options["quiet"])


def run(load: LoadRun) -> Result:
    """Run the callers; the run passes when no call failed and no turn was missed."""
    report = run_event_loop(run_load_bench(load.config, progress=load.progress))
    chart = functools.partial(write_chart, report)
    return Result(report, format_summary(report), passed(report), chart)


BENCH = Bench("load", OPTIONS, LoadRun.from_options, run)
configure_parser, command = BENCH.configure_parser, BENCH.command

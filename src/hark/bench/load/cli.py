"""``hark bench load``'s command line."""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from typing import Any

from hark.bench.command import Bench, Result, config_from
from hark.bench.load.chart import write_chart
from hark.bench.load.config import TRANSPORTS, LoadConfig, parse_duration
from hark.bench.load.generator import run_load_bench
from hark.bench.load.summary import format_summary, passed
from hark.bench.report import ServerUrl, api_key
from hark.config.options import SESSION_BENCH_OPTIONS, add_bench_arguments
from hark.eventloop import run_event_loop


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add ``hark bench load``'s options to ``parser``."""
    parser.add_argument("--sessions", type=int, required=True, help="simulated callers at once")
    parser.add_argument(
        "--ramp", type=parse_duration, default=10.0, metavar="S",
        help="start the callers evenly over this long (default 10s)",
    )  # fmt: skip
    parser.add_argument(
        "--duration", type=parse_duration, default=60.0, metavar="S",
        help="run this long after the ramp, e.g. 90s, 30m (default 60s)",
    )  # fmt: skip
    parser.add_argument("--transport", choices=TRANSPORTS, default="ws", help="(default ws)")
    parser.add_argument(
        "--chunk-ms", type=int, default=20, help="audio per append event (default 20)"
    )
    parser.add_argument(
        "--call-duration", type=parse_duration, default=180.0, metavar="S",
        help="a call lasts this long ±50%%, then the caller dials again (default 3m)",
    )  # fmt: skip
    parser.add_argument(
        "--sample", type=parse_duration, default=5.0, metavar="S",
        help="read the server's /metrics this often (default 5s)",
    )  # fmt: skip
    parser.add_argument(
        "--transcribe", action="store_true",
        help="turn input_audio_transcription on: every turn is transcribed as it is spoken",
    )  # fmt: skip
    add_bench_arguments(
        parser,
        *SESSION_BENCH_OPTIONS,
        server_pid={
            "help": "the local server's process: report its CPU time per session-second after "
            "the ramp"
        },
        seed={"help": "seed of the callers' behaviour (default 0)"},
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


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
            ramp_s=options["ramp"],
            duration_s=options["duration"],
            call_s=options["call_duration"],
            api_key=api_key(options["api_key"]),
            sample_s=options["sample"],
        )
        ServerUrl.parse(config.url)
        return cls(config, not options["quiet"])


def run(load: LoadRun) -> Result:
    """Run the callers; the run passes when no call failed and no turn was missed."""
    report = run_event_loop(run_load_bench(load.config, progress=load.progress))
    chart = functools.partial(write_chart, report)
    return Result(report, format_summary(report), passed(report), chart)


command = Bench("load", LoadRun.from_options, run).command

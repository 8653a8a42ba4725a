"""Every ``hark bench`` command's glue: its exit status, its error line, its JSON report."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hark.bench.command import Bench, Result, config_from, listed
from hark.bench.report import BenchError
from hark.config.options import BenchOption, shared


@dataclass(frozen=True)
class Config:
    count: int
    names: tuple[str, ...]
    seed: int = 7


def make_config(options: dict[str, Any]) -> Config:
    config = config_from(Config, options, names=listed(options["names"], str))
    if config.count < 0:
        raise BenchError("--count is at least 0")
    return config


def run(config: Config) -> Result:
    if config.count == 13:
        raise BenchError("the server is unreachable")
    figures = {"count": config.count, "names": list(config.names), "seed": config.seed}
    return Result(figures, f"counted {config.count}", passed=config.count < 10)


OPTIONS = (
    BenchOption("count", "how many to count", int, 0),
    BenchOption("names", "comma-separated names", default="", metavar="LIST"),
    BenchOption("loud", "count aloud", None),
    BenchOption("where", "where to count", positional=True),
    shared("api_key", alias="--key"),
    shared("seed", default=7),
    "json",
)
bench = Bench("example", OPTIONS, make_config, run)


def options(count: int, json_path: Path | None = None) -> dict[str, Any]:
    return {"count": count, "names": "a, b,,c", "json": json_path}


def test_a_run_that_passes_prints_its_summary_and_writes_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "out" / "report.json"
    assert bench.command(options(3, path)) == 0
    assert capsys.readouterr().out == "counted 3\n"
    # Fields named like options are taken from them, the others keep their default.
    assert json.loads(path.read_text()) == {"count": 3, "names": ["a", "b", "c"], "seed": 7}


def test_a_run_that_fails_what_it_measures_exits_1_with_its_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.command(options(11)) == 1
    assert capsys.readouterr().out == "counted 11\n"


def test_wrong_options_exit_2_and_a_run_that_cannot_run_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.command(options(-1)) == 2
    assert capsys.readouterr().err == "hark bench example: error: --count is at least 0\n"
    assert bench.command(options(13)) == 1
    captured = capsys.readouterr()
    assert captured.err == "hark bench example: error: the server is unreachable\n"
    assert captured.out == ""


def test_a_field_in_seconds_is_the_option_named_without_its_unit() -> None:
    @dataclass(frozen=True)
    class Timed:
        hold_s: float
        pause_s: float = 1.0
        step: int = 1

    assert config_from(Timed, {"hold": 2.0, "step": 3}) == Timed(2.0, step=3)
    # An option of the field's own name comes first, and a value given wins over both.
    assert config_from(Timed, {"hold": 2.0, "hold_s": 3.0, "pause": 4.0}) == Timed(3.0, 4.0)
    assert config_from(Timed, {"hold": 2.0}, hold_s=5.0) == Timed(5.0)


def test_a_list_option_that_is_not_of_its_kind_is_wrong() -> None:
    assert listed("1, 2,", int) == (1, 2)
    with pytest.raises(ValueError):
        listed("1,x", int)


def test_the_declarations_make_the_parser() -> None:
    parser = argparse.ArgumentParser()
    bench.configure_parser(parser)
    parsed = vars(parser.parse_args(["--count", "3", "--key", "k", "--names", "a,b"]))
    assert parsed == {
        "count": 3,
        "names": "a,b",
        "loud": False,
        "where": None,
        "api_key": "k",
        "seed": 7,
        "json": None,
    }
    assert vars(parser.parse_args(["here", "--loud", "--api-key", "j"])) | {
        "where": "here",
        "loud": True,
        "api_key": "j",
    } == vars(parser.parse_args(["here", "--loud", "--key", "j"]))
    # A shared option's default changed without a help: its help says the new default.
    assert "seed of the bench's random choices (default 7)" in " ".join(
        parser.format_help().split()
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--count", "many"])

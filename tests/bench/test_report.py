"""What every bench shares: percentiles, the server's URL forms, the options and the output."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from hark.bench.report import (
    BenchError,
    ServerUrl,
    api_key,
    percentile,
    percentiles,
    publish,
    rounded,
)
from hark.cli import build_parser

# --- percentiles ---------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 1, 37.5, 50, 90, 95, 99, 99.9, 100])
def test_percentile_matches_numpys_linear_definition(q: float) -> None:
    values = [float(v) for v in np.random.default_rng(7).gamma(2.0, 150.0, size=41)]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


@pytest.mark.parametrize("q", [0, 12.5, 50, 95, 99, 100])
def test_percentile_of_an_even_ramp_is_its_rank(q: float) -> None:
    # 0, 10, …, 1000 in any order: the q-th percentile lies at rank q, i.e. at 10 q.
    values = [10.0 * i for i in range(101)]
    random.Random(3).shuffle(values)
    assert percentile(values, q) == pytest.approx(10.0 * q)


def test_percentile_interpolates_between_neighbours() -> None:
    low, high = 120.0, 180.0
    # Two values: rank (2 - 1) q / 100 of the way from one to the other.
    for q in (25, 50, 75):
        assert percentile([high, low], q) == pytest.approx(low + (high - low) * q / 100)
    assert percentile([low], 99) == low


def test_percentile_refuses_no_values_and_ranks_outside_0_to_100() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentiles([1.0], (-1,))


def test_percentiles_names_rounds_and_agrees_with_percentile() -> None:
    values = [float(v) for v in np.random.default_rng(11).exponential(80.0, size=257)]
    figures = percentiles(values, (50, 95, 99, 99.9), digits=2)
    assert list(figures) == ["p50", "p95", "p99", "p99.9"]
    for key, q in zip(figures, (50, 95, 99, 99.9), strict=True):
        assert figures[key] == round(percentile(values, q), 2)
    assert percentiles(values, (50,)) == {"p50": percentile(values, 50)}


def test_percentiles_of_nothing_are_none() -> None:
    assert percentiles([], (50, 99), digits=1) == {"p50": None, "p99": None}


def test_rounded() -> None:
    assert rounded(2.345678) == round(2.345678, 1)
    assert rounded(2.345678, 3) == round(2.345678, 3)
    assert rounded(None) is None


# --- the server's URLs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "http", "ws"),
    [
        ("ws://127.0.0.1:8000", "http://127.0.0.1:8000", "ws://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000", "ws://127.0.0.1:8000"),
        ("ws://127.0.0.1:8000/v1", "http://127.0.0.1:8000", "ws://127.0.0.1:8000"),
        ("wss://example.org/v1/", "https://example.org", "wss://example.org"),
        ("https://h/base/v1/", "https://h/base", "wss://h/base"),
        ("https://h/base", "https://h/base", "wss://h/base"),
    ],
)
def test_every_url_form_names_the_same_server(url: str, http: str, ws: str) -> None:
    server = ServerUrl.parse(url)
    assert server.http() == http
    assert server.ws() == ws
    assert server.http("/metrics") == http + "/metrics"
    assert server.http("/v1") == http + "/v1"
    assert server.ws("/v1/realtime?model=m") == ws + "/v1/realtime?model=m"


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://h:21", "ws://", "http:///v1"])
def test_a_url_that_names_no_server_is_refused(url: str) -> None:
    with pytest.raises(BenchError, match="ws://HOST:PORT"):
        ServerUrl.parse(url)


# --- options and output ----------------------------------------------------------------------


def test_the_api_key_is_the_option_else_the_environment_else_local(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert api_key(None) == "local"
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert api_key(None) == "from-env"
    assert api_key("given") == "given"


def test_publish_prints_the_summary_and_writes_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = {"benchmark": "x", "rows": [{"p50": 1.5, "p99": None}]}
    target = tmp_path / "new" / "folder" / "report.json"
    publish("the summary", report, target)
    assert capsys.readouterr().out == "the summary\n"
    assert json.loads(target.read_text()) == report
    publish("again", report, None)
    assert capsys.readouterr().out == "again\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["hop", "--url", "http://a", "--other", "http://b"],
        ["latency", "--url", "ws://a"],
        ["load", "--url", "ws://a", "--sessions", "1"],
        ["vad"],
        ["webrtc", "--url", "http://a"],
    ],
)
def test_every_bench_takes_the_shared_json_option(argv: list[str], tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    args = build_parser().parse_args(["bench", *argv, "--json", str(target)])
    assert args.json == target
    assert build_parser().parse_args(["bench", *argv]).json is None

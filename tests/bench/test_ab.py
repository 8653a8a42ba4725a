"""scripts/ab's own logic, on given figures: the table, the ratios and the flag, the run order,
the figures taken from each bench's report, the command line. No bench is run."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from hark.bench.ab.benches import (
    BENCHES,
    DEFAULT_BENCHES,
    Server,
    Settings,
    client_arguments,
    extract,
    known_arguments,
    serve_arguments,
)
from hark.bench.ab.builds import default_base, locked_llama, snapshot_working_tree
from hark.bench.ab.cli import cautions, parse_args, settings_of
from hark.bench.ab.runs import schedule
from hark.bench.ab.table import (
    Figure,
    change,
    compare,
    compare_figure,
    markdown_table,
    row_json,
    text_table,
)

LATENCY = Figure("x.v2v_p50", "V2V p50", "ms", "lower", floor=20)
CAPACITY = Figure("x.calls", "calls carried", "", "higher")
FAILURES = Figure("x.failures", "failures", "", "lower")

# --- the table ----------------------------------------------------------------------------


def test_lower_is_better_more_than_ten_percent_worse_is_flagged() -> None:
    row = compare_figure(LATENCY, [600, 620], [700, 690])
    assert row.a_median == 610 and row.b_median == 695
    assert row.ratio == pytest.approx(695 / 610)
    assert row.worse == pytest.approx(85 / 610)
    assert row.verdict == "worse" and row.flagged
    assert row.pair_ratios == pytest.approx([700 / 600, 690 / 620])


def test_higher_is_better_a_capacity_that_falls_is_flagged_and_one_that_rises_is_better() -> None:
    fell = compare_figure(CAPACITY, [124, 120], [100, 104])
    assert fell.flagged and fell.worse == pytest.approx(20 / 122)
    rose = compare_figure(CAPACITY, [124, 120], [140, 144])
    assert rose.verdict == "better" and not rose.flagged
    assert rose.ratio == pytest.approx(142 / 122)
    assert change(rose) == "16.4 % better"


def test_within_the_threshold_is_the_same_either_way() -> None:
    assert compare_figure(LATENCY, [600], [655]).verdict == "same"  # 9.2 % worse
    assert compare_figure(LATENCY, [600], [545]).verdict == "same"  # 9.2 % better
    assert compare_figure(LATENCY, [600], [655], threshold=0.05).verdict == "worse"


def test_a_difference_within_the_floor_is_never_flagged() -> None:
    # E2A of 0 ms against 12 ms is infinitely worse and means nothing.
    row = compare_figure(LATENCY, [0, 0], [12, 10])
    assert row.worse == math.inf and row.ratio is None
    assert row.verdict == "same" and not row.flagged


def test_a_count_from_zero_is_flagged() -> None:
    row = compare_figure(FAILURES, [0, 0], [0, 3])
    assert row.flagged and change(row) == "worse (A is 0)"
    assert row_json(row)["worse"] == "inf"
    assert compare_figure(FAILURES, [0, 0], [0, 0]).verdict == "same"


def test_a_side_without_figures_is_not_available_and_not_flagged() -> None:
    row = compare_figure(LATENCY, [None, None], [600, 610])
    assert row.verdict == "n/a" and not row.flagged
    assert row.a_median is None and row.ratio is None and row.worse is None
    assert row.pair_ratios == []
    # A figure no run reported at all.
    (missing,) = compare([LATENCY], {}, {})
    assert missing.verdict == "n/a" and missing.a == [] and missing.b == []


def test_the_median_skips_a_round_that_did_not_run() -> None:
    row = compare_figure(LATENCY, [600, None, 640], [610, 620, None])
    assert row.a_median == 620 and row.b_median == 615
    assert row.pair_ratios == pytest.approx([610 / 600])


def test_a_side_whose_rounds_differ_by_more_than_the_threshold_is_noisy() -> None:
    row = compare_figure(LATENCY, [600, 760], [800, 810])
    assert row.a_spread == pytest.approx(160 / 680)
    assert row.noisy and row.flagged
    quiet = compare_figure(LATENCY, [600, 610], [600, 620])
    assert not quiet.noisy and quiet.b_spread == pytest.approx(20 / 610)


def test_the_tables_show_each_round_the_medians_the_ratio_and_the_verdict() -> None:
    rows = compare(
        [LATENCY, CAPACITY, FAILURES],
        {"x.v2v_p50": [600, 620], "x.calls": [124, 120]},
        {"x.v2v_p50": [700, 690], "x.calls": [None, None], "x.failures": [0, 0]},
    )
    text = text_table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("figure") and set(lines[1]) <= {"-", " "}
    assert "600, 620" in lines[2] and "695 ms" in lines[2] and "1.139" in lines[2]
    assert "13.9 % worse" in lines[2] and lines[2].endswith("WORSE")
    assert lines[3].endswith("n/a") and lines[4].endswith("n/a")
    markdown = markdown_table(rows)
    assert markdown.splitlines()[1] == "|" + "---|" * 11
    assert "**WORSE**" in markdown


# --- the runs -----------------------------------------------------------------------------


def test_abba_swaps_the_pair_every_other_round() -> None:
    assert schedule(2, "abba") == [(1, "A"), (1, "B"), (2, "B"), (2, "A")]
    assert [side for _, side in schedule(3, "abba")] == ["A", "B", "B", "A", "A", "B"]
    assert schedule(2, "abab") == [(1, "A"), (1, "B"), (2, "A"), (2, "B")]


def test_an_older_server_gets_only_the_options_it_lists() -> None:
    arguments = serve_arguments(BENCHES["load"], 8000, None)
    assert arguments == [
        "--host", "127.0.0.1", "--port", "8000", "--engines", "fake", "--rtc-port", "0",
        "--no-sip",
    ]  # fmt: skip
    assert known_arguments(arguments, "--port PORT --rtc-port PORT [--sip | --no-sip]") == (
        arguments
    )
    assert known_arguments(arguments, "--port PORT --engines") == arguments[:6]
    sip = serve_arguments(BENCHES["sip"], 8000, 5070)
    assert "--no-sip" not in sip and sip[sip.index("--sip-port") + 1] == "5070"
    # A server from before the INVITE rate limit is started without it.
    assert known_arguments(sip, "--rtc-port --sip-port") == sip[: sip.index("--sip-invite-rate")]
    assert known_arguments(sip, "--rtc-port --sip-invite-rate") == sip


def test_quick_runs_are_short_and_full_runs_are_the_documented_commands() -> None:
    server = Server(port=8000, pid=42, sip_port=5070)
    quick, full = Settings(quick=True), Settings()
    load = client_arguments(BENCHES["load"], quick, server)
    assert load[load.index("--sessions") + 1] == "20"
    assert load[load.index("--duration") + 1] == "10"
    assert load[load.index("--chunk-ms") + 1] == "100"
    load = client_arguments(BENCHES["load"], Settings(sessions=160), server)
    assert load[load.index("--sessions") + 1] == "160"
    assert load[load.index("--ramp") + 1] == "18"
    assert client_arguments(BENCHES["webrtc"], full, server) == [
        "--url", "http://127.0.0.1:8000", "--capacity", "--server-pid", "42",
        "--calls", "20", "--step", "4",
    ]  # fmt: skip
    assert client_arguments(BENCHES["sip"], full, server)[:2] == ["--sip", "127.0.0.1:5070"]
    latency = client_arguments(BENCHES["latency-semantic"], quick, server)
    assert latency == ["--url", "ws://127.0.0.1:8000", "--turns", "4", "--vad", "semantic"]
    assert client_arguments(BENCHES["latency-server"], full, server)[-2:] == ["--silence-ms", "500"]
    assert client_arguments(BENCHES["relay"], full, None) == []


# --- the figures each bench reports -------------------------------------------------------


def test_latency_figures() -> None:
    report = {
        "summary": {
            "failed": 1,
            "v2v_ms": {"p50": 602.0, "p95": 700.5},
            "e2a_ms": {"p50": 0.0, "p95": 1.0},
        }
    }
    figures = extract(BENCHES["latency-server"], report, Settings(), None)
    assert figures == {
        "latency-server.v2v_p50": 602.0,
        "latency-server.v2v_p95": 700.5,
        "latency-server.e2a_p50": 0.0,
        "latency-server.e2a_p95": 1.0,
        "latency-server.failed": 1.0,
    }
    # A run with no answered turn has no distributions (null in the report).
    empty = {"summary": {"failed": 4, "v2v_ms": None, "e2a_ms": None}}
    assert (
        extract(BENCHES["latency-server"], empty, Settings(), None)["latency-server.v2v_p50"]
        is None
    )


def test_load_figures_and_the_server_cpu_per_session_second() -> None:
    report = {
        "client": {
            "calls_failed": 1,
            "missed_turns": 2,
            "vad_decision_lag_ms": {"count": 90, "p50": 15.3, "p95": 42.5, "p99": 64.4},
        },
        "server": {
            "end": {"loop_lag_p99_ms": 4.5},
            "vad_decision_lag_speech_stopped_ms": {"p50": 12.4, "p99": 32.8},
        },
    }
    # A ramp of 11 s, half of it at full strength on average: 100 × 55.5 session-seconds.
    settings = Settings(sessions=100, duration_s=50)
    figures = extract(BENCHES["load"], report, settings, server_cpu_s=27.75)
    assert figures == {
        "load.vad_lag_p50": 15.3,
        "load.vad_lag_p99": 64.4,
        "load.server_stopped_p99": 32.8,
        "load.loop_lag_p99": 4.5,
        "load.cpu_per_session_s": pytest.approx(5.0),
        "load.failures": 3.0,
    }
    assert extract(BENCHES["load"], {}, settings, None)["load.cpu_per_session_s"] is None


def test_capacity_figures_are_taken_at_the_knee() -> None:
    webrtc = {
        "setup": {
            "failures": 0,
            "percentiles": {"answer_ms": {"p50": 7.0}, "first_audio_ms": {"p50": math.nan}},
        },
        "capacity": {
            "calls_carried": 8,
            "steps": [
                {"calls": 4, "server_ms_per_call_second": 12.0},
                {"calls": 8, "server_ms_per_call_second": 9.5},
                {"calls": 12, "server_ms_per_call_second": 9.0},
            ],
        },
    }
    assert extract(BENCHES["webrtc"], webrtc, Settings(), None) == {
        "webrtc.calls": 8.0,
        "webrtc.cpu_per_call_s": 9.5,
        "webrtc.first_audio_p50": None,  # NaN: no call got that far
        "webrtc.answer_p50": 7.0,
        "webrtc.failures": 0.0,
    }
    sip = {
        "setup": {"failures": 0, "invite_to_200_ms": {"p50": 0.9}},
        "capacity": {"calls_carried": None, "steps": [{"calls": 20}]},
    }
    figures = extract(BENCHES["sip"], sip, Settings(), None)
    assert figures["sip.calls"] is None and figures["sip.cpu_per_call_s"] is None
    assert figures["sip.invite_200_p50"] == 0.9


def test_relay_figures() -> None:
    report = {"pps_per_core": 241000, "round_trip_us": {"added": {"p50": 40.1, "p99": 168.0}}}
    assert extract(BENCHES["relay"], report, Settings(), None) == {
        "relay.pps_per_core": 241000.0,
        "relay.added_p50": 40.1,
        "relay.added_p99": 168.0,
    }


def test_every_bench_reports_each_figure_it_declares() -> None:
    for bench in BENCHES.values():
        assert set(extract(bench, {}, Settings(), None)) == {f.key for f in bench.figures}


# --- the command line ---------------------------------------------------------------------


def test_the_defaults() -> None:
    options = parse_args([])
    assert options.a is None and options.b is None and not options.worktree
    assert options.bench == list(DEFAULT_BENCHES)
    assert options.rounds == 2 and options.order == "abba" and options.threshold == 0.10
    assert options.server_cpu == 0 and options.client_cpu == 1
    assert settings_of(options) == Settings()


def test_two_commits_benches_and_settings() -> None:
    options = parse_args(
        [
            "HEAD~2", "HEAD", "--bench", "relay,load,relay", "--quick", "--sessions", "50",
            "--threshold", "5%", "--rounds", "3", "--client-cpu", "none",
        ]
    )  # fmt: skip
    assert (options.a, options.b) == ("HEAD~2", "HEAD")
    assert options.bench == ["relay", "load"]
    assert options.threshold == pytest.approx(0.05) and options.rounds == 3
    assert options.client_cpu is None
    settings = settings_of(options)
    assert settings.quick and settings.load_sessions == 50 and settings.load_duration_s == 10


@pytest.mark.parametrize(
    "argv",
    [
        ["--bench", "load,nope"],
        ["--bench", ""],
        ["--rounds", "0"],
        ["--threshold", "0"],
        ["--worktree", "HEAD~1", "HEAD"],
        ["--order", "aabb"],
    ],
)
def test_bad_command_lines_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2


def test_a_defaults_to_the_last_landed_commit() -> None:
    assert default_base(True, None, "h") == "HEAD"
    assert default_base(False, None, "h") == "HEAD~1"
    assert default_base(False, "h", "h") == "HEAD~1"  # HEAD is its upstream
    assert default_base(False, "m", "h") == "m"


# --- what is built ------------------------------------------------------------------------


def test_the_llama_version_and_sdist_come_from_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "uv.lock"
    lock.write_text(
        'version = 1\n[[package]]\nname = "numpy"\nversion = "2.4.6"\n'
        '[[package]]\nname = "llama-cpp-python"\nversion = "0.3.36"\n'
        'sdist = { url = "https://example.invalid/l.tar.gz", hash = "sha256:ab" }\n'
    )
    assert locked_llama(lock) == (
        "0.3.36",
        {"url": "https://example.invalid/l.tar.gz", "hash": "sha256:ab"},
    )
    assert locked_llama(tmp_path / "none.lock") is None


def test_the_working_tree_snapshot_is_one_commit_per_tree(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "c")
    (tmp_path / ".gitignore").write_text("/.ab/\n")
    (tmp_path / "a.py").write_text("1\n")
    first = snapshot_working_tree(tmp_path)
    assert first.sha == snapshot_working_tree(tmp_path).sha
    assert git("show", "--format=", "--name-only", first.sha).split() == [".gitignore", "a.py"]
    assert git("status", "--porcelain").split() == ["??", ".gitignore", "??", "a.py"]
    (tmp_path / "a.py").write_text("2\n")
    assert snapshot_working_tree(tmp_path).sha != first.sha


def test_one_round_or_a_busy_machine_is_said() -> None:
    assert cautions(2, [0.4, 1.9], cpus=2) == []
    (one,) = cautions(1, [0.4], cpus=2)
    assert "one round" in one
    (busy,) = cautions(2, [0.4, 6.5], cpus=2)
    assert "load average up to 6.5 on 2 CPUs" in busy

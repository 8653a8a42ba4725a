"""``scripts/ab``'s command line (``python -m hark.bench.ab``)."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hark.bench.ab.benches import BENCHES, DEFAULT_BENCHES, Bench, Settings
from hark.bench.ab.builds import (
    AB_DIR,
    Build,
    BuildError,
    Commit,
    build,
    default_base,
    git,
    resolve,
    snapshot_working_tree,
    upstream_merge_base,
)
from hark.bench.ab.runs import Run, Runner, Side, schedule
from hark.bench.ab.table import Row, compare, markdown_table, row_json, text_table
from hark.bench.command import positive
from hark.config.options import BenchOption, add_bench_arguments

EXIT_FLAGGED = 1
EXIT_ERROR = 2
# Past this one-minute load average before a sitting, the machine is too busy to trust.
BUSY_LOAD = 1.0


def _benches(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown bench {', '.join(unknown) or '(none)'}; choose from {', '.join(BENCHES)}"
        )
    return list(dict.fromkeys(names))


def _percent(text: str) -> float:
    value = float(text.strip().removesuffix("%"))
    if not 0 < value < 1000:
        raise argparse.ArgumentTypeError(f"a percentage above 0, got {text}")
    return value / 100


def _cpu(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


OPTIONS: tuple[BenchOption, ...] = (
    BenchOption(
        "a",
        "the commit to compare against (default: the last landed commit: HEAD with "
        "--worktree, else the merge base with HEAD's upstream when HEAD is past it, else HEAD~1)",
        positional=True,
    ),
    BenchOption("b", "the commit measured (default HEAD)", positional=True),
    BenchOption(
        "worktree", "B is the working tree as it is (uncommitted changes and untracked files)", None
    ),
    BenchOption(
        "bench",
        f"comma-separated benches (default: {','.join(DEFAULT_BENCHES)})",
        _benches,
        list(DEFAULT_BENCHES),
        metavar="LIST",
    ),
    BenchOption("rounds", "runs of each bench per commit (default 2, i.e. A B B A)", positive, 2),
    BenchOption(
        "order",
        "abba: A B, B A, A B, … (default); abab: A first in every round",
        str,
        "abba",
        choices=("abba", "abab"),
    ),
    BenchOption(
        "quick",
        "short runs: 20 callers for 10 s, 4 turns, short capacity ramps and relay flood",
        None,
    ),
    BenchOption(
        "sessions",
        "load: callers at once (default 200, --quick 20); load has no knee search",
        positive,
    ),
    BenchOption(
        "duration", "load: seconds after the ramp (default 60, --quick 10)", float, metavar="S"
    ),
    BenchOption("chunk_ms", "load: ms of audio per append (default 100)", positive, 100),
    BenchOption("turns", "latency: questions per run (default 20, --quick 4)", positive),
    BenchOption(
        "threshold", "flag a figure this much worse (default 10)", _percent, 0.10, metavar="PERCENT"
    ),
    BenchOption(
        "server_cpu",
        "the CPU the server of the capacity benches is pinned to (default 0; none)",
        _cpu,
        0,
        metavar="CPU",
    ),
    BenchOption(
        "client_cpu",
        "the CPU their bench client is pinned to (default 1; none)",
        _cpu,
        1,
        metavar="CPU",
    ),
    BenchOption(
        "out",
        "write PREFIX.json, PREFIX.md and the runs' reports and logs in PREFIX/ "
        "(default artifacts/ab/<time>-<A>-<B>)",
        Path,
        metavar="PREFIX",
    ),
    BenchOption("build_only", "build both commits' worktrees, run nothing", None),
)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/ab``."""
    parser = argparse.ArgumentParser(
        prog="scripts/ab",
        description=(
            "Compare two commits' benchmark figures, runs alternated in one sitting. Each "
            "commit is built once in its own git worktree and environment under .ab/; the "
            "table (each figure's rounds, medians, B/A and a verdict) is printed and written "
            "as JSON and Markdown. Exit status 1 when a figure is more than --threshold worse."
        ),
        epilog=f"benches: {', '.join(f'{b.name} ({b.summary})' for b in BENCHES.values())}",
    )
    add_bench_arguments(parser, OPTIONS)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options; a usage error exits with status 2."""
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.worktree and options.b is not None:
        parser.error("--worktree is B: give at most A")
    return options


def settings_of(options: argparse.Namespace) -> Settings:
    """The benches' settings from the options."""
    return Settings(
        quick=options.quick,
        sessions=options.sessions,
        duration_s=options.duration,
        chunk_ms=options.chunk_ms,
        turns=options.turns,
    )


def _say(text: str) -> None:
    print(f"ab: {text}", file=sys.stderr, flush=True)


def _commits(root: Path, options: argparse.Namespace) -> tuple[Commit, Commit]:
    head = git(root, "rev-parse", "HEAD")
    b = snapshot_working_tree(root) if options.worktree else resolve(root, options.b or "HEAD")
    a_name = options.a or default_base(options.worktree, upstream_merge_base(root), head)
    return resolve(root, a_name), b


def _values(runs: list[Run], bench: Bench, side: Side) -> dict[str, list[float | None]]:
    mine = sorted(
        (r for r in runs if r.bench == bench.name and r.side == side), key=lambda r: r.round
    )
    return {f.key: [r.figures.get(f.key) for r in mine] for f in bench.figures}


def _summary(run: Run) -> str:
    if run.status != "ok":
        return f"n/a: {run.reason}"
    shown = ", ".join(
        f"{key.split('.', 1)[1]} {value:g}"
        for key, value in run.figures.items()
        if value is not None
    )
    return f"{shown} ({run.seconds:g} s, load {run.load_1m_before}→{run.load_1m_after})"


def _loads(runs: list[Run]) -> list[float]:
    """The load averages taken before and after each run."""
    return [x for r in runs for x in (r.load_1m_before, r.load_1m_after) if x is not None]


def report(
    a: Commit,
    b: Commit,
    options: argparse.Namespace,
    runs: list[Run],
    rows: list[Row],
    notes: list[str],
) -> dict[str, Any]:
    """The sitting as JSON: both commits, the settings, every run and the table."""
    return {
        "benchmark": "ab",
        "a": {"name": a.name, "sha": a.sha, "subject": a.subject},
        "b": {"name": b.name, "sha": b.sha, "subject": b.subject},
        "benches": options.bench,
        "rounds": options.rounds,
        "order": options.order,
        "quick": options.quick,
        "threshold": options.threshold,
        "settings": vars(settings_of(options)),
        "cpus": os.cpu_count(),
        "runs": [r.to_json() for r in runs],
        "rows": [row_json(r) for r in rows],
        "flagged": [r.figure.key for r in rows if r.flagged],
        "cautions": notes,
    }


def _shortened(subject: str, width: int = 90) -> str:
    return subject if len(subject) <= width else subject[: width - 1] + "…"


def _header(a: Commit, b: Commit, options: argparse.Namespace, runs: list[Run]) -> list[str]:
    loads = _loads(runs)
    low, high = min(loads, default=0.0), max(loads, default=0.0)
    return [
        f"A = {a.short} ({a.name}): {_shortened(a.subject)}",
        f"B = {b.short} ({b.name}): {_shortened(b.subject)}",
        f"{options.rounds} round(s), order {options.order}"
        + (", --quick" if options.quick else "")
        + f"; load average (1 min) over the runs {low:g}–{high:g}"
        + f"; flagged when more than {options.threshold * 100:g} % worse",
    ]


def _verdict(flagged: list[Row], threshold: float) -> str:
    percent = f"{threshold * 100:g} %"
    if not flagged:
        return f"no figure more than {percent} worse"
    line = f"{len(flagged)} figure(s) more than {percent} worse: " + ", ".join(
        r.figure.label for r in flagged
    )
    noisy = [r.figure.label for r in flagged if r.noisy]
    if noisy:
        line += (
            f". Noisy ({', '.join(noisy)}): a side's own rounds differ by more than {percent}, "
            "so the difference may be the machine's; quiet it and rerun with more --rounds"
        )
    return line


def cautions(rounds: int, loads: list[float], cpus: int) -> list[str]:
    """What makes the sitting's figures less trustworthy than they look."""
    said = []
    if rounds < 2:
        said.append(
            "one round per side: nothing shows how much the machine alone moves a figure "
            "(--rounds 2 or more)"
        )
    busy = max(loads, default=0.0)
    # The sitting's own server and bench count in the load average too, up to about a
    # process per CPU; more and something else was waiting for the CPUs.
    if busy > cpus:
        said.append(
            f"the machine was busy (load average up to {busy:g} on {cpus} CPUs): rerun on a "
            "quiet machine before believing a flag"
        )
    return said


def _not_available(runs: list[Run]) -> list[str]:
    seen: dict[tuple[str, str], str] = {}
    for r in runs:
        if r.status != "ok":
            seen.setdefault((r.bench, r.side), f"{r.bench} on {r.side}: {r.reason}")
    return list(seen.values())


def main(argv: Sequence[str] | None = None) -> int:
    """Run an A/B sitting; the exit status is 1 when a figure is flagged."""
    options = parse_args(argv)
    try:
        root = Path(git(Path.cwd(), "rev-parse", "--show-toplevel"))
    except BuildError as error:
        _say(str(error))
        return EXIT_ERROR
    (root / AB_DIR).mkdir(exist_ok=True)
    with (root / AB_DIR / "lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(
                "another scripts/ab holds .ab/lock; waiting for it (two sittings at once would "
                "measure each other)"
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _sitting(root, options)
        except BuildError as error:
            _say(f"error: {error}")
            return EXIT_ERROR


def _sitting(root: Path, options: argparse.Namespace) -> int:
    a, b = _commits(root, options)
    _say(f"A = {a.short} {a.subject}")
    _say(f"B = {b.short} {b.subject}")
    builds: dict[Side, Build] = {"A": build(root, a), "B": build(root, b)}
    if options.build_only:
        for side, done in builds.items():
            print(f"{side} = {done.commit.short}: {done.path}")
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    prefix = options.out or root / "artifacts" / "ab" / f"{stamp}-{a.short}-{b.short}"
    out = Path(prefix)
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(builds, settings_of(options), out, options.server_cpu, options.client_cpu)
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        _say(f"the machine is busy (load average {load:.2f}): figures may be noise")
    benches = [BENCHES[name] for name in options.bench]
    order = schedule(options.rounds, options.order)
    runs: list[Run] = []
    for bench in benches:
        for n, (round_, side) in enumerate(order, 1):
            short = builds[side].commit.short
            _say(f"{bench.name} {n}/{len(order)}: round {round_}, {side} ({short})")
            run = runner.run(bench, side, round_)
            runs.append(run)
            _say(f"  {_summary(run)}")
    rows: list[Row] = []
    for bench in benches:
        rows += compare(
            bench.figures, _values(runs, bench, "A"), _values(runs, bench, "B"), options.threshold
        )
    header = _header(a, b, options, runs)
    missing = _not_available(runs)
    flagged = [r for r in rows if r.flagged]
    verdict = _verdict(flagged, options.threshold)
    notes = cautions(options.rounds, _loads(runs), os.cpu_count() or 1)
    print("\n".join([*header, "", text_table(rows), ""]))
    for line in missing:
        print(f"n/a: {line}")
    for note in notes:
        print(f"note: {note}")
    print(verdict)
    json_path, md_path = Path(f"{out}.json"), Path(f"{out}.md")
    json_path.write_text(json.dumps(report(a, b, options, runs, rows, notes), indent=2) + "\n")
    md_path.write_text(
        "\n".join(
            [
                *(f"{line}  " for line in header),
                "",
                markdown_table(rows),
                "",
                *(f"- n/a: {line}" for line in missing),
                *(f"- note: {note}" for note in notes),
                "",
                verdict,
                "",
            ]
        )
    )
    print(f"written: {json_path}, {md_path}; each run's report and logs in {out}/")
    return EXIT_FLAGGED if flagged else 0

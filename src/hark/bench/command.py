"""The protocol every ``hark bench X`` command follows, and its glue, written once.

A bench is a typed config, built from its parsed options, and a run function that takes
the config and returns a :class:`Result`: the figures (written as JSON with ``--json``),
the summary for people, and whether the run passed. :class:`Bench` turns the two into the
``command(options)`` that ``hark.cli`` calls, with the same logging, error lines and exit
status for every bench: 0 when the run passed, 1 when it did not or could not run, 2 when
the options are wrong, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from hark.bench.report import BenchError, publish
from hark.config.options import BenchOption, add_bench_arguments

C = TypeVar("C")
T = TypeVar("T")

# What an option's value can be wrong with, as the config's builder finds it (a file
# option's file unreadable: OSError).
OPTION_ERRORS: tuple[type[Exception], ...] = (BenchError, ValueError, OSError)


def config_from(cls: type[C], options: Mapping[str, Any], **values: Any) -> C:
    """A config dataclass ``cls`` whose fields are the options of the same names, but for
    those ``values`` gives (an option renamed or read into another type); a field that is
    neither keeps its default. A field ``X_s`` is option ``X`` where there is no ``X_s``:
    the command line says "seconds" in the help (``--hold``), the field's name carries the
    unit (``hold_s``)."""
    taken = {}
    for field in fields(cast(Any, cls)):
        name = field.name
        option = name.removesuffix("_s") if name not in options else name
        if option in options and name not in values:
            taken[name] = options[option]
    return cls(**taken, **values)


def arguments(config: Any) -> dict[str, Any]:
    """A config dataclass's fields as keyword arguments of the function it configures (the
    values as they are: ``asdict`` would copy nested dataclasses into dicts)."""
    return {field.name: getattr(config, field.name) for field in fields(config)}


def listed(value: str, kind: Callable[[str], T]) -> tuple[T, ...]:
    """A comma-separated option's items read as ``kind`` (``ValueError`` when one is not)."""
    return tuple(kind(item.strip()) for item in value.split(",") if item.strip())


def list_option(name: str, help: str, default: Iterable[object]) -> BenchOption:
    """A comma-separated option (read it with :func:`listed`), ``default`` its items."""
    return BenchOption(name, help, str, ",".join(map(str, default)), metavar="LIST")


def positive(text: str) -> int:
    """An option's whole number of at least 1 (argparse's message when it is not)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


@dataclass(frozen=True)
class Result:
    """What a bench's run returns."""

    figures: Mapping[str, Any]
    summary: str
    # False: the bench ran, and what it measured failed (a call that did not set up, a
    # crash the fuzzer found); the exit status is then 1.
    passed: bool = True
    # Draws the figures into a PNG file, for a bench with ``--chart FILE``.
    chart: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class Bench(Generic[C]):
    """One ``hark bench`` command: its name, its options' declarations, its config's
    builder and its run."""

    name: str
    options: Sequence[BenchOption | str]
    # Builds the typed config from the parsed options; raises one of OPTION_ERRORS when an
    # option is wrong.
    config: Callable[[dict[str, Any]], C]
    run: Callable[[C], Result]
    # What the run raises when it cannot run (the server unreachable…), reported in a line.
    errors: tuple[type[Exception], ...] = (BenchError,)
    # The help's description, when the module's docstring is not the one to show.
    description: str | None = None

    def configure_parser(self, parser: argparse.ArgumentParser) -> None:
        """Add the bench's options to its parser (``hark.cli`` calls this)."""
        if self.description is not None:
            parser.description = self.description
        add_bench_arguments(parser, self.options)

    def command(self, options: dict[str, Any]) -> int:
        """Build the config, run, publish the result; returns the exit status."""
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
        try:
            config = self.config(options)
        except OPTION_ERRORS as error:
            return self._failed(error, 2)
        try:
            result = self.run(config)
        except self.errors as error:
            return self._failed(error, 1)
        except KeyboardInterrupt:
            return 130
        publish(result.summary, result.figures, options.get("json"))
        if result.chart is not None and options.get("chart") is not None:
            result.chart(options["chart"])
        return 0 if result.passed else 1

    def _failed(self, error: Exception, status: int) -> int:
        print(f"hark bench {self.name}: error: {error}", file=sys.stderr)
        return status

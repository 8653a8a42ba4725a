"""The ``hark`` command: ``hark serve`` runs the server, ``hark relay`` the fleet's UDP
relay, ``hark bench …`` the benchmarks.

Building the parser imports none of them: each command's module adds its options the
first time its parser is used, so ``hark relay`` starts (and restarts) without loading the
server, the engines or the benchmarks, and ``hark --help`` without loading anything.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from hark import __version__

# Each command: its name, its line in the list of commands, and the module that defines it,
# which has ``configure_parser(parser)``, ``command(options) -> int`` and a docstring (the
# description its help shows, unless ``configure_parser`` sets another).
COMMANDS = (
    ("serve", "run the Realtime API server", "hark.server.cli"),
    ("relay", "the fleet's one public UDP port for WebRTC media", "hark.config.relay"),
)
BENCHES = (
    (
        "captions",
        "caption lag, ASR CPU, WER and V2V of people speaking at length",
        "hark.bench.captions",
    ),
    (
        "fuzz",
        "random and mutated events over many sessions: crashes, hangs, memory",
        "hark.bench.fuzz",
    ),
    (
        "denoise",
        "word error rate of noisy speech with and without denoising",
        "hark.bench.denoise",
    ),
    ("echo", "self-interruptions by a call's echo, and barge-ins heard over it", "hark.bench.echo"),
    (
        "hop",
        "what the hop between two workers of a fleet adds to a call's requests",
        "hark.bench.hop",
    ),
    ("latency", "E2A and voice-to-voice latency of spoken questions", "hark.bench.latency"),
    (
        "load",
        "many simulated callers at once: VAD decision lag, E2A, server figures",
        "hark.bench.load",
    ),
    (
        "relay",
        "datagrams per second per core of hark relay, latency it adds",
        "hark.bench.relay",
    ),
    (
        "sip",
        "SIP answer time, phone calls per core, reply latency on the phone",
        "hark.bench.sip",
    ),
    ("startup", "how long each hark command takes from exec until it serves", "hark.bench.startup"),
    ("tts", "how well Whisper hears each TTS engine, and its speed", "hark.bench.tts"),
    ("turns", "false cut-offs and dead air of turn detection", "hark.bench.turns"),
    ("vad", "VAD cost per session-chunk, unbatched and batched", "hark.bench.vad"),
    ("webrtc", "WebRTC call setup time and calls per core", "hark.bench.webrtc"),
)


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose options a module adds the first time the parser is used
    (to parse, or to print its help or usage), so that building the whole ``hark`` parser
    imports none of the commands' modules."""

    def __init__(self, *args: Any, module: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.module = module

    def load(self) -> None:
        """Import the module and let it add its options (once)."""
        if self.module is None:
            return
        module = importlib.import_module(self.module)
        self.module = None
        self.description = module.__doc__
        module.configure_parser(self)
        self.set_defaults(handler=module.command)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Parse as ``argparse`` does, once the module has added its options."""
        self.load()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        """The usage line, with the module's options."""
        self.load()
        return super().format_usage()

    def format_help(self) -> str:
        """The help text, with the module's description and options."""
        self.load()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, one subcommand per task; no command's module is imported."""
    parser = CommandParser(prog="hark", description="A self-hosted OpenAI Realtime API server.")
    parser.add_argument("--version", action="version", version=f"hark {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_commands(commands, COMMANDS)
    bench = commands.add_parser("bench", help="measure a running server")
    _add_commands(bench.add_subparsers(dest="bench", required=True, metavar="BENCH"), BENCHES)
    return parser


def _add_commands(commands: Any, table: tuple[tuple[str, str, str], ...]) -> None:
    for name, summary, module in table:
        commands.add_parser(
            name,
            help=summary,
            module=module,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hark`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    options = {k: v for k, v in vars(args).items() if k not in ("command", "handler")}
    status: int = args.handler(options)
    return status


if __name__ == "__main__":
    sys.exit(main())

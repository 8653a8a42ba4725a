"""What a real ``hark`` process has imported, read in the process itself.

``probed(argv)`` is the command line of ``hark ARGV`` run by a small wrapper: the same
``hark.cli.main``, in a process that writes ``sorted(sys.modules)`` to ``<dir>/<pid>`` when
it gets SIGUSR1 and when it exits. The handler is inherited by the processes it forks, so
every process of a relay can be asked.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

# The packages no command but their own needs: the WebRTC stack, the models' runtimes.
HEAVY = (
    "aiortc",
    "aioice",
    "av",
    "onnxruntime",
    "llama_cpp",
    "faster_whisper",
    "ctranslate2",
    "piper",
)
# Where the modules land: ``<dir>/<pid>``, one name a line.
MODULES_DIR_ENV = "HARK_TEST_MODULES_DIR"

_PROBE = f"""
import atexit, os, signal, sys

def dump(*_):
    path = os.path.join(os.environ[{MODULES_DIR_ENV!r}], str(os.getpid()))
    with open(path + ".part", "w") as out:
        out.write("\\n".join(sorted(sys.modules)))
    os.replace(path + ".part", path)

signal.signal(signal.SIGUSR1, dump)
atexit.register(dump)
from hark.cli import main
sys.exit(main(sys.argv[1:]))
"""


def probed(argv: Iterable[str]) -> list[str]:
    """The command line of ``hark ARGV`` under the probe (set ``MODULES_DIR_ENV``)."""
    return [sys.executable, "-c", _PROBE, *argv]


def modules_of(directory: Path, pid: int) -> set[str]:
    """The modules process ``pid`` wrote to ``directory``."""
    return set((directory / str(pid)).read_text().splitlines())


def ask(directory: Path, pids: Iterable[int], limit_s: float = 10.0) -> dict[int, set[str]]:
    """Signal each of ``pids`` to write its modules now, and read them back."""
    pids = list(pids)
    for pid in pids:
        (directory / str(pid)).unlink(missing_ok=True)
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + limit_s
    while not all((directory / str(pid)).exists() for pid in pids):
        assert time.monotonic() < deadline, f"no modules written by all of {pids}"
        time.sleep(0.01)
    return {pid: modules_of(directory, pid) for pid in pids}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def among(modules: Iterable[str], packages: Iterable[str]) -> list[str]:
    """The modules that are one of ``packages`` or inside one."""
    packages = tuple(packages)
    return sorted(
        name
        for name in modules
        if any(name == package or name.startswith(package + ".") for package in packages)
    )

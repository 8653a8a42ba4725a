"""Each ``hark`` command imports what it needs: building the parser imports no command's
module, so ``hark --help`` and ``hark relay --help`` load nothing heavy, ``hark serve``
loads the server and no benchmark, and ``hark bench X`` loads bench X and no other."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hark.cli import BENCHES
from tests.modules import HEAVY, MODULES_DIR_ENV, among, ask, modules_of, probed
from tests.servers import free_port

# The command modules (and the server's, the engines', the transports' layers), none of
# which a list of commands or the relay's help needs.
COMMAND_MODULES = (
    "hark.server",
    "hark.edge.supervisor",
    "hark.edge.relay",
    "hark.engines",
    "hark.session",
    "hark.transports",
    *(module for _, _, module in BENCHES),
)
READY_S = 120.0


def environment(directory: Path) -> dict[str, str]:
    """The caller's environment without its ``HARK_*`` settings, with the probe's folder."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("HARK_")}
    return env | {MODULES_DIR_ENV: str(directory)}


def loaded_by(argv: list[str], directory: Path) -> set[str]:
    """The modules ``hark ARGV`` had imported when it exited (with status 0)."""
    process = subprocess.Popen(
        probed(argv), env=environment(directory), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert out, "the help went somewhere else"
    return modules_of(directory, process.pid)


@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["bench", "--help"], ["relay", "--help"]]
)
def test_the_list_of_commands_and_the_relays_help_load_nothing_heavy(
    argv: list[str], tmp_path: Path
) -> None:
    modules = loaded_by(argv, tmp_path)
    assert among(modules, (*HEAVY, "numpy", "aiohttp", "redis", *COMMAND_MODULES)) == []
    assert ("hark.config.relay" in modules) == (argv[0] == "relay")


def test_the_servers_help_loads_its_options_and_nothing_of_the_calls(tmp_path: Path) -> None:
    modules = loaded_by(["serve", "--help"], tmp_path)
    assert "hark.server.cli" in modules and "hark.engines.registry" in modules
    assert among(modules, (*HEAVY, "hark.session", "hark.transports", "hark.bench")) == []
    assert among(modules, ("hark.edge", "hark.server.app")) == []


def test_a_bench_loads_itself_and_no_other_bench(tmp_path: Path) -> None:
    modules = loaded_by(["bench", "vad", "--help"], tmp_path)
    assert "hark.bench.vad" in modules
    others = [module for name, _, module in BENCHES if name != "vad"]
    assert among(modules, (*others, "hark.server", "hark.transports", "aiortc")) == []


def test_a_serving_server_holds_no_benchmark_and_no_relay(tmp_path: Path) -> None:
    port = free_port()
    argv = ["serve", "--engines", "fake", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--rtc-port", "0", "--sip-port", "0"]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            probed(argv), env=environment(tmp_path), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + READY_S
        while readyz(port) != 200:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        modules = ask(tmp_path, [server.pid])[server.pid]
    finally:
        server.terminate()
        server.wait(30)
    assert "hark.server.app" in modules
    assert among(modules, ("hark.bench", "hark.edge.supervisor")) == []


def readyz(port: int) -> int | None:
    """What ``/readyz`` answers now (None: nothing listens yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None

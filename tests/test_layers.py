"""The import contracts of scripts/check_layers.py: hark's own tree passes, and a tree that
breaks each contract fails, naming what broke it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_layers.py"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, files: dict[str, str]) -> Path:
    src = root / "src"
    for name, text in {"hark/__init__.py": "", **files}.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    return src


def _run(src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(src)], capture_output=True, text=True, check=False
    )


def test_hark_keeps_its_layers() -> None:
    result = _run(ROOT / "src")
    assert result.returncode == 0, result.stdout
    assert "0 new violations" in result.stdout
    # Nothing runs against the layers, not even by leave: LAYER_ALLOWED stays empty.
    assert "0 allowed" in result.stdout
    assert "0 cycles" in result.stdout
    # And no cycle is left out of that count by leave.
    assert not _checker().CYCLE_ALLOWED


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "hark/protocol/events.py": "X = 1\n",
            "hark/session/core.py": "from hark.protocol.events import X\n",
            "hark/server/app.py": "import asyncio\nfrom hark.session import core\n",
        },
    )
    result = _run(src)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"hark/session/core.py": "def f():\n    import time\n"},
            "hark.session.core imports time: the session core is sans-I/O",
        ),
        (
            {"hark/session/outbox.py": "from asyncio import Queue\n"},
            "hark.session.outbox imports asyncio: the session core is sans-I/O",
        ),
        (
            # The driver left session/: none of it may do I/O any more.
            {"hark/session/runner.py": "import asyncio\n"},
            "hark.session.runner imports asyncio: the session core is sans-I/O",
        ),
        (
            {"hark/session/core.py": "from hark.driver.runner import SessionRunner\n"},
            "hark.session.core imports hark.driver.runner: imports a layer above its own",
        ),
        (
            {"hark/engines/tts.py": "from hark.protocol import session_config\n"},
            "hark.engines.tts imports hark.protocol: engines know no session",
        ),
        (
            {"hark/protocol/events.py": "from hark.transports import websocket\n"},
            "hark.protocol.events imports hark.transports: imports a layer above its own",
        ),
        (
            {
                "hark/session/a.py": "from hark.session import b\n",
                "hark/session/b.py": "def f():\n    from hark.session.a import X\n",
            },
            "import cycle among hark.session.a, hark.session.b",
        ),
    ],
)
def test_a_broken_contract_fails(tmp_path: Path, files: dict[str, str], message: str) -> None:
    result = _run(_tree(tmp_path, files))
    assert result.returncode == 1
    assert message in result.stdout


def test_type_checking_imports_and_the_driver_are_left_out(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "hark/protocol/events.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from hark.server import app\n"
            ),
            "hark/server/app.py": "from hark.protocol import events\n",
            "hark/driver/runner.py": "import asyncio\nimport time\nfrom hark.session import core\n",
            "hark/session/core.py": "X = 1\n",
        },
    )
    result = _run(src)
    assert result.returncode == 0, result.stdout


def test_an_allowed_import_that_is_gone_must_leave_the_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checker = _checker()
    checker.LAYER_ALLOWED[("hark.cluster.forwarding", "hark.transports.websocket")] = "gone"
    src = _tree(tmp_path, {"hark/cluster/forwarding.py": "X = 1\n"})
    assert checker.main(["check_layers.py", str(src)]) == 1
    out = capsys.readouterr().out
    assert "hark.cluster.forwarding no longer imports hark.transports.websocket" in out


def test_every_layer_is_a_package_of_hark() -> None:
    checker = _checker()
    packages = {p.stem for p in (ROOT / "src" / "hark").iterdir() if not p.name.startswith("_")}
    listed = {name for layer in checker.LAYERS for name in layer}
    assert packages - {"__pycache__"} <= listed

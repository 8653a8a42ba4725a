"""Each commit of an A/B run in a git worktree and environment of its own, built once.

A commit is checked out under ``.ab/<sha>/`` (git-ignored) and synced there with uv (``uv sync
--frozen``, the piper extra and the dev group, as ``scripts/test`` does), except
llama-cpp-python: uv compiles it again for every new worktree (8+ minutes on two cores), so
it is built once as a wheel, kept in ``.ab/wheels/`` and installed into every environment
whose lock asks for that version. A worktree whose environment was built to the end (its
``.venv/.ab-built`` marker) is reused as it is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AB_DIR = ".ab"
MARKER = ".ab-built"
LLAMA = "llama-cpp-python"
# Set by the shell around `scripts/ab`, or by another environment: none of them may reach
# the uv and hark processes of a worktree, which must use that worktree's own environment.
_FOREIGN_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT")


class BuildError(RuntimeError):
    """A commit could not be checked out or its environment built."""


def clean_environment() -> dict[str, str]:
    """This process's environment without what would point a child at another
    environment's Python or code."""
    return {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV}


def git(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``git args`` in ``root``; its output, stripped. ``BuildError`` when it fails."""
    done = subprocess.run(
        ["git", *args], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BuildError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@dataclass(frozen=True)
class Commit:
    """A commit to measure, and how it was named."""

    name: str
    sha: str
    subject: str

    @property
    def short(self) -> str:
        """The abbreviated sha, as tables and paths show it."""
        return self.sha[:7]


def resolve(root: Path, name: str) -> Commit:
    """The commit ``name`` (anything ``git rev-parse`` takes) names."""
    sha = git(root, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    return Commit(name, sha, git(root, "log", "-1", "--format=%s", sha))


def default_base(working_tree: bool, merge_base: str | None, head: str) -> str:
    """A's default: the last landed commit.

    B being the working tree, that is HEAD. Otherwise, where the branch has an upstream
    (``origin/main``) that HEAD has moved past, the commit where the two meet (``git
    merge-base HEAD @{upstream}``): everything since is B's; else HEAD's parent, the
    project's way of working being one commit per change on main.
    """
    if working_tree:
        return "HEAD"
    if merge_base is not None and merge_base != head:
        return merge_base
    return "HEAD~1"


def upstream_merge_base(root: Path) -> str | None:
    """``git merge-base HEAD @{upstream}``; None without an upstream."""
    try:
        return git(root, "merge-base", "HEAD", "@{upstream}")
    except BuildError:
        return None


def snapshot_working_tree(root: Path) -> Commit:
    """The working tree as a commit on HEAD: tracked changes and the untracked files git
    does not ignore, through a private index (the checkout's own index, and so whatever is
    staged there, is left alone). The same tree gives the same commit, so its build is
    reused."""
    head = git(root, "rev-parse", "HEAD")
    index = root / AB_DIR / "snapshot.index"
    index.parent.mkdir(exist_ok=True)
    shutil.copyfile(root / git(root, "rev-parse", "--git-path", "index"), index)
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    git(root, "add", "--all", env=env)
    tree = git(root, "write-tree", env=env)
    index.unlink()
    if tree == git(root, "rev-parse", "HEAD^{tree}"):
        return Commit(
            "the working tree (no changes: HEAD)", head, git(root, "log", "-1", "--format=%s")
        )
    # A fixed author and date: the commit depends on the tree and HEAD alone.
    fixed = "scripts/ab", "ab@localhost", "1970-01-01T00:00:00Z"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": fixed[0],
        "GIT_AUTHOR_EMAIL": fixed[1],
        "GIT_AUTHOR_DATE": fixed[2],
        "GIT_COMMITTER_NAME": fixed[0],
        "GIT_COMMITTER_EMAIL": fixed[1],
        "GIT_COMMITTER_DATE": fixed[2],
    }
    subject = f"the working tree on {head[:7]}"
    sha = git(root, "commit-tree", tree, "-p", head, "-m", subject, env=env)
    return Commit("the working tree", sha, subject)


@dataclass(frozen=True)
class Build:
    """A commit checked out and installed under ``.ab/``."""

    commit: Commit
    path: Path

    @property
    def hark(self) -> Path:
        """Its ``hark`` command."""
        return self.path / ".venv" / "bin" / "hark"

    @property
    def python(self) -> Path:
        """Its environment's Python."""
        return self.path / ".venv" / "bin" / "python"


def worktree_path(root: Path, commit: Commit) -> Path:
    """Where ``commit`` is checked out."""
    return root / AB_DIR / commit.sha[:12]


def locked_llama(lock: Path) -> tuple[str, dict[str, Any]] | None:
    """The llama-cpp-python version a ``uv.lock`` pins and its sdist (``url``, ``hash``);
    None when it pins none from a source distribution."""
    if not lock.exists():
        return None
    for package in tomllib.loads(lock.read_text()).get("package", []):
        if package.get("name") == LLAMA and "sdist" in package:
            return str(package["version"]), dict(package["sdist"])
    return None


def _extras(pyproject: Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    return set(project.get("optional-dependencies", {}))


def _run(command: list[str], cwd: Path) -> None:
    print(f"ab: {' '.join(command)}  (in {cwd})", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=cwd, env=clean_environment(), stdout=sys.stderr)
    if done.returncode != 0:
        raise BuildError(f"{command[0]} {command[1]} failed with status {done.returncode}")


def _uv_cache_wheel(version: str) -> Path | None:
    """A wheel of llama-cpp-python ``version`` that uv built before, from its cache."""
    try:
        cache = subprocess.run(
            ["uv", "cache", "dir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    name = f"llama_cpp_python-{version}-*.whl"
    # uv keeps the wheels it built from sdists as sdists-v*/<index>/<name>/<version>/<id>/
    # (pypi) or one folder deeper (other indexes).
    found = [
        *Path(cache).glob(f"sdists-v*/*/{LLAMA}/{version}/*/{name}"),
        *Path(cache).glob(f"sdists-v*/*/*/{LLAMA}/{version}/*/{name}"),
    ]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def llama_wheel(root: Path, version: str, sdist: dict[str, Any]) -> Path:
    """The one llama-cpp-python ``version`` wheel every worktree installs: the one in
    ``.ab/wheels/``, else a copy of the one uv built for ``.venv`` (from its cache), else
    built here from the locked sdist (minutes; ``scripts/lib.sh``'s CMAKE_ARGS apply)."""
    wheels = root / AB_DIR / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    kept = sorted(wheels.glob(f"llama_cpp_python-{version}-*.whl"))
    if kept:
        return kept[-1]
    cached = _uv_cache_wheel(version)
    if cached is not None:
        print(f"ab: llama-cpp-python {version}: the wheel uv built, {cached}", file=sys.stderr)
        return Path(shutil.copy2(cached, wheels / cached.name))
    url = str(sdist["url"])
    archive = wheels / url.rsplit("/", 1)[-1]
    print(f"ab: llama-cpp-python {version}: building a wheel from {url}", file=sys.stderr)
    with urllib.request.urlopen(url) as response, archive.open("wb") as out:
        shutil.copyfileobj(response, out)
    algorithm, _, digest = str(sdist.get("hash", "")).partition(":")
    if digest and hashlib.new(algorithm, archive.read_bytes()).hexdigest() != digest:
        archive.unlink()
        raise BuildError(f"{archive.name} does not match the lock's {algorithm}")
    _run(["uv", "build", "--wheel", "--out-dir", str(wheels), str(archive)], wheels)
    archive.unlink()
    built = sorted(wheels.glob(f"llama_cpp_python-{version}-*.whl"))
    if not built:
        raise BuildError(f"uv build left no llama-cpp-python {version} wheel in {wheels}")
    return built[-1]


def build(root: Path, commit: Commit) -> Build:
    """``commit`` checked out under ``.ab/`` with its environment; reused once built."""
    path = worktree_path(root, commit)
    done = Build(commit, path)
    marker = path / ".venv" / MARKER
    if marker.exists():
        return done
    if not (path / ".git").exists():
        if path.exists():
            shutil.rmtree(path)
        git(root, "worktree", "prune")
        git(root, "worktree", "add", "--detach", "--force", str(path), commit.sha)
    llama = locked_llama(path / "uv.lock")
    # Bytecode compiled now, not by the first run's server.
    sync = ["uv", "sync", "--frozen", "--compile-bytecode"]
    if "piper" in _extras(path / "pyproject.toml"):
        sync += ["--extra", "piper"]
    if llama is not None:
        sync += ["--no-install-package", LLAMA]
    _run(sync, path)
    if llama is not None:
        wheel = llama_wheel(root, *llama)
        _run(["uv", "pip", "install", "--python", str(done.python), "--no-deps", str(wheel)], path)
    _run([str(done.python), "-m", "compileall", "-q", "src"], path)
    # The environment must run this worktree's code, not the checkout's.
    where = subprocess.run(
        [str(done.python), "-c", "import hark; print(hark.__file__)"],
        env=clean_environment(),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(path.resolve()):
        raise BuildError(f"{done.python} imports hark from {where or 'nowhere'}, not {path}")
    marker.write_text(f"{commit.sha}\n")
    return done

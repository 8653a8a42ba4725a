"""Stored prompts: the operator's prompt store, and a ``prompt {id, version, variables}``
reference resolved against it.

OpenAI keeps prompts in a project and a session names one by id; hark reads them from a
directory the operator gives (``--prompts DIR``), once, when the server starts:

- ``DIR/<id>.json`` (or ``DIR/<id>.txt``): a prompt with one version, ``"1"``;
- ``DIR/<id>/<version>.json`` (or ``.txt``): a prompt's versions; a reference without a
  ``version`` gets the highest numbered one (a named version, a draft say, only when it is
  asked for, or when none is numbered).

A ``.json`` file holds an object with ``instructions`` (a template), and optionally ``tools``
(the session's tool objects) and ``voice``; a ``.txt`` file holds the instructions alone. In
the instructions ``{{name}}`` is replaced by the reference's variable ``name`` (a string, or
an ``input_text`` object); every variable the template names must be given.

The store is the process's, set with ``configure`` as the egress policy is: the session core
resolves prompts in ``session.update`` without a driver in between.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgspec import Struct

from hark.protocol.errors import ProtocolError

# What a prompt file may weigh: a prompt is instructions and a few tools, not a corpus.
MAX_PROMPT_FILE_BYTES = 1024 * 1024
# Prompt ids and versions as file names: no separators, no leading dot.
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")
_VARIABLE = re.compile(r"\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}")
_SUFFIXES = (".json", ".txt")
_FIELDS = frozenset({"instructions", "tools", "voice"})
# The version of a prompt stored as one file.
SINGLE_VERSION = "1"


class PromptStoreError(ValueError):
    """The prompt directory cannot be read as a store; the message names the file."""


class PromptReference(Struct, forbid_unknown_fields=True, omit_defaults=False, kw_only=True):
    """``prompt`` in a session or response: which stored prompt, and its variables."""

    id: str
    version: str | None = None
    variables: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StoredPrompt:
    """One version of a stored prompt, as its file gave it (tools and voice not yet
    validated: ``session_config.check_prompt_store`` does that at start-up)."""

    id: str
    version: str
    instructions: str | None
    tools: list[Any] | None
    voice: Any
    path: Path


@dataclass(frozen=True, slots=True)
class ResolvedPrompt:
    """A reference resolved: the instructions rendered, the tools and voice as stored."""

    instructions: str | None
    tools: list[Any] | None
    voice: Any


class PromptStore:
    """The prompts of a directory, read once (``load``)."""

    def __init__(self, prompts: dict[str, dict[str, StoredPrompt]]) -> None:
        self._prompts = prompts

    @classmethod
    def load(cls, directory: str | Path) -> PromptStore:
        """Read every prompt under ``directory``; raises ``PromptStoreError`` naming the file
        that is not a prompt."""
        root = Path(directory)
        if not root.is_dir():
            raise PromptStoreError(f"{root} is not a directory")
        prompts: dict[str, dict[str, StoredPrompt]] = {}
        for entry in sorted(root.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                prompt_id = _name(entry.name, entry)
                versions: dict[str, StoredPrompt] = {}
                for file in sorted(entry.iterdir()):
                    if file.name.startswith("."):
                        continue
                    prompt = _read(prompt_id, file)
                    if prompt.version in versions:
                        raise PromptStoreError(f"{file}: version {prompt.version!r} twice")
                    versions[prompt.version] = prompt
                if not versions:
                    raise PromptStoreError(f"{entry}: a prompt's folder with no versions")
            else:
                prompt = _read(None, entry)
                prompt_id, versions = prompt.id, {prompt.version: prompt}
            if prompt_id in prompts:
                raise PromptStoreError(f"{entry}: prompt {prompt_id!r} is stored twice")
            prompts[prompt_id] = versions
        return cls(prompts)

    def __iter__(self) -> Iterator[StoredPrompt]:
        """Every version of every prompt."""
        return (p for versions in self._prompts.values() for p in versions.values())

    def resolve(self, reference: PromptReference, param: str) -> ResolvedPrompt:
        """The prompt ``reference`` names, its instructions rendered with its variables.
        Raises ProtocolError naming ``param``'s field: an unknown id or version, a variable
        missing or not text."""
        versions = self._prompts.get(reference.id)
        if versions is None:
            raise ProtocolError(
                f"Prompt '{reference.id[:100]}' does not exist in this server's prompt store.",
                param=f"{param}.id",
                code="invalid_value",
            )
        version = reference.version or _latest(versions)
        prompt = versions.get(version)
        if prompt is None:
            raise ProtocolError(
                f"Prompt '{reference.id}' has no version '{version[:100]}'; it has "
                f"{', '.join(repr(v) for v in sorted(versions, key=_version_key))}.",
                param=f"{param}.version",
                code="invalid_value",
            )
        instructions = prompt.instructions
        if instructions is not None:
            instructions = _render(instructions, reference.variables or {}, param)
        return ResolvedPrompt(instructions, prompt.tools, prompt.voice)


def _name(name: str, path: Path) -> str:
    if not _NAME.match(name):
        raise PromptStoreError(
            f"{path}: {name!r} is not a prompt id or version (letters, digits, _ - .)"
        )
    return name


def _read(prompt_id: str | None, file: Path) -> StoredPrompt:
    """A prompt file: ``<id>.json|txt`` (``prompt_id`` None) or ``<id>/<version>.json|txt``."""
    if file.suffix not in _SUFFIXES or not file.is_file():
        raise PromptStoreError(f"{file}: a prompt is a .json or .txt file")
    name = _name(file.stem, file)
    if file.stat().st_size > MAX_PROMPT_FILE_BYTES:
        raise PromptStoreError(f"{file}: larger than {MAX_PROMPT_FILE_BYTES} bytes")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptStoreError(f"{file}: {exc}") from None
    identity = (name, SINGLE_VERSION) if prompt_id is None else (prompt_id, name)
    if file.suffix == ".txt":
        return StoredPrompt(*identity, instructions=text, tools=None, voice=None, path=file)
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise PromptStoreError(f"{file}: not JSON ({exc})") from None
    if not isinstance(body, dict) or not body or not set(body) <= _FIELDS:
        raise PromptStoreError(f"{file}: a prompt is an object of {', '.join(sorted(_FIELDS))}")
    instructions, tools = body.get("instructions"), body.get("tools")
    if instructions is not None and not isinstance(instructions, str):
        raise PromptStoreError(f"{file}: instructions must be a string")
    if tools is not None and not isinstance(tools, list):
        raise PromptStoreError(f"{file}: tools must be a list")
    return StoredPrompt(
        *identity, instructions=instructions, tools=tools, voice=body.get("voice"), path=file
    )


def _version_key(version: str) -> tuple[int, int | str]:
    # Numbered versions above named ones (a draft is taken only when asked for by name).
    return (1, int(version)) if version.isdigit() else (0, version)


def _latest(versions: dict[str, StoredPrompt]) -> str:
    return max(versions, key=_version_key)


def _render(template: str, variables: dict[str, Any], param: str) -> str:
    """``template`` with each ``{{name}}`` replaced, in one pass (a value is not rendered)."""
    values: dict[str, str] = {}
    for name, value in variables.items():
        if isinstance(value, dict) and value.get("type") == "input_text":
            value = value.get("text")
        if not isinstance(value, str):
            raise ProtocolError(
                f"Prompt variable '{name[:100]}' must be text: hark's prompts take strings "
                "and input_text, not images or files.",
                param=f"{param}.variables.{name[:100]}",
                code="unsupported_parameter",
            )
        values[name] = value
    missing = sorted({m.group(1) for m in _VARIABLE.finditer(template)} - set(values))
    if missing:
        raise ProtocolError(
            f"Missing prompt variables: {', '.join(missing)}.",
            param=f"{param}.variables",
            code="missing_required_parameter",
        )
    return _VARIABLE.sub(lambda m: values[m.group(1)], template)


_store: PromptStore | None = None


def configure(store: PromptStore | None) -> None:
    """Make ``store`` the process's prompt store (the app does, from ``--prompts``); None:
    no store, and a prompt reference is an error."""
    global _store
    _store = store


def current() -> PromptStore | None:
    """The process's prompt store, if it has one."""
    return _store

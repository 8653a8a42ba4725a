"""docs/compatibility.md against the official SDK's Realtime types and hark's protocol models.

The page lists every GA client event, server event and session field once, each as
``supported``, ``partial`` or ``not supported``. These tests keep it from drifting: an event
added to the SDK or to hark's models without a row fails, a row for something neither knows
fails, and a row that calls something supported must match what hark models, handles (a
client event) or emits (a server event).
"""

from __future__ import annotations

import ast
import re
import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import msgspec.inspect as mi
import pydantic
import pytest
from openai.types.realtime.realtime_client_event import RealtimeClientEvent
from openai.types.realtime.realtime_response_create_params import RealtimeResponseCreateParams
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from openai.types.realtime.realtime_session_create_request import RealtimeSessionCreateRequest

import hark
from hark.protocol import client_events as ce
from hark.protocol import server_events as se
from hark.protocol import translation as _translation  # noqa: F401  (its events: known)
from hark.protocol.response_params import ResponseParams
from hark.protocol.session_config import SessionConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "compatibility.md"
SRC = Path(hark.__file__).resolve().parent
STATUSES = ("supported", "partial", "not supported")
# Session fields and response parameters are listed at every depth, so that a field new in
# the SDK fails a row wherever it is added (tools and MCP servers, transcription, tool_choice,
# prompt…). Not below: the values of a mapping (``prompt.variables``, ``metadata``, an MCP
# server's ``headers``), and the items of a response's ``input``, which are conversation items
# (``conversation.item.create``'s row).
NOT_NESTED = ("input",)


@dataclass(frozen=True)
class Row:
    """One row of a table: the name in its first cell, its status, and the note."""

    name: str
    status: str
    note: str


def doc_table(heading: str, text: str | None = None) -> list[Row]:
    """The rows of the first table after ``## heading`` in the page (or in ``text``)."""
    lines = (DOC.read_text(encoding="utf-8") if text is None else text).splitlines()
    try:
        start = lines.index(f"## {heading}")
    except ValueError:
        pytest.fail(f"docs/compatibility.md has no '## {heading}' section")
    rows: list[Row] = []
    in_table = False
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not in_table:
            # The header row, then the |---| separator.
            in_table = True
            continue
        if set(cells[0]) <= {"-", ":"}:
            continue
        name = re.fullmatch(r"`([^`]+)`", cells[0])
        assert name is not None, f"{heading}: the first cell must be one `name`: {line!r}"
        assert len(cells) == 3, f"{heading}: a row has name, status and note: {line!r}"
        rows.append(Row(name.group(1), cells[1], cells[2]))
    assert rows, f"the '{heading}' section of docs/compatibility.md has no table"
    return rows


def union_types(union: object) -> set[str]:
    """The ``type`` literals of an SDK discriminated union of events."""
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0] for m in members}


def _pydantic_models(annotation: object) -> list[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    if typing.get_origin(annotation) is dict:
        return []
    return [m for arg in typing.get_args(annotation) for m in _pydantic_models(arg)]


def sdk_fields(model: type[pydantic.BaseModel]) -> set[str]:
    """The fields of an SDK request type at every depth, by the page's rule (NOT_NESTED)."""
    paths: set[str] = set()

    def walk(model: type[pydantic.BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            path = prefix + name
            paths.add(path)
            if path not in NOT_NESTED:
                for sub in _pydantic_models(info.annotation):
                    walk(sub, path + ".")

    walk(model, "")
    return paths


def sdk_session_fields() -> set[str]:
    """The SDK's session request fields, at every depth."""
    return sdk_fields(RealtimeSessionCreateRequest)


def _structs(t: mi.Type) -> list[mi.StructType]:
    if isinstance(t, mi.StructType):
        return [t]
    if isinstance(t, mi.UnionType):
        return [s for arg in t.types for s in _structs(arg)]
    if isinstance(t, mi.ListType):
        return _structs(t.item_type)
    return []


def hark_fields(model: type) -> set[str]:
    """A hark protocol struct's fields by the same rule, a tagged struct's tag included."""
    paths: set[str] = set()

    def walk(struct: mi.StructType, prefix: str) -> None:
        if struct.tag_field is not None and prefix:
            paths.add(prefix + struct.tag_field)
        for field in struct.fields:
            path = prefix + field.name
            paths.add(path)
            if path not in NOT_NESTED:
                for sub in _structs(field.type):
                    walk(sub, path + ".")

    info = mi.type_info(model)
    assert isinstance(info, mi.StructType)
    walk(info, "")
    return paths


def hark_session_fields() -> set[str]:
    """hark's SessionConfig fields, at every depth."""
    return hark_fields(SessionConfig)


def hark_server_event_classes() -> dict[str, type[se.ServerEvent]]:
    """hark's server event models by their ``type``."""
    found: dict[str, type[se.ServerEvent]] = {}
    pending = list(se.ServerEvent.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        tag = cls.__struct_config__.tag
        if isinstance(tag, str) and not cls.__name__.startswith("_"):
            found[tag] = cls
    return found


def names_used(files: list[Path], *, calls_only: bool) -> set[str]:
    """Class names the code refers to (as ``X`` or ``module.X``), or only those it calls."""
    used: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            target: ast.AST
            if calls_only:
                if not isinstance(node, ast.Call):
                    continue
                target = node.func
            else:
                target = node
            if isinstance(target, ast.Name):
                used.add(target.id)
            elif isinstance(target, ast.Attribute):
                used.add(target.attr)
    return used


def check_listing(rows: list[Row], known: set[str], what: str) -> None:
    """Every known name listed exactly once, nothing unknown, statuses and notes well formed."""
    counts = Counter(row.name for row in rows)
    repeated = sorted(name for name, n in counts.items() if n > 1)
    assert not repeated, f"{what} listed more than once: {repeated}"
    missing = sorted(known - counts.keys())
    assert not missing, f"{what} missing from docs/compatibility.md: {missing}"
    unknown = sorted(counts.keys() - known)
    assert not unknown, f"{what} neither the SDK nor hark knows: {unknown}"
    for row in rows:
        assert row.status in STATUSES, f"{row.name}: status {row.status!r} is not one of {STATUSES}"
        if row.status != "supported":
            assert row.note, f"{row.name} is {row.status}: its note must say how"


def test_client_events_are_listed_once_and_handled_by_the_core() -> None:
    rows = doc_table("Client events")
    hark_types = {ce.EVENT_TYPE[cls]: cls for cls in ce.EVENT_TYPE}
    check_listing(rows, union_types(RealtimeClientEvent) | hark_types.keys(), "client events")
    handled = names_used(sorted((SRC / "session").rglob("*.py")), calls_only=False)
    for row in rows:
        cls = hark_types.get(row.name)
        claimed = row.status != "not supported"
        modelled_and_handled = cls is not None and cls.__name__ in handled
        assert claimed == modelled_and_handled, (
            f"{row.name} is '{row.status}' in the doc, but hark "
            + ("does not decode it or the core never refers to it" if claimed else "handles it")
        )


def test_server_events_are_listed_once_and_emitted_by_hark() -> None:
    rows = doc_table("Server events")
    models = hark_server_event_classes()
    check_listing(rows, union_types(RealtimeServerEvent) | models.keys(), "server events")
    code = [p for p in sorted(SRC.rglob("*.py")) if SRC / "protocol" not in p.parents]
    made = names_used(code, calls_only=True)
    for row in rows:
        cls = models.get(row.name)
        claimed = row.status != "not supported"
        emitted = cls is not None and cls.__name__ in made
        assert claimed == emitted, f"{row.name} is '{row.status}' in the doc, but hark " + (
            "has no model for it or never makes one" if claimed else "emits it"
        )


def test_session_fields_are_listed_once_and_modelled_by_hark() -> None:
    rows = doc_table("Session fields")
    modelled = hark_session_fields()
    check_listing(rows, sdk_session_fields() | modelled, "session fields")
    for row in rows:
        if row.status != "not supported":
            assert row.name in modelled, (
                f"session field {row.name} is '{row.status}' in the doc, "
                "but hark's SessionConfig does not model it"
            )


def test_response_parameters_are_listed_once_and_modelled_by_hark() -> None:
    rows = doc_table("Response parameters")
    modelled = hark_fields(ResponseParams)
    check_listing(rows, sdk_fields(RealtimeResponseCreateParams) | modelled, "response parameters")
    for row in rows:
        if row.status != "not supported":
            assert row.name in modelled, (
                f"response parameter {row.name} is '{row.status}' in the doc, "
                "but hark's ResponseParams does not model it"
            )


def test_nested_fields_are_checked_so_a_new_one_fails() -> None:
    # Guards the rule: a field the SDK adds deep inside an MCP tool, a transcription or a
    # response's audio must be a row of its own, so a page without it fails.
    fields = sdk_session_fields()
    assert {
        "tools.require_approval.never.tool_names",
        "tools.server_url",
        "audio.input.transcription.keywords",
        "tool_choice.server_label",
    } <= fields
    assert not any(f.startswith("prompt.variables.") for f in fields)
    params = sdk_fields(RealtimeResponseCreateParams)
    assert {"audio.output.voice", "tools.parameters", "prompt.id"} <= params
    assert not any(f.startswith("input.") for f in params)
    rows = doc_table("Session fields")
    kept = [r for r in rows if r.name != "tools.server_url"]
    with pytest.raises(AssertionError, match="missing"):
        check_listing(kept, fields | hark_session_fields(), "session fields")


def test_the_parser_sees_a_missing_or_repeated_row() -> None:
    # Guards the guard: a page that leaves an event out, or lists one twice, must fail.
    page = DOC.read_text(encoding="utf-8")
    rows = doc_table("Client events", page)
    known = {row.name for row in rows}
    dropped = re.sub(r"^\| `response\.cancel` \|.*\n", "", page, flags=re.MULTILINE)
    with pytest.raises(AssertionError, match="missing"):
        check_listing(doc_table("Client events", dropped), known, "client events")
    first = next(line for line in page.splitlines() if line.startswith("| `session.update` |"))
    doubled = page.replace(first, f"{first}\n{first}", 1)
    with pytest.raises(AssertionError, match="more than once"):
        check_listing(doc_table("Client events", doubled), known, "client events")


ISSUE_16 = "Fidelity and hardening"
ISSUE_16_POINTS = {str(n) for n in range(1, 15)}


def issue_table(heading: str, text: str) -> list[list[str]]:
    """The cells of each body row of the first table after ``## heading`` in ``text``."""
    lines = text.splitlines()
    assert f"## {heading}" in lines, f"docs/compatibility.md has no '## {heading}' section"
    rows: list[list[str]] = []
    for line in lines[lines.index(f"## {heading}") + 1 :]:
        if line.startswith("## ") or (rows and not line.startswith("|")):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    # The header row and the |---| separator come first.
    return rows[2:]


def top_level_names(path: Path) -> set[str]:
    """The functions, classes and assigned names a test module defines at its top level."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def check_issue_table(rows: list[list[str]], points: set[str]) -> None:
    """Each point listed once with a status, a note, and tests that exist."""
    assert all(len(row) == 4 for row in rows), "a row has point, status, note and tests"
    counts = Counter(row[0] for row in rows)
    repeated = sorted(point for point, n in counts.items() if n > 1)
    assert not repeated, f"points listed more than once: {repeated}"
    missing = sorted(points - counts.keys(), key=int)
    assert not missing, f"points missing from the issue table: {missing}"
    assert counts.keys() <= points, f"points the issue does not have: {counts.keys() - points}"
    for point, status, note, tests in rows:
        assert status in STATUSES, f"point {point}: status {status!r} is not one of {STATUSES}"
        assert note, f"point {point} has no note"
        cited = re.findall(r"`([^`]+)`", tests)
        assert cited, f"point {point} names no test"
        for test in cited:
            path, _, name = test.partition("::")
            file = ROOT / path
            assert path.startswith("tests/") and file.name.startswith("test_"), (
                f"point {point}: {test} is not a test file"
            )
            assert file.is_file(), f"point {point}: {path} does not exist"
            defined = top_level_names(file)
            assert any(n.startswith(("test_", "Test")) for n in defined), (
                f"point {point}: {path} holds no test"
            )
            assert not name or name in defined, f"point {point}: {path} has no {name}"


def test_every_point_of_issue_16_is_listed_once_with_tests_that_exist() -> None:
    check_issue_table(issue_table(ISSUE_16, DOC.read_text(encoding="utf-8")), ISSUE_16_POINTS)


def test_the_issue_table_check_sees_a_missing_point_or_a_test_that_is_gone() -> None:
    page = DOC.read_text(encoding="utf-8")
    dropped = re.sub(r"^\| 7 \|.*\n", "", page, flags=re.MULTILINE)
    with pytest.raises(AssertionError, match="missing"):
        check_issue_table(issue_table(ISSUE_16, dropped), ISSUE_16_POINTS)
    gone = page.replace("`tests/session/test_fidelity.py`", "`tests/session/test_gone.py`", 1)
    with pytest.raises(AssertionError, match="does not exist"):
        check_issue_table(issue_table(ISSUE_16, gone), ISSUE_16_POINTS)
    renamed = page.replace(
        "::test_intents_and_transcription_client_secrets", "::test_renamed_away", 1
    )
    with pytest.raises(AssertionError, match="has no test_renamed_away"):
        check_issue_table(issue_table(ISSUE_16, renamed), ISSUE_16_POINTS)


ISSUE_28 = "Fidelity with the 2026 clients"
ISSUE_28_POINTS = {str(n) for n in range(1, 11)}


def test_the_points_of_issue_28_done_so_far_are_listed_once_with_tests_that_exist() -> None:
    # The issue is still being worked through: a point has its row once it is (partly)
    # done, so only the points listed are asked for.
    rows = issue_table(ISSUE_28, DOC.read_text(encoding="utf-8"))
    listed = {row[0] for row in rows}
    assert listed <= ISSUE_28_POINTS, f"points issue 28 does not have: {listed - ISSUE_28_POINTS}"
    check_issue_table(rows, listed)

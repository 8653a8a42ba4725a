"""The prompt store (issue 28, point 3): the operator's directory of stored prompts, read at
start-up, and a ``prompt {id, version, variables}`` resolved against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hark.config import ConfigError, load_settings
from hark.protocol.errors import ProtocolError
from hark.protocol.prompts import PromptReference, PromptStore, PromptStoreError
from hark.protocol.session_config import check_prompt_store


def write(path: Path, body: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body if isinstance(body, str) else json.dumps(body), encoding="utf-8")
    return path


@pytest.fixture
def store(tmp_path: Path) -> PromptStore:
    write(tmp_path / "support.txt", "You help {{ customer }} with {{product}}.")
    write(
        tmp_path / "concierge.json",
        {
            "instructions": "You are the concierge of {{hotel}}.",
            "tools": [{"type": "function", "name": "book", "parameters": {"type": "object"}}],
            "voice": "marin",
        },
    )
    write(tmp_path / "pmpt_sales" / "2.txt", "Second: sell {{thing}}.")
    write(tmp_path / "pmpt_sales" / "10.json", {"instructions": "Tenth: sell {{thing}}."})
    write(tmp_path / "pmpt_sales" / "draft.txt", "A draft.")
    return PromptStore.load(tmp_path)


def resolve(store: PromptStore, **reference: Any) -> Any:
    return store.resolve(PromptReference(**reference), "session.prompt")


def test_a_prompt_is_found_by_id_and_rendered(store: PromptStore) -> None:
    variables = {"customer": "Ada", "product": {"type": "input_text", "text": "the kettle"}}
    resolved = resolve(store, id="support", variables=variables)
    assert resolved.instructions == "You help Ada with the kettle."
    assert resolved.tools is None and resolved.voice is None
    concierge = resolve(store, id="concierge", version="1", variables={"hotel": "the Ritz"})
    assert concierge.instructions == "You are the concierge of the Ritz."
    assert [t["name"] for t in concierge.tools] == ["book"]
    assert concierge.voice == "marin"


def test_versions_are_picked_or_the_highest_is_taken(store: PromptStore) -> None:
    assert resolve(store, id="pmpt_sales", variables={"thing": "tea"}).instructions == (
        "Tenth: sell tea."
    )
    assert resolve(store, id="pmpt_sales", version="2", variables={"thing": "tea"}).instructions
    assert resolve(store, id="pmpt_sales", version="draft").instructions == "A draft."


def test_a_value_is_not_rendered_again(store: PromptStore) -> None:
    resolved = resolve(store, id="support", variables={"customer": "{{product}}", "product": "x"})
    assert resolved.instructions == "You help {{product}} with x."


@pytest.mark.parametrize(
    ("reference", "param", "code"),
    [
        ({"id": "pmpt_nothing"}, "session.prompt.id", "invalid_value"),
        ({"id": "pmpt_sales", "version": "3"}, "session.prompt.version", "invalid_value"),
        ({"id": "support", "variables": {"customer": "Ada"}}, "session.prompt.variables", None),
        (
            {
                "id": "support",
                "variables": {
                    "customer": "Ada",
                    "product": {"type": "input_image", "image_url": "data:image/png;base64,"},
                },
            },
            "session.prompt.variables.product",
            "unsupported_parameter",
        ),
    ],
)
def test_what_cannot_be_resolved_is_a_clear_error(
    store: PromptStore, reference: dict[str, Any], param: str, code: str | None
) -> None:
    with pytest.raises(ProtocolError) as caught:
        resolve(store, **reference)
    assert caught.value.param == param
    if code is not None:
        assert caught.value.code == code
    if reference["id"] == "pmpt_nothing":
        assert "'pmpt_nothing' does not exist" in caught.value.message
    if param == "session.prompt.variables":
        assert caught.value.message == "Missing prompt variables: product."


@pytest.mark.parametrize(
    ("files", "complaint"),
    [
        ({"a.yaml": "instructions: x"}, "a .json or .txt file"),
        ({"a.json": "{"}, "not JSON"),
        ({"a.json": {"instructions": "x", "model": "m"}}, "an object of"),
        ({"a.json": {"instructions": 3}}, "instructions must be a string"),
        ({"a.txt": "x", "a/1.txt": "y"}, "stored twice"),
        ({"a/1.txt": "x", "a/1.json": {"instructions": "y"}}, "version '1' twice"),
        ({"a b.txt": "x"}, "is not a prompt id"),
    ],
)
def test_a_directory_that_is_not_a_store_is_refused_naming_the_file(
    tmp_path: Path, files: dict[str, object], complaint: str
) -> None:
    for name, body in files.items():
        write(tmp_path / name, body)
    with pytest.raises(PromptStoreError, match=complaint):
        PromptStore.load(tmp_path)


def test_stored_tools_and_voices_are_checked_at_start_up(tmp_path: Path) -> None:
    write(tmp_path / "p.json", {"instructions": "x", "voice": "nova"})
    with pytest.raises(PromptStoreError, match=r"p\.json: Invalid value: 'nova'"):
        check_prompt_store(PromptStore.load(tmp_path))
    write(tmp_path / "p.json", {"tools": [{"type": "function"}]})
    with pytest.raises(PromptStoreError, match=r"prompt\.tools"):
        check_prompt_store(PromptStore.load(tmp_path))


def test_the_prompts_option_names_a_store_that_loads(tmp_path: Path) -> None:
    write(tmp_path / "ok" / "support.txt", "Hello.")
    settings = load_settings({"prompts": str(tmp_path / "ok")}, env={})
    assert settings.prompts == str(tmp_path / "ok")
    assert load_settings({}, env={"HARK_PROMPTS": str(tmp_path / "ok")}).prompts
    with pytest.raises(ConfigError, match=r"prompts: .* is not a directory"):
        load_settings({"prompts": str(tmp_path / "missing")}, env={})
    write(tmp_path / "bad" / "p.json", {"voice": "nova"})
    with pytest.raises(ConfigError, match=r"prompts: .*p\.json"):
        load_settings({"prompts": str(tmp_path / "bad")}, env={})

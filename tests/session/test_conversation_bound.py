"""What a client may make the conversation keep is bounded: items it creates hold at most
``MAX_CLIENT_ITEMS_BYTES`` together; past that ``conversation.item.create`` is an error until
items are deleted."""

from __future__ import annotations

from typing import Any

from hark.protocol.limits import MiB
from hark.session.client_items import MAX_CLIENT_ITEMS_BYTES
from tests.session.conftest import Driver


def create(driver: Driver, item_id: str, text: str) -> list[dict[str, Any]]:
    item = {
        "id": item_id,
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }
    return driver.send({"type": "conversation.item.create", "item": item})


def test_items_past_the_bound_are_refused_until_some_are_deleted() -> None:
    driver = Driver()
    text = "x" * (4 * MiB)
    fits = MAX_CLIENT_ITEMS_BYTES // (4 * MiB + 200)
    for n in range(fits):
        assert create(driver, f"item_{n}", text)[0]["type"] == "conversation.item.added"
    refused = create(driver, "item_over", text)
    assert [e["type"] for e in refused] == ["error"]
    assert refused[0]["error"]["code"] == "conversation_full"
    assert "item_over" not in driver.session.conversation
    # A small item still fits; deleting a big one makes room for another.
    assert create(driver, "item_small", "hello")[0]["type"] == "conversation.item.added"
    driver.send({"type": "conversation.item.delete", "item_id": "item_0"})
    assert create(driver, "item_over", text)[0]["type"] == "conversation.item.added"
    assert create(driver, "item_next", text)[0]["error"]["code"] == "conversation_full"

"""Stream helpers: gather what an async stream yields, pick events by their type."""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


async def collect(stream: AsyncIterable[T]) -> list[T]:
    """Everything ``stream`` yields, in order, once it ends."""
    return [item async for item in stream]


def of_type(events: Iterable[T], kind: str) -> list[T]:
    """The events whose type is ``kind``, in order.

    An event is a JSON object as the server sent it (its ``"type"`` key) or an event the
    `openai` SDK parsed (its ``.type`` attribute).
    """
    return [event for event in events if _type(event) == kind]


def _type(event: Any) -> Any:
    return event["type"] if isinstance(event, Mapping) else event.type

"""The conversation: ordered items, their audio, and what the LLM sees of them."""

from __future__ import annotations

import base64
import re
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt

from hark.audio.formats import encode_audio
from hark.engines.llm import ChatMessage, ImagePart, ToolCall
from hark.protocol import items as wire
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import AudioFormat

PartType = Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]


@dataclass(slots=True)
class AudioSegment:
    """Reply audio ``[start, end)`` (samples) that speaks ``text``."""

    start: int
    end: int
    text: str


@dataclass(slots=True)
class Part:
    """One content part, with the audio kept as PCM so it can be truncated and re-encoded."""

    type: PartType
    text: str | None = None
    transcript: str | None = None
    # What the LLM reads for a user's audio; None while recognition is pending.
    heard: str | None = None
    audio: npt.NDArray[np.int16] | None = None
    audio_format: AudioFormat | None = None
    rate: int = 0
    segments: list[AudioSegment] = field(default_factory=list)
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None
    # The audio was let go under the session's retention budget (see Conversation.limit_audio):
    # it existed, so a truncate of it is told why it cannot be done.
    audio_dropped: bool = False
    # How long the dropped audio was.
    dropped_ms: int = 0
    # While a reply is spoken, ``audio`` is a view of the start of this buffer, which doubles
    # when full so that a reply of n samples costs O(n) copying, not O(n^2).
    _room: npt.NDArray[np.int16] | None = field(default=None, init=False, repr=False)

    def duration_ms(self) -> int:
        """Length of the part's audio in milliseconds."""
        if self.audio is None or not self.rate:
            return 0
        return len(self.audio) * 1000 // self.rate

    def audio_ms(self) -> int:
        """Length of the part's audio in milliseconds, also once it was dropped."""
        return self.dropped_ms if self.audio_dropped else self.duration_ms()

    def extend_audio(self, pcm: npt.NDArray[np.int16]) -> None:
        """Append ``pcm`` to the audio, in amortised O(len(pcm)).

        Call ``compact_audio`` when no more will come, or the part keeps up to twice its audio.
        """
        audio = self.audio if self.audio is not None else np.zeros(0, np.int16)
        start = len(audio)
        end = start + len(pcm)
        room = self._room
        # Something else may have replaced ``audio`` (truncation copies it): then the buffer no
        # longer holds it, and a new one starts from what ``audio`` is now.
        if room is not None and len(room) >= end and _is_view_of(audio, room):
            room[start:end] = pcm
        else:
            room = np.empty(max(2 * end, 1024), np.int16)
            room[:start] = audio
            room[start:end] = pcm
            self._room = room
        self.audio = room[:end]

    def compact_audio(self) -> None:
        """Give back the spare room ``extend_audio`` keeps (a copy when there is any)."""
        room, self._room = self._room, None
        audio = self.audio
        if room is None or audio is None or len(audio) == len(room):
            return
        if _is_view_of(audio, room):
            self.audio = audio.copy()

    def drop_audio(self) -> None:
        """Let the PCM go; the transcript and text, which the LLM reads, stay."""
        self.dropped_ms = self.audio_ms()
        self.audio = None
        self.segments = []
        self._room = None
        self.audio_dropped = True

    def to_wire(self, include_audio: bool) -> wire.ContentPart:
        """The part as sent to clients; audio only when asked (retrieve)."""
        audio = None
        if include_audio and self.audio is not None and self.audio_format is not None:
            audio = base64.b64encode(encode_audio(self.audio_format, self.audio)).decode()
        if self.type == "input_text":
            return wire.InputText(text=self.text or "")
        if self.type == "input_audio":
            return wire.InputAudio(audio=audio, transcript=self.transcript)
        if self.type == "input_image":
            return wire.InputImage(image_url=self.image_url, detail=self.detail)
        if self.type == "output_text":
            return wire.OutputText(text=self.text or "")
        return wire.OutputAudio(audio=audio, transcript=self.transcript)


@dataclass(slots=True)
class Entry:
    """A conversation item in hark's own form."""

    id: str
    type: Literal["message", "function_call", "function_call_output", "mcp"]
    role: Literal["system", "user", "assistant"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] = "completed"
    parts: list[Part] = field(default_factory=list)
    name: str = ""
    arguments: str = ""
    call_id: str = ""
    output: str = ""
    # MCP items as the wire has them: hark's own calls and lists, or the client's.
    mcp: wire.McpItem | None = None

    def to_wire(self, include_audio: bool = False) -> wire.Item:
        """The item as sent to clients."""
        if self.type == "message":
            assert self.role is not None
            return wire.MessageItem(
                id=self.id,
                role=self.role,
                status=self.status,
                content=[p.to_wire(include_audio) for p in self.parts],
            )
        if self.mcp is not None:
            return msgspec.structs.replace(self.mcp, id=self.id)
        if self.type == "function_call":
            return wire.FunctionCallItem(
                id=self.id,
                name=self.name,
                arguments=self.arguments,
                call_id=self.call_id,
                status=self.status,
            )
        return wire.FunctionCallOutputItem(
            id=self.id, call_id=self.call_id, output=self.output, status=self.status
        )

    def pending_recognition(self) -> bool:
        """True while a user audio part still waits for its transcript."""
        return any(p.type == "input_audio" and p.heard is None for p in self.parts)


class Conversation:
    """The ordered items of the default conversation."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._by_id: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._by_id

    def entries(self) -> list[Entry]:
        """The items in order."""
        return list(self._entries)

    def get(self, item_id: str, param: str = "item_id") -> Entry:
        """The item with this id, or a ProtocolError naming ``param``."""
        entry = self._by_id.get(item_id)
        if entry is None:
            raise ProtocolError(
                f"Item with item_id not found: {item_id[:100]}", param, "item_not_found"
            )
        return entry

    def insert(self, entry: Entry, previous_item_id: str | None = None) -> str | None:
        """Add ``entry`` after ``previous_item_id`` (end when None, start when "root").

        Returns the id of the item now before it (None at the start).
        """
        if entry.id in self._by_id:
            raise ProtocolError(
                f"Item with id {entry.id[:100]} already exists.", "item.id", "duplicate_item_id"
            )
        if previous_item_id is None:
            index = len(self._entries)
        elif previous_item_id == "root":
            index = 0
        else:
            index = self._entries.index(self.get(previous_item_id, "previous_item_id")) + 1
        self._entries.insert(index, entry)
        self._by_id[entry.id] = entry
        return self._entries[index - 1].id if index > 0 else None

    def delete(self, item_id: str) -> None:
        """Remove an item."""
        entry = self.get(item_id)
        self._entries.remove(entry)
        del self._by_id[item_id]

    def limit_audio(self, budget_ms: int, keep: Container[str]) -> None:
        """Keep the PCM of only the latest ``budget_ms`` of audio, counted from the end.

        Older parts drop their audio but keep their words, so what the LLM reads does not
        change. Items in ``keep`` (a reply being generated or played) always keep theirs; their
        audio counts toward the budget all the same.
        """
        kept_ms = 0
        for entry in reversed(self._entries):
            for part in reversed(entry.parts):
                if part.audio is None:
                    continue
                kept_ms += part.duration_ms()
                if kept_ms > budget_ms and entry.id not in keep:
                    part.drop_audio()


def _is_view_of(audio: npt.NDArray[np.int16], room: npt.NDArray[np.int16]) -> bool:
    # A function, not an inline ``is``: mypy would narrow ``room`` to the type of ``.base``.
    return audio.base is room


def truncate_part(part: Part, audio_end_ms: int) -> None:
    """Cut an assistant audio part, and its transcript, to the first ``audio_end_ms``.

    The transcript keeps every segment heard in full and, of the segment being spoken at the
    cut, the share of its words that fits the share of its audio that was played.
    """
    assert part.audio is not None
    end = min(len(part.audio), audio_end_ms * part.rate // 1000)
    part.audio = part.audio[:end].copy()
    # The buffer the reply grew in no longer holds its audio: let it go.
    part.compact_audio()
    kept: list[AudioSegment] = []
    words: list[str] = []
    for seg in part.segments:
        if seg.end <= end:
            kept.append(seg)
            words.append(seg.text)
        elif seg.start < end:
            share = (end - seg.start) / max(1, seg.end - seg.start)
            spoken = list(re.finditer(r"\S+", seg.text))
            heard = int(len(spoken) * share)
            cut = seg.text[: spoken[heard - 1].end()] if heard else ""
            kept.append(AudioSegment(seg.start, end, cut))
            words.append(cut)
    part.segments = kept
    part.transcript = "".join(words)


# What the LLM reads in the result slot of a function call whose output has not come yet.
PENDING_RESULT = "The result is not available yet: the call is still running."


def chat_messages(instructions: str, entries: list[Entry]) -> list[ChatMessage]:
    """What the LLM sees: instructions, then the items as chat messages.

    Tool messages are placed as every OpenAI-compatible backend (and chat template) takes
    them: right after the assistant message that made the calls, one per call, before any
    other message. With asynchronous function calling the user may speak while a call is
    pending: its slot holds ``PENDING_RESULT``, and an output that comes after other
    messages (late) is read where it came, as the call made again with its result (the
    model sees that it answered meanwhile and what the call returned at last).
    """
    return _Rendering(instructions, entries).messages


class _Rendering:
    """``chat_messages``' state: the assistant message whose calls still await their slots,
    and late outputs to be read once those slots are filled."""

    def __init__(self, instructions: str, entries: list[Entry]) -> None:
        self.messages: list[ChatMessage] = []
        if instructions:
            self.messages.append(ChatMessage(role="system", content=instructions))
        self._calls = {e.call_id: e for e in entries if e.type == "function_call"}
        # The calls of the last assistant message, by call id, with the output that came
        # right after them (None: none yet).
        self._run: dict[str, str | None] = {}
        self._late: list[Entry] = []
        for entry in entries:
            self._entry(entry)
        self._close_run()

    def _entry(self, entry: Entry) -> None:
        if entry.type == "mcp":
            made = entry.mcp
            # A call the model reads as its own tool call and result, once it has one.
            if isinstance(made, wire.McpCallItem) and (made.output, made.error) != (None, None):
                result = made.output or ""
                if made.error is not None:
                    result = f"error: {made.error.message}"
                tool_call = ToolCall(call_id=entry.id, name=made.name, arguments=made.arguments)
                self._add(ChatMessage(role="assistant", content="", tool_calls=(tool_call,)))
                self.messages.append(
                    ChatMessage(role="tool", content=result, tool_call_id=entry.id)
                )
        elif entry.type == "function_call":
            call = ToolCall(call_id=entry.call_id, name=entry.name, arguments=entry.arguments)
            last = self.messages[-1] if self.messages else None
            if last is not None and last.role == "assistant" and (self._run or not last.tool_calls):
                self.messages[-1] = ChatMessage(
                    role="assistant", content=last.content, tool_calls=(*last.tool_calls, call)
                )
            else:
                self._add(ChatMessage(role="assistant", content="", tool_calls=(call,)))
            self._run[entry.call_id] = None
        elif entry.type == "function_call_output":
            if entry.call_id in self._run and self._run[entry.call_id] is None:
                self._run[entry.call_id] = entry.output
            else:
                self._late.append(entry)
                if not self._run:
                    self._close_run()
        else:
            text = " ".join(t for t in (_part_text(p) for p in entry.parts) if t).strip()
            assert entry.role is not None
            if entry.role == "system":
                self._add(ChatMessage(role="system", content=text))
            elif entry.role == "user":
                images = tuple(
                    ImagePart(url=p.image_url, detail=p.detail)
                    for p in entry.parts
                    if p.type == "input_image" and p.image_url
                )
                self._add(ChatMessage(role="user", content=text, images=images))
            elif text:
                self._add(ChatMessage(role=entry.role, content=text))

    def _add(self, message: ChatMessage) -> None:
        """Append ``message`` after the results of the calls before it."""
        self._close_run()
        self.messages.append(message)

    def _close_run(self) -> None:
        """The results of the last assistant message's calls (a placeholder for those still
        pending), then the late outputs as calls made again with their results."""
        for call_id, output in self._run.items():
            content = PENDING_RESULT if output is None else output
            self.messages.append(ChatMessage(role="tool", content=content, tool_call_id=call_id))
        self._run.clear()
        if not self._late:
            return
        again = []
        for late in self._late:
            made = self._calls.get(late.call_id)
            again.append(
                ToolCall(
                    call_id=f"{late.call_id}_result",
                    name=made.name if made is not None and made.name else "function",
                    arguments=made.arguments if made is not None else "{}",
                )
            )
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant" and not last.tool_calls:
            self.messages[-1] = ChatMessage(
                role="assistant", content=last.content, tool_calls=tuple(again)
            )
        else:
            self.messages.append(ChatMessage(role="assistant", content="", tool_calls=tuple(again)))
        for call, late in zip(again, self._late, strict=True):
            self.messages.append(
                ChatMessage(role="tool", content=late.output, tool_call_id=call.call_id)
            )
        self._late.clear()


def _part_text(part: Part) -> str:
    if part.type in ("input_text", "output_text"):
        return part.text or ""
    if part.type == "input_audio":
        return part.heard if part.heard is not None else (part.transcript or "")
    if part.type == "output_audio":
        return part.transcript or ""
    # Images reach the model as images (``ChatMessage.images``), never as words.
    return ""

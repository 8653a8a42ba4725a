"""The response lifecycle: a response from ``response.create`` (or the end of a turn) to
``response.done``, its output items, and the engine work it asks for."""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from hark.audio.formats import encode_audio, format_rate
from hark.engines.llm import (
    ChatMessage,
    Finished,
    FunctionTool,
    GenerationRequest,
    ToolChoice,
    Truncation,
)
from hark.protocol import items as wire
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.protocol.response_params import ResponseParams
from hark.protocol.session_config import (
    AudioFormat,
    FunctionToolDef,
    McpToolDef,
    Reasoning,
    SessionTruncation,
    ToolChoiceConfig,
    ToolChoiceFunction,
    ToolChoiceMcp,
    VoiceId,
)
from hark.session.actions import (
    CallMcpTool,
    CancelGeneration,
    Generate,
    PlayAudio,
    Prefill,
)
from hark.session.context import SessionContext, SessionPart
from hark.session.conversation import AudioSegment, Entry, Part, chat_messages
from hark.session.mcp_tools import ListedServer, McpTarget, McpTools
from hark.session.playout_state import PlayoutState
from hark.session.rate_limits import RateWindow
from hark.session.recognition import Recognition
from hark.session.speculation import Speculation
from hark.tools.mcp_server import McpServer

# The tokens an image is estimated at in ``usage`` (what the OpenAI-compatible engine
# estimates one at for truncation).
IMAGE_TOKENS = 800
# The ``CallMcpTool`` response id of calls run when the user approves them, outside any
# response (no response is named so: response ids start with ``resp_``).
APPROVED_CALLS = "approved"
# The most responses a session may have in progress at once, out of band and in the
# conversation together: each holds LLM and TTS work, and out-of-band ones are not limited to
# one by the conversation. Past it ``response.create`` is refused with an error.
MAX_RESPONSES_IN_PROGRESS = 16


@dataclass(slots=True)
class Response:
    """A response in progress: its settings (the session's, overridden by
    ``response.create``) and the output made so far."""

    id: str
    in_band: bool
    modalities: list[str]
    audio_format: AudioFormat
    voice: str
    speed: float
    max_output_tokens: int | Literal["inf"]
    metadata: dict[str, str] | None
    instructions: str
    tools: list[FunctionToolDef]
    # The response's own MCP servers (from its ``tools``), or None: it has the session's
    # (as it does unless it sets its own tools).
    mcp_configs: list[McpToolDef] | None
    tool_choice: ToolChoiceConfig
    temperature: float | None
    inputs: list[Entry] | None
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"] = "in_progress"
    status_details: dict[str, Any] | None = None
    output: list[Entry] = field(default_factory=list)
    message: Entry | None = None
    calls: dict[str, Entry] = field(default_factory=dict)
    generating: bool = False
    # The player dropped its audio (``output_audio_buffer.clear``): the item holds what was
    # heard, and what the engines still make is neither played nor kept.
    audio_cut: bool = False
    usage: se.Usage | None = None
    # Its own MCP servers (``mcp_configs``) by label, once opened: listed, or being listed.
    mcp_servers: dict[str, ListedServer] = field(default_factory=dict)
    # The MCP tools offered to the LLM, by the name it calls them.
    mcp_names: dict[str, McpTarget] = field(default_factory=dict)
    # MCP calls whose arguments are still streaming (by call id), and those running (item ids).
    mcp_calls: dict[str, Entry] = field(default_factory=dict)
    mcp_running: set[str] = field(default_factory=set)
    # Results of MCP calls that returned while the LLM was still running, announced when it
    # is done: (item id, output, error).
    mcp_results: list[tuple[str, str | None, wire.McpCallError | None]] = field(
        default_factory=list
    )
    # The LLM was asked for the response (once: the response ends when that run and its MCP
    # calls are done).
    started: bool = False
    # False: at most one tool call per LLM run (``parallel_tool_calls``).
    parallel_tool_calls: bool = True
    # ``reasoning.effort``, for a reasoning model.
    reasoning_effort: str | None = None
    # The LLM has called a tool.
    called: bool = False
    # The LLM's token counts.
    tokens: Finished = field(default_factory=lambda: Finished("stop"))

    @property
    def audio(self) -> bool:
        """Whether the response speaks (its output is audio, with a transcript)."""
        return self.modalities == ["audio"]

    @property
    def servers(self) -> dict[str, ListedServer] | None:
        """The MCP servers whose tools it may call: its own, or None for the session's."""
        return None if self.mcp_configs is None else self.mcp_servers

    def to_wire(self) -> se.Response:
        """The response as ``response.created`` and ``response.done`` carry it."""
        return se.Response(
            id=self.id,
            status=self.status,
            status_details=self.status_details,
            output=[e.to_wire() for e in self.output],
            conversation_id="conv_default" if self.in_band else None,
            output_modalities=list(self.modalities),
            max_output_tokens=self.max_output_tokens,
            audio=se.ResponseAudioConfig(
                output={"format": msgspec.to_builtins(self.audio_format), "voice": self.voice}
            ),
            usage=self.usage,
            metadata=self.metadata,
        )


class ResponseLifecycle(SessionPart):
    """The session's responses in progress: the conversation's one (``in_band``) and any
    number out of band.

    ``context`` holds the session's outbox, ids, conversation, configuration and
    ``audio_retention_ms`` (see ``limit_audio``). What completes a response (``finished``,
    ``mcp_call_done``, ``tool_call_finished``) returns how much audio the conversation's
    response had when it completed on a transport where the client plays the audio
    (WebSocket): the idle timeout counts from the end of that reply, which turn-taking owns. A
    response that ends while an item of its own ``input`` is still being transcribed tells
    ``recognition`` its words are not needed.
    """

    def __init__(
        self,
        context: SessionContext,
        *,
        rates: RateWindow,
        speculation: Speculation,
        playout: PlayoutState,
        plays_audio: bool,
        mcp: McpTools,
        recognition: Recognition,
    ) -> None:
        super().__init__(context)
        self._rates = rates
        self._speculation = speculation
        self._playout = playout
        self._plays_audio = plays_audio
        self._mcp = mcp
        # Calls the user approved, running outside any response: item id → the mcp_call item.
        self._approved_calls: dict[str, Entry] = {}
        self._recognition = recognition
        self.responses: dict[str, Response] = {}
        self.in_band: Response | None = None
        # Whether any assistant audio was made (the voice cannot change after that).
        self.audio_produced = False

    def create(
        self,
        params: ResponseParams,
        read_inputs: Callable[[list[wire.ResponseInputItem]], list[Entry]],
        now: float,
    ) -> None:
        """Create a response for ``params`` at wall time ``now`` and start its engine work (or
        wait for the words it needs); ``read_inputs`` turns ``params.input`` into entries.
        Raises ``ProtocolError`` for a response that cannot be created."""
        in_band = params.conversation == "auto"
        if in_band and self.in_band is not None:
            raise ProtocolError(
                "Conversation already has an active response in progress: "
                f"{self.in_band.id}. Wait until the response is finished before creating a "
                "new one.",
                code="conversation_already_has_active_response",
            )
        if len(self.responses) >= MAX_RESPONSES_IN_PROGRESS:
            raise ProtocolError(
                f"The session already has {len(self.responses)} responses in progress, the "
                "most it may have; wait until one is finished before creating another.",
                code="too_many_responses_in_progress",
            )
        inputs = None
        if params.input is not None:
            inputs = read_inputs(params.input)
        response = self.new_response(params, self._ids.new("resp"), inputs)
        try:
            self._check_tool_choice(response)
        except ProtocolError:
            for entry in inputs or ():
                self._recognition.abandon(entry)
            raise
        self.responses[response.id] = response
        if in_band:
            self.in_band = response
        self._outbox.emit(se.ResponseCreated(response=response.to_wire()))
        update, limited = self._rates.admit(now)
        self._outbox.emit(update)
        if limited:
            self.failed(
                response.id,
                "The session's rate limit was reached; try again shortly.",
                "rate_limit_exceeded",
                "rate_limit_error",
            )
            return
        if response.mcp_configs:
            response.mcp_servers = self._mcp.open_for_response(
                response.mcp_configs, lambda entry: self._add_output(response, entry)
            )
        self._start_generation(response)

    def listing_done(self, entry: Entry) -> None:
        """One of a response's own MCP servers was listed (or could not be): its item is
        done, and the response starts once all its servers are."""
        response = self.owner(entry)
        if response is None:
            return
        self._finish_item(response, entry, response.output.index(entry))
        self._start_generation(response)

    def _check_tool_choice(self, response: Response) -> None:
        """Raises ``ProtocolError`` when ``response``'s ``tool_choice`` names a tool it does
        not have."""
        if isinstance(
            response.tool_choice, ToolChoiceFunction
        ) and response.tool_choice.name not in {t.name for t in response.tools}:
            raise ProtocolError(
                f"tool_choice names '{response.tool_choice.name}', which is not in tools.",
                "response.tool_choice.name",
            )
        if not isinstance(response.tool_choice, ToolChoiceMcp):
            return
        label = response.tool_choice.server_label
        if response.mcp_configs is None:
            if self._mcp.server(label) is None:
                raise ProtocolError(
                    f"tool_choice names the MCP server '{label}', which the session's tools "
                    "do not have.",
                    "response.tool_choice.server_label",
                )
        elif label not in {c.server_label for c in response.mcp_configs}:
            raise ProtocolError(
                f"tool_choice names the MCP server '{label}', which the response's tools do "
                "not have (a response with tools of its own has none of the session's).",
                "response.tool_choice.server_label",
            )

    def new_response(
        self, params: ResponseParams, response_id: str, inputs: list[Entry] | None = None
    ) -> Response:
        """A response object for ``params`` over the session's settings (no side effects)."""
        cfg = self._context.config
        audio_out = params.audio.output if params.audio and params.audio.output else None
        return Response(
            id=response_id,
            in_band=params.conversation == "auto",
            modalities=list(params.output_modalities or cfg.output_modalities),
            audio_format=(audio_out.format if audio_out and audio_out.format else None)
            or cfg.audio.output.format,
            voice=voice_name(
                (audio_out.voice if audio_out and audio_out.voice else None)
                or cfg.audio.output.voice
            ),
            speed=(audio_out.speed if audio_out and audio_out.speed else None)
            or cfg.audio.output.speed,
            max_output_tokens=params.max_output_tokens or cfg.max_output_tokens,
            metadata=params.metadata,
            instructions=params.instructions
            if params.instructions is not None
            else cfg.instructions,
            tools=[
                t
                for t in (params.tools if params.tools is not None else cfg.tools)
                if isinstance(t, FunctionToolDef)
            ],
            mcp_configs=None
            if params.tools is None
            else [t for t in params.tools if isinstance(t, McpToolDef)],
            tool_choice=params.tool_choice or cfg.tool_choice,
            temperature=params.temperature if params.temperature is not None else cfg.temperature,
            inputs=inputs,
            parallel_tool_calls=(
                cfg.parallel_tool_calls is not False
                if params.parallel_tool_calls is None
                else params.parallel_tool_calls
            ),
            reasoning_effort=(params.reasoning or cfg.reasoning or Reasoning()).effort,
        )

    def resume_waiting(self) -> None:
        """Words the responses may be waiting for became known: start those that can."""
        for response in list(self.responses.values()):
            if not response.started:
                self._start_generation(response)

    def words_failed(self, entry: Entry, message: str) -> None:
        """Recognising ``entry``'s audio failed: the responses waiting for its words fail (one
        started already read the conversation without it)."""
        for response in list(self.responses.values()):
            if response.started or not any(e is entry for e in self._entries_of(response)):
                continue
            self.failed(
                response.id,
                f"The input audio could not be transcribed: {message}",
                "transcription_failed",
            )

    def _entries_of(self, response: Response) -> list[Entry]:
        """What ``response`` reads: its own ``input``, else the conversation."""
        return response.inputs if response.inputs is not None else self._conversation.entries()

    def _start_generation(self, response: Response) -> None:
        entries = self._entries_of(response)
        if response.started or any(e.pending_recognition() for e in entries):
            return
        if response.in_band and self._approved_calls:
            # The calls the user approved are still running: the LLM reads their results.
            return
        if any(server.listing for server in response.mcp_servers.values()):
            # Its own MCP servers are still being listed: the LLM is offered their tools.
            return
        response.started = True
        response.generating = True
        generate = self.generate_action(response, entries)
        if not (response.in_band and self._speculation.adopt(generate)):
            self._outbox.act(generate)

    def generate_action(self, response: Response, entries: list[Entry]) -> Generate:
        """The engine work for ``response`` over ``entries``: the same for a speculative reply
        and the real one, so that one can become the other."""
        choice = response.tool_choice
        max_tokens = response.max_output_tokens
        tools = [
            FunctionTool(name=t.name, description=t.description, parameters=t.parameters)
            for t in response.tools
        ]
        response.mcp_names = {}
        offered = self._mcp.offered({t.name for t in tools}, response.servers)
        for name, (target, tool) in offered.items():
            schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
            tools.append(FunctionTool(name, tool.description or "", schema))
            response.mcp_names[name] = target
        if isinstance(choice, ToolChoiceFunction):
            tool_choice = ToolChoice(mode="function", name=choice.name)
        elif isinstance(choice, ToolChoiceMcp):
            tool_choice, tools = _mcp_choice(choice, tools, response.mcp_names)
        else:
            tool_choice = ToolChoice(mode=choice)
        request = GenerationRequest(
            messages=tuple(chat_messages(response.instructions, entries)),
            tools=tuple(tools),
            tool_choice=tool_choice,
            max_tokens=None if max_tokens == "inf" else max_tokens,
            temperature=response.temperature,
            truncation=engine_truncation(self._context.config.truncation),
            parallel_tool_calls=response.parallel_tool_calls,
            reasoning_effort=response.reasoning_effort,
        )
        return Generate(
            response_id=response.id,
            request=request,
            audio=response.audio,
            voice=response.voice,
            speed=response.speed,
            output_rate=format_rate(response.audio_format),
        )

    def cancel(self, response_id: str | None) -> None:
        """``response.cancel``: the named response, or the conversation's (else any)."""
        if response_id is not None:
            response = self.responses.get(response_id)
            if response is None:
                raise ProtocolError(
                    f"No response in progress with id {response_id[:100]}.",
                    "response_id",
                    "response_cancel_not_active",
                )
        else:
            response = self.in_band or next(iter(self.responses.values()), None)
            if response is None:
                raise ProtocolError(
                    "Cancellation failed: no active response found.",
                    code="response_cancel_not_active",
                )
        self.end_response(
            response, "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
        )

    def prefill(self) -> None:
        """Let the LLM read the conversation as the next turn's prompt will begin."""
        if self._context.config.type != "realtime" or self.in_band is not None:
            return
        response = self.new_response(ResponseParams(), response_id="")
        self._outbox.act(
            Prefill(self.generate_action(response, self._conversation.entries()).request)
        )

    def prefill_turn(self, words: str) -> None:
        """Let the LLM read the turn being spoken as far as ``words`` (its committed words), so
        that the reply at its end reads only the words after them. Only for turns that get a
        reply of their own: a session that captions and does not answer spends nothing."""
        cfg = self._context.config
        detection = cfg.audio.input.turn_detection
        if (
            not words
            or cfg.type != "realtime"
            or self.in_band is not None
            or detection is None
            or not detection.create_response
        ):
            return
        response = self.new_response(ResponseParams(), response_id="")
        request = self.generate_action(response, self._conversation.entries()).request
        messages = (*request.messages, ChatMessage(role="user", content=words))
        self._outbox.act(Prefill(dataclasses.replace(request, messages=messages, open_turn=True)))

    def owner(self, entry: Entry) -> Response | None:
        """The response in progress that ``entry`` is output of, if any."""
        return next((r for r in self.responses.values() if entry in r.output), None)

    def limit_audio(self) -> None:
        """Hold conversation audio to the retention budget; replies still being generated or
        played keep theirs, whatever their length."""
        keep = {e.id for r in self.responses.values() for e in r.output}
        keep |= self._playout.item_ids()
        self._conversation.limit_audio(self._context.audio_retention_ms, keep)

    def _add_output(self, response: Response, entry: Entry) -> int:
        index = len(response.output)
        response.output.append(entry)
        self._outbox.emit(
            se.OutputItemAdded(response_id=response.id, output_index=index, item=entry.to_wire())
        )
        if response.in_band:
            previous = self._conversation.insert(entry)
            self._outbox.emit(
                se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire())
            )
        return index

    def _message(self, response: Response) -> tuple[Entry, Part, dict[str, Any]]:
        """The response's assistant message, created with its content part on first use."""
        if response.message is None:
            kind: Literal["output_audio", "output_text"] = (
                "output_audio" if response.audio else "output_text"
            )
            part = Part(kind, text="" if kind == "output_text" else None)
            if kind == "output_audio":
                part.transcript = ""
                part.audio = np.zeros(0, np.int16)
                part.audio_format = response.audio_format
                part.rate = format_rate(response.audio_format)
            # Announced empty, as OpenAI does: the part follows with content_part.added.
            entry = Entry(
                id=self._ids.new("item"), type="message", role="assistant", status="in_progress"
            )
            response.message = entry
            index = self._add_output(response, entry)
            entry.parts.append(part)
            self._outbox.emit(
                se.ContentPartAdded(
                    response_id=response.id,
                    item_id=entry.id,
                    output_index=index,
                    content_index=0,
                    part=_part_summary(part),
                )
            )
        entry = response.message
        position = {
            "response_id": response.id,
            "item_id": entry.id,
            "output_index": response.output.index(entry),
            "content_index": 0,
        }
        return entry, entry.parts[0], position

    def text(self, response_id: str, delta: str) -> None:
        """LLM text for a text-only response."""
        response = self.responses.get(response_id)
        if response is None or response.audio or not delta:
            return
        _, part, position = self._message(response)
        part.text = (part.text or "") + delta
        self._outbox.emit(se.OutputTextDelta(delta=delta, **position))

    def audio(self, response_id: str, pcm: npt.NDArray[np.int16], transcript: str) -> None:
        """Reply audio at the output rate; ``transcript`` is the text this audio starts to speak."""
        response = self.responses.get(response_id)
        if response is None or not response.audio or response.audio_cut:
            return
        _, part, position = self._message(response)
        assert part.audio is not None and part.audio_format is not None
        start = len(part.audio)
        part.extend_audio(pcm)
        if transcript or not part.segments:
            part.segments.append(AudioSegment(start, len(part.audio), transcript))
        else:
            part.segments[-1].end = len(part.audio)
        self.audio_produced = True
        if transcript:
            part.transcript = (part.transcript or "") + transcript
            self._outbox.emit(se.OutputAudioTranscriptDelta(delta=transcript, **position))
        if not len(pcm):
            return
        if self._plays_audio:
            self._playout.queued(response.id, position["item_id"], response.in_band)
            self._outbox.act(PlayAudio(response.id, position["item_id"], pcm, part.rate))
        else:
            payload = base64.b64encode(encode_audio(part.audio_format, pcm)).decode()
            self._outbox.emit(se.OutputAudioDelta(delta=payload, **position))

    def audio_cleared(self, response_id: str) -> None:
        """The player dropped the rest of a response's audio: the server stops making it
        heard (OpenAI's ``output_audio_buffer.clear``), so the item keeps what was played."""
        response = self.responses.get(response_id)
        if response is not None:
            response.audio_cut = True

    def _close_message(
        self, response: Response, status: Literal["completed", "incomplete"]
    ) -> None:
        if response.message is None:
            return
        entry, part, position = self._message(response)
        response.message = None
        entry.status = status
        emit = self._outbox.emit
        if part.type == "output_audio":
            part.compact_audio()
            self.limit_audio()
            emit(se.OutputAudioDone(**position))
            emit(se.OutputAudioTranscriptDone(transcript=part.transcript or "", **position))
        else:
            emit(se.OutputTextDone(text=part.text or "", **position))
        emit(se.ContentPartDone(part=_part_summary(part), **position))
        self._finish_item(response, entry, position["output_index"])

    def _finish_item(self, response: Response, entry: Entry, index: int) -> None:
        self._outbox.emit(
            se.OutputItemDone(response_id=response.id, output_index=index, item=entry.to_wire())
        )
        if response.in_band and entry.id in self._conversation:
            entries = self._conversation.entries()
            position = entries.index(entry)
            previous = entries[position - 1].id if position else None
            self._outbox.emit(
                se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire())
            )

    def tool_call_started(self, response_id: str, call_id: str, name: str) -> None:
        """The LLM began a function call."""
        response = self.responses.get(response_id)
        if response is None or (response.called and not response.parallel_tool_calls):
            # Calls after the first of a run, with parallel_tool_calls false, are dropped
            # (their arguments and end with them): the model asked for one at a time.
            return
        response.called = True
        self._close_message(response, "completed")
        target = response.mcp_names.get(name)
        if target is not None:
            self._mcp_call_started(response, call_id, target)
            return
        entry = Entry(
            id=self._ids.new("item"),
            type="function_call",
            status="in_progress",
            name=name,
            call_id=call_id,
        )
        response.calls[call_id] = entry
        self._add_output(response, entry)

    def tool_call_delta(self, response_id: str, call_id: str, delta: str) -> None:
        """A piece of a function call's arguments, or of an MCP call's (an approval request
        shows its arguments once they are whole)."""
        response = self.responses.get(response_id)
        if response is None:
            return
        entry = response.mcp_calls.get(call_id)
        if entry is None:
            entry = response.calls.get(call_id)
            if entry is None:
                return
        entry.arguments += delta
        event: se.FunctionCallArgumentsDelta | se.ResponseMcpCallArgumentsDelta
        if entry.mcp is None:
            event = se.FunctionCallArgumentsDelta(
                response_id=response.id,
                item_id=entry.id,
                output_index=response.output.index(entry),
                call_id=call_id,
                delta=delta,
            )
        elif isinstance(entry.mcp, wire.McpCallItem):
            event = se.ResponseMcpCallArgumentsDelta(
                response_id=response.id,
                item_id=entry.id,
                output_index=response.output.index(entry),
                delta=delta,
            )
        else:
            return
        self._outbox.emit(event)

    def tool_call_finished(self, response_id: str, call_id: str, arguments: str) -> float | None:
        """A function call is complete; returns the audio of the reply it completed, if it
        did (see the class)."""
        response = self.responses.get(response_id)
        if response is not None and call_id in response.mcp_calls:
            return self._mcp_call_finished(response, response.mcp_calls.pop(call_id), arguments)
        entry = response.calls.pop(call_id, None) if response else None
        if response is None or entry is None:
            return None
        entry.arguments = arguments
        entry.status = "completed"
        index = response.output.index(entry)
        self._outbox.emit(
            se.FunctionCallArgumentsDone(
                response_id=response.id,
                item_id=entry.id,
                output_index=index,
                call_id=call_id,
                name=entry.name,
                arguments=arguments,
            )
        )
        self._finish_item(response, entry, index)
        return None

    # ------------------------------------------------------------------ MCP calls

    def _mcp_call_started(self, response: Response, call_id: str, target: McpTarget) -> None:
        """The LLM began calling an MCP tool: an ``mcp_call`` item, or an
        ``mcp_approval_request`` when the user must approve it first."""
        item: wire.McpCallItem | wire.McpApprovalRequestItem
        if self._mcp.needs_approval(target, response.servers):
            item = wire.McpApprovalRequestItem(
                server_label=target.server_label, name=target.name, arguments=""
            )
        else:
            item = wire.McpCallItem(
                server_label=target.server_label, name=target.name, arguments=""
            )
        entry = Entry(id=self._ids.new("item"), type="mcp", status="in_progress", mcp=item)
        response.mcp_calls[call_id] = entry
        self._add_output(response, entry)

    def _mcp_call_finished(self, response: Response, entry: Entry, arguments: str) -> float | None:
        entry.arguments = arguments
        item = entry.mcp
        assert isinstance(item, wire.McpCallItem | wire.McpApprovalRequestItem)
        entry.mcp = msgspec.structs.replace(item, arguments=arguments)
        index = response.output.index(entry)
        if isinstance(item, wire.McpApprovalRequestItem):
            # The call waits for the client's mcp_approval_response; this response goes on
            # without it.
            entry.status = "completed"
            own = None
            if response.servers is not None:
                own = self._mcp.server(item.server_label, response.servers)
            self._mcp.await_approval(entry, own)
            self._finish_item(response, entry, index)
            return None
        self._outbox.emit(
            se.ResponseMcpCallArgumentsDone(
                response_id=response.id, item_id=entry.id, output_index=index, arguments=arguments
            )
        )
        return self._call_mcp(response, entry)

    def run_approved(self) -> None:
        """The conversation answered approval requests: each approved call runs now, without
        waiting for a ``response.create`` (as OpenAI's clients expect: they ask for the answer
        once ``response.mcp_call.completed`` came), as an ``mcp_call`` item of the
        conversation that no response holds; the next response reads its result."""
        for request_id, request, server in self._mcp.take_approved():
            item = wire.McpCallItem(
                server_label=request.server_label,
                name=request.name,
                arguments=request.arguments,
                approval_request_id=request_id,
            )
            entry = Entry(id=self._ids.new("item"), type="mcp", status="in_progress", mcp=item)
            previous = self._conversation.insert(entry)
            self._outbox.emit(
                se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire())
            )
            self._approved_calls[entry.id] = entry
            if server is None:
                server = self._mcp.server(request.server_label)
            self._send_mcp_call(APPROVED_CALLS, entry, 0, server)

    def _approved_call_done(
        self, item_id: str, output: str | None, error: wire.McpCallError | None
    ) -> None:
        entry = self._approved_calls.pop(item_id, None)
        if entry is None:
            return
        self._mcp_result(entry, 0, output, error)
        self._mcp.item_done(entry)
        self.resume_waiting()

    def _call_mcp(self, response: Response, entry: Entry) -> float | None:
        index = response.output.index(entry)
        response.mcp_running.add(entry.id)
        assert isinstance(entry.mcp, wire.McpCallItem)
        server = self._mcp.server(entry.mcp.server_label, response.servers)
        return self._send_mcp_call(response.id, entry, index, server)

    def _send_mcp_call(
        self, response_id: str, entry: Entry, index: int, server: McpServer | None
    ) -> float | None:
        """Ask the driver to run the MCP call ``entry`` (``output_index`` ``index``) for
        ``response_id`` on ``server``; a call whose server is gone (None) fails at once (and
        may complete the response: see ``mcp_call_done``)."""
        item = entry.mcp
        assert isinstance(item, wire.McpCallItem)
        self._outbox.emit(se.ResponseMcpCallInProgress(item_id=entry.id, output_index=index))
        if server is None:
            return self.mcp_call_done(response_id, entry.id, error=_server_gone(item.server_label))
        self._outbox.act(CallMcpTool(response_id, entry.id, server, item.name, item.arguments))
        return None

    def _mcp_result(
        self, entry: Entry, index: int, output: str | None, error: wire.McpCallError | None
    ) -> None:
        """The MCP call ``entry`` returned ``output``, or failed with ``error``."""
        assert isinstance(entry.mcp, wire.McpCallItem)
        entry.mcp = msgspec.structs.replace(entry.mcp, output=output, error=error)
        entry.status = "completed" if error is None else "incomplete"
        if error is None:
            self._outbox.emit(se.ResponseMcpCallCompleted(item_id=entry.id, output_index=index))
        else:
            self._outbox.emit(se.ResponseMcpCallFailed(item_id=entry.id, output_index=index))

    def mcp_call_done(
        self,
        response_id: str,
        item_id: str,
        output: str | None = None,
        error: wire.McpCallError | None = None,
    ) -> float | None:
        """An MCP call returned ``output``, or failed with ``error``. The result is announced
        at once, or, while the LLM is still running, when it is done: a client asks for the
        next response when it sees the result, and ``response.done`` must come first.
        Returns the audio of the reply it completed, if it did (see the class)."""
        if response_id == APPROVED_CALLS:
            self._approved_call_done(item_id, output, error)
            return None
        response = self.responses.get(response_id)
        if response is None or item_id not in response.mcp_running:
            return None
        if response.generating:
            response.mcp_results.append((item_id, output, error))
            return None
        self._announce_result(response, item_id, output, error)
        return self._go_on(response)

    def _announce_result(
        self,
        response: Response,
        item_id: str,
        output: str | None,
        error: wire.McpCallError | None,
    ) -> None:
        response.mcp_running.discard(item_id)
        entry = next(e for e in response.output if e.id == item_id)
        index = response.output.index(entry)
        self._mcp_result(entry, index, output, error)
        self._finish_item(response, entry, index)

    def _go_on(self, response: Response) -> float | None:
        """The LLM's run or an MCP call ended: once both are, the response is done. It does
        not go on with the calls' results: as with OpenAI, the client's next
        ``response.create`` reads them (the JS agents SDK sends one after every MCP call,
        and a response that went on would answer twice)."""
        if response.generating or response.mcp_running:
            return None
        return self._complete(response)

    def finished(self, response_id: str, finished: Finished) -> float | None:
        """The LLM is done with a response (and TTS with its words); returns the audio of the
        reply it completed, if it did (see the class)."""
        response = self.responses.get(response_id)
        if response is None:
            return None
        response.generating = False
        response.tokens = finished
        for item_id, output, error in response.mcp_results:
            self._announce_result(response, item_id, output, error)
        response.mcp_results.clear()
        if finished.reason == "length":
            return self._complete(response)
        return self._go_on(response)

    def _complete(self, response: Response) -> float | None:
        """End ``response``; returns how much audio it had when it was the conversation's reply
        and the client plays it (the idle timeout counts from its end)."""
        finished = response.tokens
        audio_ms = sum(
            p.duration_ms() for e in response.output for p in e.parts if p.type == "output_audio"
        )
        read = [e for e in self._entries_of(response) if e not in response.output]
        response.usage = _usage(
            finished,
            output_audio_tokens=math.ceil(audio_ms / 50),
            input_estimate=_input_estimate(read),
        )
        self._rates.count_tokens(response.usage.total_tokens)
        if finished.reason == "length":
            self.end_response(
                response, "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
            )
        else:
            self.end_response(response, "completed", None)
        if response.in_band and not self._plays_audio:
            return audio_ms
        return None

    def failed(
        self,
        response_id: str,
        message: str,
        code: str = "engine_error",
        error_type: str = "server_error",
    ) -> None:
        """This response fails with ``code`` (an engine failed, by default); the session goes
        on."""
        response = self.responses.get(response_id)
        if response is None:
            return
        self.end_response(
            response,
            "failed",
            {"type": "failed", "error": {"type": error_type, "code": code, "message": message}},
        )

    def end_response(
        self,
        response: Response,
        status: Literal["completed", "cancelled", "failed", "incomplete"],
        details: dict[str, Any] | None,
    ) -> None:
        """End ``response`` with ``status``: its items are closed, its engine work stopped
        unless it completed, and the player told that no more audio comes."""
        if response.id not in self.responses:
            return
        if status != "completed":
            self._outbox.act(CancelGeneration(response.id))
        item_status: Literal["completed", "incomplete"] = (
            "completed" if status == "completed" else "incomplete"
        )
        self._close_message(response, item_status)
        self._playout.finish(response.id)
        for call_id, entry in list(response.calls.items()):
            entry.status = "incomplete"
            del response.calls[call_id]
            self._finish_item(response, entry, response.output.index(entry))
        unfinished = [*response.mcp_calls.values()]
        unfinished += [e for e in response.output if e.id in response.mcp_running]
        response.mcp_calls.clear()
        response.mcp_running.clear()
        for entry in unfinished:
            entry.status = "incomplete"
            self._finish_item(response, entry, response.output.index(entry))
        # Listings of its own servers still running are for nobody now: their items end
        # with no tools.
        self._mcp.abandon(response.mcp_servers)
        for server in response.mcp_servers.values():
            if server.listing and server.item is not None:
                server.listing = False
                self._finish_item(response, server.item, response.output.index(server.item))
        response.status = status
        response.status_details = details
        del self.responses[response.id]
        for entry in response.inputs or ():
            if entry.pending_recognition():
                self._recognition.abandon(entry)
        if self.in_band is response:
            self.in_band = None
        self._outbox.emit(se.ResponseDone(response=response.to_wire()))
        if response.in_band:
            self.prefill()

    def cancel_all(self) -> None:
        """The session ends: every response is cancelled."""
        for response in list(self.responses.values()):
            self.end_response(response, "cancelled", {"type": "cancelled", "reason": None})


def _mcp_choice(
    choice: ToolChoiceMcp, tools: list[FunctionTool], offered: dict[str, McpTarget]
) -> tuple[ToolChoice, list[FunctionTool]]:
    """A ``tool_choice`` naming an MCP server as the LLM takes it: a call of the named tool,
    or of any of the server's tools (the only ones offered). A server whose tools are not
    listed yet (or lets none through) forces nothing: the model answers without them."""
    names = [
        name
        for name, target in offered.items()
        if target.server_label == choice.server_label
        and (choice.name is None or target.name == choice.name)
    ]
    if not names:
        return ToolChoice(mode="auto"), tools
    if choice.name is not None:
        return ToolChoice(mode="function", name=names[0]), tools
    return ToolChoice(mode="required"), [t for t in tools if t.name in names]


def _server_gone(label: str) -> wire.McpCallError:
    """The error of a call whose MCP server the session no longer has."""
    return wire.McpCallError(
        type="protocol_error",
        code=-32602,
        message=f"The session no longer has the MCP server '{label}'.",
    )


def engine_truncation(truncation: SessionTruncation) -> Truncation:
    """The session's ``truncation`` as the LLM engines take it."""
    if isinstance(truncation, str):
        return Truncation(mode=truncation)
    limits = truncation.token_limits
    return Truncation(
        mode="retention_ratio",
        retention_ratio=truncation.retention_ratio,
        post_instructions_tokens=limits.post_instructions if limits else None,
    )


def _input_estimate(entries: list[Entry]) -> tuple[int, int]:
    """The audio and image tokens OpenAI would count for reading ``entries``: a user's audio
    one token per 100 ms and the assistant's one per 50 ms (OpenAI's rates), an image
    ``IMAGE_TOKENS``. hark's LLM reads the audio's words, counted as text; the estimate is
    what a bill for the same conversation would say."""
    audio = images = 0
    for entry in entries:
        for part in entry.parts:
            if part.type == "input_audio":
                audio += math.ceil(part.audio_ms() / 100)
            elif part.type == "output_audio":
                audio += math.ceil(part.audio_ms() / 50)
            elif part.type == "input_image":
                images += IMAGE_TOKENS
    return audio, images


def _usage(
    finished: Finished, output_audio_tokens: int, input_estimate: tuple[int, int] = (0, 0)
) -> se.Usage:
    """A response's ``usage``; its audio counts as one token per 50 ms, and the audio and
    images it read as ``input_estimate`` says (their tokens added to the input; an image's
    taken out of the text the LLM counted, which holds it)."""
    audio_tokens, image_tokens = input_estimate
    text_tokens = max(0, finished.prompt_tokens - image_tokens)
    input_tokens = text_tokens + audio_tokens + image_tokens
    return se.Usage(
        total_tokens=input_tokens + finished.completion_tokens + output_audio_tokens,
        input_tokens=input_tokens,
        output_tokens=finished.completion_tokens + output_audio_tokens,
        input_token_details={
            "text_tokens": text_tokens,
            "audio_tokens": audio_tokens,
            "image_tokens": image_tokens,
            "cached_tokens": finished.cached_tokens,
            "cached_tokens_details": {
                "text_tokens": finished.cached_tokens,
                "audio_tokens": 0,
                "image_tokens": 0,
            },
        },
        output_token_details={
            "text_tokens": finished.completion_tokens,
            "audio_tokens": output_audio_tokens,
        },
    )


def voice_name(voice: str | VoiceId) -> str:
    """A voice's name, whether given by name or as ``{"id": …}``."""
    return voice.id if isinstance(voice, VoiceId) else voice


def _part_summary(part: Part) -> dict[str, Any]:
    if part.type == "output_audio":
        return {"type": "audio", "transcript": part.transcript or ""}
    return {"type": "text", "text": part.text or ""}

"""The GA session configuration, its validation and partial updates."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct, field

from hark.protocol import prompts
from hark.protocol.errors import ProtocolError, from_validation_error
from hark.protocol.prompts import PromptReference, PromptStore, PromptStoreError

DEFAULT_INSTRUCTIONS = (
    "You are a helpful voice assistant. Answer in one short, plain sentence that reads well aloud."
)


class ConfigStruct(Struct, forbid_unknown_fields=True, omit_defaults=False, kw_only=True):
    """Base for config objects: unknown fields are errors, as with OpenAI."""


class PcmFormat(ConfigStruct, tag="audio/pcm", tag_field="type"):
    """16-bit little-endian mono PCM at 24 kHz."""

    rate: Literal[24000] = 24000


class PcmuFormat(ConfigStruct, tag="audio/pcmu", tag_field="type"):
    """G.711 μ-law at 8 kHz."""


class PcmaFormat(ConfigStruct, tag="audio/pcma", tag_field="type"):
    """G.711 A-law at 8 kHz."""


AudioFormat = PcmFormat | PcmuFormat | PcmaFormat


class NoiseReduction(ConfigStruct):
    """Input noise reduction (RNNoise; see ``hark.session.noise_reduction``): ``type`` picks how
    much of the input is kept, ``strength`` (1 when unset) scales the suppression."""

    type: Literal["near_field", "far_field"] | None = None
    strength: Annotated[float, Meta(ge=0, le=1)] | None = None


class Transcription(ConfigStruct):
    """Input transcription settings (events for the user's audio)."""

    model: str | None = "whisper-1"
    language: str | None = None
    prompt: str | None = None
    languages: list[str] | None = None
    keywords: list[str] | None = None
    delay: Literal["minimal", "low", "medium", "high", "xhigh"] | None = None


class ServerVad(ConfigStruct, tag="server_vad", tag_field="type"):
    """Turn detection by voice activity and a silence window."""

    threshold: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5
    prefix_padding_ms: Annotated[int, Meta(ge=0, le=10_000)] = 300
    silence_duration_ms: Annotated[int, Meta(ge=0, le=10_000)] = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: Annotated[int, Meta(ge=1000, le=120_000)] | None = None
    # hark's own: a backchannel ("uh-huh", "yeah") while the reply plays does not interrupt
    # it (``hark.session.backchannel``). None: the detection's default, off for server_vad.
    hark_backchannels: bool | None = None


class SemanticVad(ConfigStruct, tag="semantic_vad", tag_field="type"):
    """Turn detection that waits longer when the utterance sounds unfinished."""

    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True
    # hark's own, as for server_vad; None: on for semantic_vad.
    hark_backchannels: bool | None = None


TurnDetection = ServerVad | SemanticVad


class AudioInput(ConfigStruct):
    """How the client's audio arrives and is interpreted."""

    format: AudioFormat = field(default_factory=PcmFormat)
    noise_reduction: NoiseReduction | None = None
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = field(default_factory=ServerVad)


class VoiceId(ConfigStruct):
    """A custom voice reference. Any id is accepted and echoed, as OpenAI takes the ids of
    the account's custom voices: one naming an installed voice of the TTS engine (hibari:
    ``heart``; Piper: the model's or a speaker's name) speaks with it, any other with the
    default voice."""

    id: str


# OpenAI's built-in voices (the SDK's ``audio.output.voice`` literals): the names a session
# accepts. Each TTS engine maps them onto voices it has (``hark.engines.tts.VoiceCatalog``).
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)


def check_voice(voice: str | VoiceId, param: str) -> None:
    """Refuse a voice name as OpenAI does (``invalid_value`` naming ``param``): a name must be
    one of OpenAI's; a custom ``{"id": …}`` voice may be any."""
    if isinstance(voice, str) and voice not in OPENAI_VOICES:
        choices = ", ".join(f"'{name}'" for name in OPENAI_VOICES[:-1])
        raise ProtocolError(
            f"Invalid value: '{voice[:100]}'. Supported values are: {choices}, and "
            f"'{OPENAI_VOICES[-1]}'.",
            param=param,
            code="invalid_value",
        )


class AudioOutput(ConfigStruct):
    """How reply audio is produced."""

    format: AudioFormat = field(default_factory=PcmFormat)
    voice: str | VoiceId = "alloy"
    speed: Annotated[float, Meta(ge=0.25, le=1.5)] = 1.0


class AudioConfig(ConfigStruct):
    """Input and output audio."""

    input: AudioInput = field(default_factory=AudioInput)
    output: AudioOutput = field(default_factory=AudioOutput)


class FunctionToolDef(ConfigStruct, tag="function", tag_field="type"):
    """A function the model may call; ``parameters`` is a JSON schema."""

    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


class McpToolFilter(ConfigStruct):
    """Which of an MCP server's tools a rule applies to: those named, and (when set) those
    whose ``readOnlyHint`` annotation is ``read_only``."""

    read_only: bool | None = None
    tool_names: list[str] | None = None


class McpApprovalFilter(ConfigStruct):
    """Which tools need the user's approval (``always``) and which do not (``never``)."""

    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpToolDef(ConfigStruct, tag="mcp", tag_field="type"):
    """A remote MCP server whose tools the model may call; hark lists and calls them.

    ``connector_id`` and ``tunnel_id`` are modelled so that they are named in the error:
    hark reaches MCP servers by ``server_url`` only.
    """

    server_label: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    server_url: str | None = None
    connector_id: str | None = None
    tunnel_id: str | None = None
    # Secrets: sent to the server, never echoed in session.updated nor logged.
    authorization: str | None = None
    headers: dict[str, str] | None = None
    allowed_tools: list[str] | McpToolFilter | None = None
    # None asks for approval of every call, as OpenAI does by default.
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None
    server_description: str | None = None
    # hark has no tool search: a deferred server's tools are listed and offered up front,
    # which is what a search would find.
    defer_loading: bool | None = None
    # Without "direct" the model may not call the tools itself; hark has no other caller.
    allowed_callers: list[Literal["direct", "programmatic"]] | None = None


ToolDef = FunctionToolDef | McpToolDef


class ToolChoiceFunction(ConfigStruct, tag="function", tag_field="type"):
    """Forces a call of the named function."""

    name: str


class ToolChoiceMcp(ConfigStruct, tag="mcp", tag_field="type"):
    """Forces a call of a tool of the MCP server ``server_label``: the named one, else any."""

    server_label: str
    name: str | None = None


ToolChoiceMode = Literal["auto", "none", "required"]
ToolChoiceConfig = ToolChoiceMode | ToolChoiceFunction | ToolChoiceMcp
Include = Literal[
    "item.input_audio_transcription.logprobs", "hark.turn_timings", "hark.backchannels"
]
MaxOutputTokens = Annotated[int, Meta(ge=1, le=4096)] | Literal["inf"]


class TruncationTokenLimits(ConfigStruct):
    """Custom limits for ``retention_ratio`` truncation."""

    post_instructions: Annotated[int, Meta(ge=1)] | None = None


class RetentionRatioTruncation(ConfigStruct, tag="retention_ratio", tag_field="type"):
    """When the conversation outgrows the context, drop down to this fraction of the tokens
    after the instructions at once, so that later turns keep the same beginning."""

    retention_ratio: Annotated[float, Meta(ge=0.0, le=1.0)]
    token_limits: TruncationTokenLimits | None = None


SessionTruncation = Literal["auto", "disabled"] | RetentionRatioTruncation

ReasoningEffort = Literal["minimal", "low", "medium", "high", "xhigh"]


class Reasoning(ConfigStruct):
    """``reasoning``: how hard a reasoning model thinks; passed to an OpenAI-compatible LLM
    as ``reasoning_effort`` (the embedded one does not reason)."""

    effort: ReasoningEffort | None = None


class SessionConfig(ConfigStruct):
    """The effective session configuration (GA shape)."""

    type: Literal["realtime", "transcription"] = "realtime"
    model: str = "gpt-realtime"
    instructions: str = DEFAULT_INSTRUCTIONS
    output_modalities: list[Literal["text", "audio"]] = field(default_factory=lambda: ["audio"])
    audio: AudioConfig = field(default_factory=AudioConfig)
    tools: list[ToolDef] = field(default_factory=list)
    tool_choice: ToolChoiceConfig = "auto"
    max_output_tokens: MaxOutputTokens = "inf"
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    truncation: SessionTruncation = "auto"
    tracing: Any = None
    # hark.turn_timings: a ``hark.turn_timings`` event with stage timings after each response;
    # hark.backchannels: a ``hark.backchannel`` event for each backchannel let pass.
    include: list[Include] | None = None
    # The stored prompt the session was last given (its fields applied then).
    prompt: PromptReference | None = None
    parallel_tool_calls: bool | None = None
    reasoning: Reasoning | None = None


TranscriptionInclude = Literal["item.input_audio_transcription.logprobs"]


class TranscriptionAudio(ConfigStruct):
    """A transcription session's audio: input only."""

    input: AudioInput = field(default_factory=AudioInput)


class TranscriptionSessionConfig(ConfigStruct):
    """What a transcription session's ``session.update`` may set (the SDK's
    ``RealtimeTranscriptionSessionCreateRequest``); kept as a ``SessionConfig`` of that type."""

    type: Literal["transcription"] = "transcription"
    audio: TranscriptionAudio = field(default_factory=TranscriptionAudio)
    include: list[TranscriptionInclude] | None = None


def transcription_defaults() -> SessionConfig:
    """A new transcription session: server VAD, and transcripts on (as ``whisper-1``), since
    transcripts are what such a session is for."""
    return SessionConfig(
        type="transcription",
        audio=AudioConfig(input=AudioInput(transcription=Transcription())),
    )


# Objects merged field by field on update; everything else is replaced whole.
# noise_reduction too: OpenAI keeps the current strength when an update leaves it out.
_MERGED = {
    ("audio",),
    ("audio", "input"),
    ("audio", "output"),
    ("audio", "input", "noise_reduction"),
}


def _merge(base: dict[str, Any], update: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        sub = (*path, key)
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            same_kind = "type" not in value or value.get("type") == old.get("type")
            if sub in _MERGED or (sub == ("audio", "input", "turn_detection") and same_kind):
                out[key] = _merge(old, value, sub)
                continue
        out[key] = value
    return out


def parse_session_config(
    data: object,
    *,
    base: SessionConfig | None = None,
    param_prefix: str = "session",
    refused: list[ProtocolError] | None = None,
) -> SessionConfig:
    """Validate a (partial) session object and apply it over ``base`` (defaults when None).

    What OpenAI would refuse raises ProtocolError naming the offending parameter, e.g.
    ``session.audio.output.speed``, and nothing of the update applies. What OpenAI accepts
    and hark cannot honour (an MCP server reached by ``connector_id`` or ``tunnel_id``, a
    stored prompt) is set aside with an error of its own while the rest applies: the errors
    go to ``refused``, or, when it is None (an HTTP request, whose answer holds one error),
    the first is raised.
    """
    if not isinstance(data, dict):
        raise ProtocolError(
            f"Invalid type for '{param_prefix}': expected an object.",
            param=param_prefix,
            code="invalid_type",
        )
    kind = data.get("type", "realtime" if base is None else base.type)
    if base is not None and kind != base.type and kind in ("realtime", "transcription"):
        # OpenAI's answer: a session keeps the type it was opened with.
        raise ProtocolError(
            f"Passing a {kind} session update event to a {base.type} session is not allowed.",
            param=f"{param_prefix}.type",
            code="invalid_parameter",
        )
    if kind == "transcription":
        # Checked against the transcription shape first, so that a realtime-only field
        # (instructions, tools, audio.output…) is named as an unknown parameter.
        try:
            msgspec.convert(data, TranscriptionSessionConfig)
        except msgspec.ValidationError as exc:
            raise from_validation_error(exc, param_prefix) from None
        base = base or transcription_defaults()
    base = base if base is not None else SessionConfig()
    errors: list[ProtocolError] = []
    if data.get("prompt") is not None:
        data = with_prompt(data, msgspec.to_builtins(base.tools), param_prefix, errors)
    merged = _merge(msgspec.to_builtins(base), data, ())
    try:
        config = msgspec.convert(merged, SessionConfig)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc, param_prefix) from None
    if len(config.output_modalities) != 1:
        raise ProtocolError(
            "output_modalities must be exactly one of ['audio'] or ['text'].",
            param=f"{param_prefix}.output_modalities",
        )
    check_voice(config.audio.output.voice, f"{param_prefix}.audio.output.voice")
    names = [tool.name for tool in config.tools if isinstance(tool, FunctionToolDef)]
    if len(set(names)) != len(names):
        raise ProtocolError("Tool names must be unique.", param=f"{param_prefix}.tools")
    _check_mcp_tools(config.tools, f"{param_prefix}.tools")
    if isinstance(config.tool_choice, ToolChoiceFunction) and config.tool_choice.name not in names:
        raise ProtocolError(
            f"tool_choice names the function '{config.tool_choice.name}', which is not in tools.",
            param=f"{param_prefix}.tool_choice.name",
        )
    labels = {tool.server_label for tool in config.tools if isinstance(tool, McpToolDef)}
    if isinstance(config.tool_choice, ToolChoiceMcp) and config.tool_choice.server_label not in (
        labels
    ):
        raise ProtocolError(
            f"tool_choice names the MCP server '{config.tool_choice.server_label}', which is "
            "not in tools.",
            param=f"{param_prefix}.tool_choice.server_label",
        )
    config = _set_aside(config, param_prefix, errors)
    if errors and refused is None:
        raise errors[0]
    if refused is not None:
        refused.extend(errors)
    return config


def with_prompt(
    data: dict[str, Any], tools: list[Any], param: str, errors: list[ProtocolError]
) -> dict[str, Any]:
    """``data`` (a session update, or ``response.create``'s response) with the fields of
    the stored prompt it names, as OpenAI applies a prompt: fields ``data`` sets itself win
    (non-empty ``instructions``, ``audio.output.voice``, a tool of the same name); the
    prompt's tools come first, before ``data``'s or, when it has none, ``tools``. A prompt
    that cannot be resolved is left out, its error added to ``errors``."""
    try:
        reference = msgspec.convert(data["prompt"], PromptReference)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc, f"{param}.prompt") from None
    store = prompts.current()
    try:
        if store is None:
            raise ProtocolError(
                "Stored prompts are not available: this server has no prompt store (start "
                "it with --prompts DIR).",
                param=f"{param}.prompt",
                code="unsupported_parameter",
            )
        resolved = store.resolve(reference, f"{param}.prompt")
    except ProtocolError as exc:
        errors.append(exc)
        return {name: value for name, value in data.items() if name != "prompt"}
    data = dict(data)
    if resolved.instructions is not None and not data.get("instructions"):
        # The agents SDKs send an agent's missing instructions as "" beside its prompt.
        data["instructions"] = resolved.instructions
    own = data.get("tools", tools)
    # Malformed tools are left for validation to name.
    if resolved.tools and isinstance(own, list):
        named = {_tool_key(t) for t in own}
        data["tools"] = [t for t in resolved.tools if _tool_key(t) not in named] + own
    if resolved.voice is not None:
        # A malformed audio or output object is left for validation to name.
        audio = data.get("audio", {})
        output = audio.get("output", {}) if isinstance(audio, dict) else None
        if isinstance(output, dict) and output.get("voice") is None:
            data["audio"] = {**audio, "output": {**output, "voice": resolved.voice}}
    return data


def _tool_key(tool: object) -> object:
    """What makes two tools the same tool: a function's name, an MCP server's label."""
    if not isinstance(tool, dict):
        return id(tool)
    return (
        tool.get("type"),
        tool.get("server_label") if tool.get("type") == "mcp" else tool.get("name"),
    )


def check_prompt_store(store: PromptStore) -> None:
    """Check every stored prompt's tools and voice as a session would take them; raises
    ``PromptStoreError`` naming the file (at start-up, not when a client names it)."""
    for prompt in store:
        fields: dict[str, Any] = {}
        if prompt.tools is not None:
            fields["tools"] = prompt.tools
        if prompt.voice is not None:
            fields["audio"] = {"output": {"voice": prompt.voice}}
        try:
            parse_session_config(fields, param_prefix="prompt")
        except ProtocolError as exc:
            raise PromptStoreError(f"{prompt.path}: {exc.message}") from None


def _set_aside(config: SessionConfig, param: str, errors: list[ProtocolError]) -> SessionConfig:
    """``config`` without what hark cannot honour, an error in ``errors`` for each part."""
    tools: list[ToolDef] = []
    for index, tool in enumerate(config.tools):
        unreachable = next(
            (n for n in ("connector_id", "tunnel_id") if getattr(tool, n, None) is not None), None
        )
        if not isinstance(tool, McpToolDef) or unreachable is None:
            tools.append(tool)
            continue
        errors.append(
            ProtocolError(
                f"'{unreachable}' is not supported: hark has no connectors or tunnels, so the "
                f"MCP server '{tool.server_label}' was left out and the rest of the update "
                "applied; give the server's 'server_url' to use it.",
                param=f"{param}.tools[{index}].{unreachable}",
                code="unsupported_parameter",
            )
        )
    if len(tools) == len(config.tools):
        return config
    choice = config.tool_choice
    if isinstance(choice, ToolChoiceMcp) and not any(
        isinstance(t, McpToolDef) and t.server_label == choice.server_label for t in tools
    ):
        errors.append(
            ProtocolError(
                f"tool_choice names the MCP server '{choice.server_label}', which was left "
                "out; tool_choice is 'auto'.",
                param=f"{param}.tool_choice.server_label",
                code="unsupported_parameter",
            )
        )
        choice = "auto"
    return msgspec.structs.replace(config, tools=tools, tool_choice=choice)


def _check_mcp_tools(tools: list[ToolDef], param: str) -> None:
    """What the type alone cannot say: one server per label, and one reached by URL has an
    http(s) URL. A server named by ``connector_id`` or ``tunnel_id`` is set aside later."""
    labels: set[str] = set()
    for index, tool in enumerate(tools):
        if not isinstance(tool, McpToolDef):
            continue
        where = f"{param}[{index}]"
        if tool.server_label in labels:
            raise ProtocolError(
                f"MCP server labels must be unique: '{tool.server_label}' is used twice.",
                param=f"{where}.server_label",
            )
        labels.add(tool.server_label)
        if tool.connector_id is not None or tool.tunnel_id is not None:
            continue
        if not tool.server_url:
            raise ProtocolError(
                "An MCP tool needs one of 'server_url', 'connector_id' or 'tunnel_id'.",
                param=f"{where}.server_url",
                code="missing_required_parameter",
            )
        if not tool.server_url.startswith(("http://", "https://")):
            raise ProtocolError(
                "'server_url' must be an http:// or https:// URL.",
                param=f"{where}.server_url",
                code="invalid_value",
            )


def session_config_to_dict(
    config: SessionConfig, *, session_id: str | None, expires_at: int | None
) -> dict[str, Any]:
    """The session object as sent in ``session.created`` / ``session.updated``: the GA
    realtime shape, or for a transcription session the transcription shape (type, input
    audio and include only)."""
    body: dict[str, Any] = msgspec.to_builtins(config)
    turn_detection = body["audio"]["input"]["turn_detection"]
    if turn_detection is not None and turn_detection["hark_backchannels"] is None:
        # hark's own field appears only when a client set it: the GA shape otherwise.
        del turn_detection["hark_backchannels"]
    for tool in body["tools"]:
        if tool["type"] == "mcp":
            # The client's credentials for the server go to the server only.
            tool["authorization"] = None
            tool["headers"] = None
    if config.type == "transcription":
        body = {
            "type": "transcription",
            "audio": {"input": body["audio"]["input"]},
            "include": body["include"],
        }
    head: dict[str, Any] = {
        "object": "realtime.session"
        if config.type == "realtime"
        else "realtime.transcription_session"
    }
    if session_id is not None:
        head["id"] = session_id
    if expires_at is not None:
        head["expires_at"] = expires_at
    return {**head, **body}


def sample_rate(fmt: AudioFormat) -> int:
    """The sample rate of a wire format."""
    return 24000 if isinstance(fmt, PcmFormat) else 8000

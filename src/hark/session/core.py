"""The Realtime session as a sans-I/O state machine.

Inputs are client events (``receive``), input audio (``append_audio``) and engine and
playout results (``on_*``), each handed in with the wall time ``now`` (UNIX seconds), plus
``handle_timer(now)`` when ``next_deadline()`` has come; outputs are server events and actions
for the driver, collected with ``drain``. Turn-taking runs on the audio sample clock and the
session limit and rate windows on the wall time handed in, so a test can replay a conversation
and get the same events every time. Nothing here touches a socket, a thread or the system clock.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from hark.audio.formats import decode_audio, encode_audio, format_rate
from hark.audio.resample import resample
from hark.engines.llm import Finished, FunctionTool, GenerationRequest, ToolChoice
from hark.protocol import client_events as ce
from hark.protocol import items as wire
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError, from_validation_error
from hark.protocol.response_params import ResponseParams, parse_response_params
from hark.protocol.session_config import (
    AudioFormat,
    FunctionToolDef,
    SessionConfig,
    ToolChoiceConfig,
    ToolChoiceFunction,
    VoiceId,
    parse_session_config,
    session_config_to_dict,
)
from hark.session.actions import (
    Action,
    AdoptSpeculation,
    AnalyzeSpeech,
    CancelGeneration,
    ClearAudio,
    Close,
    DiscardSpeculation,
    FinishAudio,
    Generate,
    PlayAudio,
    Prefill,
    ScoreTurn,
    Speculate,
    Transcribe,
)
from hark.session.conversation import (
    AudioSegment,
    Conversation,
    Entry,
    Part,
    chat_messages,
    truncate_part,
)
from hark.session.ids import IdGenerator
from hark.session.input_buffer import InputAudioBuffer
from hark.session.turn_detection import TurnDetector, TurnEvent
from hark.session.turn_policy import turn_policy

MiB = 1024 * 1024
# The one definition of the append limit ("15 MiB per event"): the base64 text of an
# append's audio. The WebSocket transport's frame limit derives from it; the README states it.
MAX_APPEND_BYTES = 15 * MiB
# The most audio an append can carry: its base64 is at most MAX_APPEND_BYTES long.
_MAX_APPEND_AUDIO = MAX_APPEND_BYTES // 4 * 3
MIN_COMMIT_MS = 100
SESSION_LIMIT_S = 60 * 60
# How much conversation audio a session keeps as PCM, newest first, input and replies together.
# Kept whole, an hour of 24 kHz audio is 170 MB, the memory of a machine across hundreds of
# sessions. Five minutes (14 MB at 24 kHz, 5 MB for G.711) still covers what clients come back
# for, truncating the reply being played and retrieving recent turns; a client that wants a
# recording has had every byte of it already.
AUDIO_RETENTION_S = 5 * 60
# semantic_vad's end-of-turn verdict waits at most this long (wall time) for the reply
# speculated on the same words to have read its prompt (about 85 ms on two cores for a short
# question): the reply, not the verdict, is what the user waits for, and the verdict still
# comes well before its audio.
SCORE_AFTER_READ_MAX_S = 0.2
# The end-of-turn probability assumed when scoring fails: wait as for an utterance that may
# well be over.
UNKNOWN_TURN_SCORE = 0.5

Output = se.ServerEvent | Action


@dataclass(slots=True)
class _Pause:
    """A pause in the current turn, and the speculative work started during it."""

    key: str
    start_ms: float
    asr_request: str | None = None
    transcript: str | None = None
    # The speculative reply started on ``transcript``, and whether it has read its prompt.
    speculation: Generate | None = None
    answering: bool = False
    # The end-of-turn verdict held back until the speculative reply answers or ``score_due``.
    score: ScoreTurn | None = None
    score_due: float | None = None


@dataclass(frozen=True, slots=True)
class _Playout:
    """A response whose audio the transport plays: the item it belongs to (the latest, for a
    response with several), and whether it is the conversation's."""

    item_id: str
    in_band: bool


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Per-session limits over a sliding minute, reported in ``rate_limits.updated``."""

    requests_per_minute: int = 600
    tokens_per_minute: int = 200_000


@dataclass(slots=True)
class _Response:
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
    tool_choice: ToolChoiceConfig
    temperature: float | None
    inputs: list[Entry] | None
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"] = "in_progress"
    status_details: dict[str, Any] | None = None
    output: list[Entry] = field(default_factory=list)
    message: Entry | None = None
    calls: dict[str, Entry] = field(default_factory=dict)
    generating: bool = False
    usage: se.Usage | None = None

    @property
    def audio(self) -> bool:
        return self.modalities == ["audio"]

    def to_wire(self) -> se.Response:
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


class Session:
    """One Realtime session's state: config, input buffer, turn-taking, conversation, responses."""

    def __init__(
        self,
        *,
        model: str,
        config: SessionConfig | None = None,
        session_id: str | None = None,
        ids: IdGenerator | None = None,
        created_at: float = 0.0,
        max_duration_s: float = SESSION_LIMIT_S,
        rate_limits: RateLimits | None = None,
        plays_audio: bool = False,
        audio_retention_s: float = AUDIO_RETENTION_S,
        vad_chunk_ms: int,
        asr_rate: int,
    ) -> None:
        """``plays_audio``: the transport plays reply audio itself (WebRTC, SIP), so audio
        leaves as PlayAudio actions instead of ``response.output_audio.delta`` events.
        ``audio_retention_s``: how many seconds of the latest conversation audio items keep;
        older items keep only their words. ``vad_chunk_ms``: the audio in each of the VAD's
        chunks (``VadEngine.chunk_ms``); ``asr_rate``: the sample rate recognition takes
        (``AsrEngine.sample_rate``)."""
        self._vad_chunk_ms_asked = vad_chunk_ms
        self._asr_rate = asr_rate
        self.ids = ids or IdGenerator()
        self.id = session_id or self.ids.new("sess")
        base = config or SessionConfig()
        self.config = msgspec.structs.replace(base, model=model)
        self.created_at = created_at
        self.expires_at = int(created_at + max_duration_s)
        self._max_duration_s = max_duration_s
        self.conversation = Conversation()
        self._limits = rate_limits or RateLimits()
        self._outbox: list[Output] = []
        self._closed = False
        self._clock_ms = 0.0
        self._audio_produced = False
        self._responses: dict[str, _Response] = {}
        self._in_band: _Response | None = None
        self._usage_window: deque[tuple[float, int]] = deque()
        self._now = created_at
        self._idle_deadline_ms: float | None = None
        self._speech_item_id: str | None = None
        self._speech_start_ms = 0.0
        self.plays_audio = plays_audio
        self._audio_retention_ms = int(audio_retention_s * 1000)
        # Responses whose audio the transport is playing, in-band or not.
        self._playing: dict[str, _Playout] = {}
        # Recognition in flight: request id → the item it is for, or the pause it speculates on.
        self._asr_requests: dict[str, str | _Pause] = {}
        self._pause: _Pause | None = None
        # The pause whose speculative reply the driver is running (it outlives the pause
        # until the turn's response adopts or discards it).
        self._speculated: _Pause | None = None
        self._pauses = 0
        self._vad_now_ms = 0.0
        # How long the pause that ended the last turn lasted (the end-of-turn wait).
        self.last_pause_ms = 0.0
        # The type of the last client event received ("unknown" when it did not decode).
        self.last_event_type = "unknown"
        self._setup_input()

    # ----------------------------------------------------------------- plumbing

    def drain(self) -> list[Output]:
        """Everything produced since the last call: server events and actions, in order."""
        out, self._outbox = self._outbox, []
        return out

    def _emit(self, event: se.ServerEvent) -> None:
        event.event_id = self.ids.new("event")
        self._outbox.append(event)

    def _error(self, error: ProtocolError, event_id: str | None) -> None:
        self._emit(
            se.Error(
                error=se.ErrorDetail(
                    type=error.type,
                    code=error.code,
                    message=error.message,
                    param=error.param,
                    event_id=event_id,
                )
            )
        )

    def report_internal_error(self) -> None:
        """Tell the client that the server failed on its last event (the session goes on)."""
        self._error(
            ProtocolError(
                "The server had an error while processing the event.",
                code="server_error",
                type="server_error",
            ),
            None,
        )

    @property
    def clock_ms(self) -> float:
        """The session clock: milliseconds of input audio received."""
        return self._clock_ms

    def start(self) -> None:
        """Emit ``session.created``."""
        self._emit(se.SessionCreated(session=self._session_dict()))
        self._prefill()

    def _prefill(self) -> None:
        """Let the LLM read the conversation as the next turn's prompt will begin."""
        if self.config.type != "realtime" or self._in_band is not None:
            return
        response = self._new_response(ResponseParams(), response_id="")
        self._outbox.append(
            Prefill(self._generate_action(response, self.conversation.entries()).request)
        )

    def _session_dict(self) -> dict[str, Any]:
        return session_config_to_dict(self.config, session_id=self.id, expires_at=self.expires_at)

    def _at(self, now: float) -> bool:
        """Take the wall time handed in with an input; False once the session is over."""
        self._now = now
        if not self._closed and now >= self.expires_at:
            self.end(
                ProtocolError(
                    f"Your session hit the maximum duration of {_duration(self._max_duration_s)}.",
                    code="session_expired",
                ),
                "session_expired",
                now=now,
            )
        return not self._closed

    def handle_timer(self, now: float) -> None:
        """The driver's timer fired at wall time ``now`` (UNIX seconds): act on every deadline
        that has passed (see ``next_deadline``)."""
        if not self._at(now):
            return
        pause = self._pause
        if pause is not None and pause.score_due is not None and now >= pause.score_due:
            self._release_score(pause)

    def next_deadline(self) -> float | None:
        """The wall time (UNIX seconds) at which ``handle_timer`` must be called next, if no
        other input comes first; None when nothing waits on the clock."""
        if self._closed:
            return None
        pause = self._pause
        if pause is not None and pause.score_due is not None:
            return min(self.expires_at, pause.score_due)
        return self.expires_at

    def end(self, error: ProtocolError, reason: str, *, now: float) -> None:
        """End the session for ``reason``: running responses are cancelled, the client gets
        ``error`` as an ``error`` event, and the transport is asked to close. Idempotent."""
        self._now = now
        if self._closed:
            return
        self._closed = True
        for response in list(self._responses.values()):
            self._end_response(response, "cancelled", {"type": "cancelled", "reason": None})
        self._error(error, None)
        self._outbox.append(Close(reason))

    # ----------------------------------------------------------------- client events

    def receive(self, data: str | bytes, *, now: float) -> None:
        """Handle one client event (a WebSocket text frame). Never raises for bad input."""
        if not self._at(now):
            return
        try:
            event = ce.decode_client_event(data)
        except ce.DecodeError as exc:
            self.last_event_type = "unknown"
            self._error(exc, exc.event_id)
            return
        self.last_event_type = ce.EVENT_TYPE[type(event)]
        try:
            self._dispatch(event)
        except ProtocolError as exc:
            self._error(exc, event.event_id)

    def receive_binary(self, data: bytes, *, now: float) -> None:
        """Binary frames are not part of the protocol: answer with an error."""
        if not self._at(now):
            return
        self._error(
            ProtocolError(
                "Binary frames are not supported: send events as JSON text, "
                "audio base64-encoded in input_audio_buffer.append.",
                code="invalid_event",
            ),
            None,
        )

    def _dispatch(self, event: ce.AnyClientEvent) -> None:
        if isinstance(event, ce.InputAudioBufferAppend):
            self._append(event.audio)
        elif isinstance(event, ce.SessionUpdate):
            self._update_session(event.session)
        elif isinstance(event, ce.InputAudioBufferCommit):
            self._commit_buffer()
        elif isinstance(event, ce.InputAudioBufferClear):
            self._buffer.clear()
            self._reset_turn()
            self._emit(se.InputAudioBufferCleared())
        elif isinstance(event, ce.ConversationItemCreate):
            self._create_item(event.item, event.previous_item_id)
        elif isinstance(event, ce.ConversationItemRetrieve):
            entry = self.conversation.get(event.item_id)
            self._emit(se.ConversationItemRetrieved(item=entry.to_wire(include_audio=True)))
        elif isinstance(event, ce.ConversationItemTruncate):
            self._truncate(event.item_id, event.content_index, event.audio_end_ms)
        elif isinstance(event, ce.ConversationItemDelete):
            self._delete(event.item_id)
        elif isinstance(event, ce.ResponseCreate):
            self._create_response(parse_response_params(event.response))
        elif isinstance(event, ce.ResponseCancel):
            self._cancel_request(event.response_id)
        elif isinstance(event, ce.OutputAudioBufferClear):
            if not self.plays_audio:
                raise ProtocolError(
                    "output_audio_buffer.clear is only supported on WebRTC and SIP sessions; "
                    "over WebSocket the client owns playback.",
                    code="invalid_event",
                )
            self._clear_playout(requested=True)

    # ----------------------------------------------------------------- session.update

    def _update_session(self, update: dict[str, Any]) -> None:
        if "model" in update and update["model"] != self.config.model:
            raise ProtocolError(
                "The session's model cannot be changed.", "session.model", "invalid_value"
            )
        config = parse_session_config(update, base=self.config)
        old = self.config
        if self._audio_produced and _voice_name(config.audio.output.voice) != _voice_name(
            old.audio.output.voice
        ):
            raise ProtocolError(
                "Cannot update a conversation's voice if assistant audio is present.",
                "session.audio.output.voice",
                "cannot_update_voice",
            )
        self.config = config
        if (
            config.audio.input.format != old.audio.input.format
            or config.audio.input.turn_detection != old.audio.input.turn_detection
        ):
            self._setup_input()
        self._emit(se.SessionUpdated(session=self._session_dict()))
        self._prefill()

    # ----------------------------------------------------------------- input audio

    def _setup_input(self) -> None:
        """(Re)build the input path for the current format and turn detection."""
        fmt = self.config.audio.input.format
        self._in_format = fmt
        self._in_rate = format_rate(fmt)
        self._buffer = InputAudioBuffer(self._in_rate, self._clock_ms)
        # The VAD hears its chunks at the input rate (it resamples them itself, for all
        # sessions at once); the clock counts whole samples, so a chunk lasts what its
        # samples do.
        self._vad_chunk = max(1, round(self._in_rate * self._vad_chunk_ms_asked / 1000))
        self._vad_chunk_ms = self._vad_chunk * 1000 / self._in_rate
        # The chunk being filled, and how many of its samples are in.
        self._vad_pending: npt.NDArray[np.int16] = np.empty(self._vad_chunk, np.int16)
        self._vad_filled = 0
        self._vad_epoch = getattr(self, "_vad_epoch", -1) + 1
        self._vad_base_ms = self._clock_ms
        self._vad_done = 0
        self._policy = turn_policy(self.config.audio.input.turn_detection)
        self._turns = TurnDetector(self._policy) if self._policy is not None else None
        self._speech_item_id = None
        self._drop_pause()

    def _reset_turn(self) -> None:
        if self._turns is not None:
            self._turns.reset()
        self._speech_item_id = None
        self._drop_pause()

    def _append(self, data: bytes) -> None:
        """An append's audio, already decoded from base64 with the event."""
        if len(data) > _MAX_APPEND_AUDIO:
            encoded = (len(data) + 2) // 3 * 4
            raise ProtocolError(
                f"Audio append of {encoded} bytes exceeds the {MAX_APPEND_BYTES // MiB} MiB "
                "limit per event.",
                "audio",
                "invalid_value",
            )
        self._take_audio(decode_audio(self._in_format, data))

    @property
    def input_rate(self) -> int:
        """Sample rate of the input format: what ``append_audio`` expects."""
        return self._in_rate

    def append_audio(self, pcm: npt.NDArray[np.int16], *, now: float) -> None:
        """Input audio that arrived as PCM at ``input_rate`` (a media track, not an event)."""
        if self._at(now):
            self._take_audio(pcm)

    def _take_audio(self, pcm: npt.NDArray[np.int16]) -> None:
        self._buffer.append(pcm)
        self._clock_ms += len(pcm) * 1000 / self._in_rate
        if self._turns is not None:
            self._feed_vad(pcm)

    def _feed_vad(self, pcm: npt.NDArray[np.int16]) -> None:
        # Copied into the chunk being filled: an append rarely ends on a chunk boundary (20 ms
        # appends, 32 ms chunks), and a copy of the few samples costs less than joining arrays.
        filled = self._vad_filled
        end = filled + len(pcm)
        size = self._vad_chunk
        if end < size:
            self._vad_pending[filled:end] = pcm
            self._vad_filled = end
            return
        taken = 0
        while taken < len(pcm):
            count = min(size - filled, len(pcm) - taken)
            self._vad_pending[filled : filled + count] = pcm[taken : taken + count]
            filled += count
            taken += count
            if filled == size:
                self._outbox.append(AnalyzeSpeech(self._vad_pending, self._vad_epoch))
                self._vad_pending = np.empty(size, np.int16)
                filled = 0
        self._vad_filled = filled

    def on_vad(self, probability: float, epoch: int, *, now: float) -> None:
        """The VAD's answer for the oldest chunk not yet answered (of this epoch)."""
        if not self._at(now):
            return
        if epoch != self._vad_epoch or self._turns is None or self._closed:
            return
        start = self._vad_base_ms + self._vad_done * self._vad_chunk_ms
        end = start + self._vad_chunk_ms
        self._vad_done += 1
        self._vad_now_ms = end
        decision = self._turns.feed(start, end, probability)
        if decision is not None:
            self._on_turn_event(decision)
        pause = self._pause
        if (
            pause is not None
            and pause.asr_request is None
            and self._policy is not None
            and end - pause.start_ms >= min(self._policy.speculate_after_ms, self._turns.silence_ms)
        ):
            self._transcribe_pause(pause)
        if not self._turns.speaking:
            self._buffer.trim_before(end - self._turns.prefix_padding_ms - 100)
            if self._idle_deadline_ms is not None and end >= self._idle_deadline_ms:
                self._idle_timeout(end)

    def _on_turn_event(self, event: TurnEvent) -> None:
        if event.kind == "speech_started":
            self._speech_started(event.ms)
        elif event.kind == "pause_started":
            self._pauses += 1
            self._pause = _Pause(key=f"{self._speech_item_id}#{self._pauses}", start_ms=event.ms)
        elif event.kind == "pause_ended":
            self._drop_pause()
        else:
            self._speech_stopped(event.ms)

    # ----------------------------------------------------------------- speculation

    def _drop_pause(self) -> None:
        """The user went on (or the turn was reset): speculative work is thrown away."""
        pause, self._pause = getattr(self, "_pause", None), None
        if pause is None:
            return
        if pause.asr_request is not None:
            self._asr_requests.pop(pause.asr_request, None)
        if self._speculated is pause:
            self._discard_speculation()

    def _discard_speculation(self) -> None:
        speculated, self._speculated = self._speculated, None
        if speculated is not None:
            self._outbox.append(DiscardSpeculation(speculated.key))

    def _transcribe_pause(self, pause: _Pause) -> None:
        """Recognise the turn so far while the pause is waited out."""
        pause.asr_request = f"{pause.key}:asr"
        self._asr_requests[pause.asr_request] = pause
        pcm = self._buffer.peek(self._speech_start_ms, pause.start_ms)
        self._outbox.append(self._transcribe_action(pause.asr_request, pcm, self._in_rate))

    def _pause_transcribed(self, pause: _Pause, transcript: str) -> None:
        pause.transcript = transcript
        self._speculate_reply(pause)
        if self._policy is not None and self._policy.scores_turns:
            score = ScoreTurn(pause.key, transcript, self._last_assistant_text())
            if pause.speculation is not None and not pause.answering:
                # The reply speculated on the same words reads its prompt first, on every core
                # if no other model computes (hark.engines.activity).
                pause.score = score
                pause.score_due = self._now + SCORE_AFTER_READ_MAX_S
            else:
                self._outbox.append(score)

    def _release_score(self, pause: _Pause) -> None:
        if pause.score is not None:
            self._outbox.append(pause.score)
            pause.score = pause.score_due = None

    def on_speculation_answering(self, key: str, *, now: float) -> None:
        """The speculative reply ``key`` has read its prompt (its first output) or ended."""
        if not self._at(now):
            return
        pause = self._pause
        if pause is not None and pause.key == key:
            pause.answering = True
            self._release_score(pause)

    def on_turn_score_failed(self, key: str, *, now: float) -> None:
        """The end-of-turn model failed on the pause ``key``."""
        self.on_turn_score(key, UNKNOWN_TURN_SCORE, now=now)

    def on_turn_score(self, key: str, probability: float, *, now: float) -> None:
        """How complete the utterance of the pause ``key`` sounds (semantic_vad)."""
        if not self._at(now):
            return
        policy = self._policy
        pause = self._pause
        if pause is None or pause.key != key or self._turns is None or policy is None:
            return
        if not policy.scores_turns:
            return
        self._turns.silence_ms = policy.silence_after(probability)
        decision = self._turns.check(self._vad_now_ms)
        if decision is not None:
            self._on_turn_event(decision)

    def _speculate_reply(self, pause: _Pause) -> None:
        """Start the reply the turn would get if it ended now; it stays unseen until it does."""
        policy = self._policy
        if (
            policy is None
            or not policy.create_response
            or self.config.type != "realtime"
            or self._in_band is not None
            or pause.transcript is None
            or self._speech_item_id is None
        ):
            return
        turn = Entry(
            id=self._speech_item_id,
            type="message",
            role="user",
            parts=[Part("input_audio", heard=pause.transcript)],
        )
        response = self._new_response(ResponseParams(), response_id="")
        entries = [*self.conversation.entries(), turn]
        self._discard_speculation()
        pause.speculation = self._generate_action(response, entries)
        self._outbox.append(Speculate(pause.key, pause.speculation))
        self._speculated = pause

    def _last_assistant_text(self) -> str | None:
        for entry in reversed(self.conversation.entries()):
            if entry.type == "message" and entry.role == "assistant":
                return " ".join(p.transcript or p.text or "" for p in entry.parts).strip() or None
        return None

    def _speech_started(self, ms: float) -> None:
        policy = self._policy
        assert policy is not None
        self._speech_item_id = self.ids.new("item")
        self._speech_start_ms = max(ms, self._buffer.start_ms)
        self._idle_deadline_ms = None
        self._emit(
            se.SpeechStarted(
                audio_start_ms=int(self._speech_start_ms), item_id=self._speech_item_id
            )
        )
        if policy.interrupt_response:
            if self._in_band is not None:
                self._end_response(
                    self._in_band, "cancelled", {"type": "cancelled", "reason": "turn_detected"}
                )
            self._clear_playout()

    def _speech_stopped(self, ms: float) -> None:
        policy = self._policy
        assert policy is not None and self._speech_item_id is not None
        item_id, self._speech_item_id = self._speech_item_id, None
        pause, self._pause = self._pause, None
        self.last_pause_ms = ms - pause.start_ms if pause is not None else 0.0
        self._emit(se.SpeechStopped(audio_end_ms=int(ms), item_id=item_id))
        pcm = self._buffer.take(self._speech_start_ms, ms)
        self._commit_audio(pcm, item_id, pause)
        if policy.create_response and self.config.type == "realtime" and self._in_band is None:
            self._create_response(ResponseParams())
        if self._in_band is None:
            # No response for this turn (or it failed at once): nobody adopts the speculation.
            self._discard_speculation()

    def _idle_timeout(self, now_ms: float) -> None:
        self._idle_deadline_ms = None
        item_id = self.ids.new("item")
        start = self._buffer.start_ms
        self._emit(
            se.InputAudioBufferTimeoutTriggered(
                audio_start_ms=int(start), audio_end_ms=int(now_ms), item_id=item_id
            )
        )
        pcm = self._buffer.take(start, now_ms)
        if len(pcm):
            self._commit_audio(pcm, item_id)
        if self._in_band is None:
            self._create_response(ResponseParams())

    def _commit_buffer(self) -> None:
        if self._buffer.duration_ms < MIN_COMMIT_MS:
            raise ProtocolError(
                "Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{self._buffer.duration_ms:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        item_id = self._speech_item_id or self.ids.new("item")
        self._reset_turn()
        self._commit_audio(self._buffer.take_all(), item_id)

    def _commit_audio(
        self, pcm: npt.NDArray[np.int16], item_id: str, pause: _Pause | None = None
    ) -> None:
        part = Part(
            "input_audio",
            audio=pcm,
            audio_format=self.config.audio.input.format,
            rate=self._in_rate,
        )
        entry = Entry(id=item_id, type="message", role="user", parts=[part])
        previous = self.conversation.insert(entry)
        self._emit(se.InputAudioBufferCommitted(previous_item_id=previous, item_id=item_id))
        self._emit(se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire()))
        self._emit(se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire()))
        if pause is not None and pause.transcript is not None:
            # Recognised while the end of the turn was waited out: the words are known already.
            self._transcribed(entry, part, pause.transcript, len(pcm) / self._in_rate, True)
        elif pause is not None and pause.asr_request in self._asr_requests:
            # Recognition of the turn is under way: its result is this item's transcript.
            self._asr_requests[pause.asr_request] = item_id
        else:
            self._recognise(entry, part)
        self._limit_audio()

    def _limit_audio(self) -> None:
        """Hold conversation audio to the retention budget; replies still being generated or
        played keep theirs, whatever their length."""
        keep = {e.id for r in self._responses.values() for e in r.output}
        keep.update(p.item_id for p in self._playing.values())
        self.conversation.limit_audio(self._audio_retention_ms, keep)

    def _transcribe_action(
        self, request_id: str, pcm: npt.NDArray[np.int16], rate: int
    ) -> Transcribe:
        transcription = self.config.audio.input.transcription
        return Transcribe(
            request_id=request_id,
            audio=resample(pcm, rate, self._asr_rate).astype(np.float32) / 32768.0,
            language=transcription.language if transcription else None,
            prompt=transcription.prompt if transcription else None,
        )

    def _recognise(self, entry: Entry, part: Part) -> None:
        assert part.audio is not None
        self._asr_requests[entry.id] = entry.id
        self._outbox.append(self._transcribe_action(entry.id, part.audio, part.rate))

    # ----------------------------------------------------------------- transcription results

    def _pending_part(self, item_id: str) -> tuple[Entry, Part] | None:
        if item_id not in self.conversation:
            return None
        entry = self.conversation.get(item_id)
        part = next((p for p in entry.parts if p.type == "input_audio" and p.heard is None), None)
        return None if part is None else (entry, part)

    def on_transcription_delta(self, request_id: str, delta: str, *, now: float) -> None:
        """A piece of a transcript."""
        if not self._at(now):
            return
        item_id = self._asr_requests.get(request_id)
        if (
            isinstance(item_id, str)
            and self._pending_part(item_id) is not None
            and self.config.audio.input.transcription is not None
        ):
            self._emit(se.InputTranscriptionDelta(item_id=item_id, content_index=0, delta=delta))

    def on_transcription_done(
        self, request_id: str, transcript: str, audio_seconds: float, *, now: float
    ) -> None:
        """A whole transcript."""
        if not self._at(now):
            return
        target = self._asr_requests.pop(request_id, None)
        if isinstance(target, _Pause):
            if target is self._pause:
                self._pause_transcribed(target, transcript)
            return
        pending = self._pending_part(target) if target is not None else None
        if pending is not None:
            self._transcribed(*pending, transcript, audio_seconds, request_id != target)

    def _transcribed(
        self, entry: Entry, part: Part, transcript: str, seconds: float, send_delta: bool
    ) -> None:
        part.heard = transcript
        if self.config.audio.input.transcription is not None:
            part.transcript = transcript
            if send_delta:
                # Speculative recognition sent no deltas for this item: send the words once.
                self._emit(
                    se.InputTranscriptionDelta(item_id=entry.id, content_index=0, delta=transcript)
                )
            self._emit(
                se.InputTranscriptionCompleted(
                    item_id=entry.id,
                    content_index=0,
                    transcript=transcript,
                    usage={"type": "duration", "seconds": round(seconds, 3)},
                )
            )
        self._resume_waiting()

    def on_transcription_failed(self, request_id: str, message: str, *, now: float) -> None:
        """Recognition failed: the LLM will see no words for that audio."""
        if not self._at(now):
            return
        target = self._asr_requests.pop(request_id, None)
        if isinstance(target, _Pause) or target is None:
            return
        pending = self._pending_part(target)
        if pending is None:
            return
        entry, part = pending
        item_id = entry.id
        part.heard = ""
        if self.config.audio.input.transcription is not None:
            self._emit(
                se.InputTranscriptionFailed(
                    item_id=item_id,
                    content_index=0,
                    error={
                        "type": "server_error",
                        "code": "transcription_failed",
                        "message": message,
                        "param": None,
                    },
                )
            )
        self._resume_waiting()

    # ----------------------------------------------------------------- conversation items

    def _create_item(self, raw: dict[str, Any], previous_item_id: str | None) -> None:
        try:
            item = msgspec.convert(raw, wire.Item)
        except msgspec.ValidationError as exc:
            raise from_validation_error(exc, "item") from None
        entry, recognise = self._entry_from_wire(item, "item")
        if entry.id in self.conversation:
            raise ProtocolError(
                f"Item with id {entry.id[:100]} already exists.", "item.id", "duplicate_item_id"
            )
        previous = self.conversation.insert(entry, previous_item_id)
        self._emit(se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire()))
        self._emit(se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire()))
        for part in recognise:
            self._recognise(entry, part)
        self._limit_audio()
        self._prefill()

    def _entry_from_wire(self, item: wire.Item, param: str) -> tuple[Entry, list[Part]]:
        """Build an entry from a client item; returns the audio parts that need recognition."""
        item_id = item.id or self.ids.new("item")
        if isinstance(item, wire.McpItem):
            return Entry(id=item_id, type="mcp", mcp=item), []
        if isinstance(item, wire.FunctionCallItem):
            entry = Entry(
                id=item_id,
                type="function_call",
                name=item.name,
                arguments=item.arguments,
                call_id=item.call_id or self.ids.new("call"),
            )
            return entry, []
        if isinstance(item, wire.FunctionCallOutputItem):
            entry = Entry(
                id=item_id, type="function_call_output", call_id=item.call_id, output=item.output
            )
            return entry, []
        parts: list[Part] = []
        recognise: list[Part] = []
        allowed = wire.ALLOWED_PARTS[item.role]
        for index, content in enumerate(item.content):
            where = f"{param}.content[{index}]"
            if not isinstance(content, allowed):
                raise ProtocolError(
                    f"Content type '{content.__struct_config__.tag}' is not allowed "
                    f"in a {item.role} message.",
                    f"{where}.type",
                )
            parts.append(self._part_from_wire(content, where, recognise))
        return Entry(id=item_id, type="message", role=item.role, parts=parts), recognise

    def _part_from_wire(self, content: wire.ContentPart, where: str, recognise: list[Part]) -> Part:
        if isinstance(content, wire.InputText):
            return Part("input_text", text=content.text)
        if isinstance(content, wire.OutputText):
            return Part("output_text", text=content.text)
        if isinstance(content, wire.InputImage):
            return Part("input_image", image_url=content.image_url, detail=content.detail)
        is_input = isinstance(content, wire.InputAudio)
        fmt = self.config.audio.input.format if is_input else self.config.audio.output.format
        part = Part(
            "input_audio" if is_input else "output_audio",
            transcript=content.transcript,
            audio_format=fmt,
            rate=format_rate(fmt),
        )
        if content.audio:
            try:
                data = binascii.a2b_base64(content.audio, strict_mode=True)
            except (binascii.Error, ValueError):
                raise ProtocolError(
                    "Invalid 'audio': expected base64-encoded audio.", f"{where}.audio"
                ) from None
            part.audio = decode_audio(fmt, data, f"{where}.audio")
        if is_input:
            part.heard = content.transcript
            if part.heard is None:
                if part.audio is None or not len(part.audio):
                    part.heard = ""
                else:
                    recognise.append(part)
        elif part.audio is not None:
            part.segments = [AudioSegment(0, len(part.audio), content.transcript or "")]
        return part

    def _truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        entry = self.conversation.get(item_id)
        if entry.type != "message" or entry.role != "assistant":
            raise ProtocolError(
                "Only assistant messages with audio can be truncated.", "item_id", "invalid_value"
            )
        if content_index >= len(entry.parts) or entry.parts[content_index].type != "output_audio":
            raise ProtocolError(
                f"Content index {content_index} of item {item_id} is not audio.",
                "content_index",
                "invalid_value",
            )
        part = entry.parts[content_index]
        if part.audio_dropped:
            raise ProtocolError(
                f"The audio of item {item_id} is no longer kept: a session keeps only its last "
                f"{self._audio_retention_ms / 1000:g} seconds of audio, and this item is older.",
                "item_id",
                "invalid_value",
            )
        duration = part.duration_ms()
        if part.audio is None or audio_end_ms > duration:
            raise ProtocolError(
                f"Audio content of {duration}ms is already shorter than {audio_end_ms}ms.",
                "audio_end_ms",
                "invalid_value",
            )
        owner = next((r for r in self._responses.values() if entry in r.output), None)
        if owner is not None:
            self._end_response(
                owner, "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
            )
        truncate_part(part, audio_end_ms)
        self._emit(
            se.ConversationItemTruncated(
                item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms
            )
        )
        self._prefill()

    def _delete(self, item_id: str) -> None:
        entry = self.conversation.get(item_id)
        if any(entry in r.output for r in self._responses.values()):
            raise ProtocolError(
                "Cannot delete an item while its response is in progress.",
                "item_id",
                "invalid_value",
            )
        self.conversation.delete(item_id)
        self._emit(se.ConversationItemDeleted(item_id=item_id))
        self._prefill()

    # ----------------------------------------------------------------- responses

    def _create_response(self, params: ResponseParams) -> None:
        if self.config.type == "transcription":
            raise ProtocolError(
                "Transcription sessions do not create responses.", code="invalid_event"
            )
        in_band = params.conversation == "auto"
        if in_band and self._in_band is not None:
            raise ProtocolError(
                "Conversation already has an active response in progress: "
                f"{self._in_band.id}. Wait until the response is finished before creating a "
                "new one.",
                code="conversation_already_has_active_response",
            )
        inputs = None
        if params.input is not None:
            inputs = self._response_inputs(params.input)
        response = self._new_response(params, self.ids.new("resp"), inputs)
        if isinstance(
            response.tool_choice, ToolChoiceFunction
        ) and response.tool_choice.name not in {t.name for t in response.tools}:
            raise ProtocolError(
                f"tool_choice names '{response.tool_choice.name}', which is not in tools.",
                "response.tool_choice.name",
            )
        self._responses[response.id] = response
        if in_band:
            self._in_band = response
        self._emit(se.ResponseCreated(response=response.to_wire()))
        limited = self._rate_limits()
        if limited:
            self._end_response(
                response,
                "failed",
                {
                    "type": "failed",
                    "error": {
                        "type": "rate_limit_error",
                        "code": "rate_limit_exceeded",
                        "message": "The session's rate limit was reached; try again shortly.",
                    },
                },
            )
            return
        self._start_generation(response)

    def _new_response(
        self, params: ResponseParams, response_id: str, inputs: list[Entry] | None = None
    ) -> _Response:
        """A response object for ``params`` over the session's settings (no side effects)."""
        cfg = self.config
        audio_out = params.audio.output if params.audio and params.audio.output else None
        return _Response(
            id=response_id,
            in_band=params.conversation == "auto",
            modalities=list(params.output_modalities or cfg.output_modalities),
            audio_format=(audio_out.format if audio_out and audio_out.format else None)
            or cfg.audio.output.format,
            voice=_voice_name(
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
            tools=params.tools if params.tools is not None else cfg.tools,
            tool_choice=params.tool_choice or cfg.tool_choice,
            temperature=params.temperature if params.temperature is not None else cfg.temperature,
            inputs=inputs,
        )

    def _response_inputs(self, items: list[wire.ResponseInputItem]) -> list[Entry]:
        entries: list[Entry] = []
        for index, item in enumerate(items):
            if isinstance(item, wire.ItemReference):
                entries.append(self.conversation.get(item.id, f"response.input[{index}].id"))
            else:
                entry, recognise = self._entry_from_wire(item, f"response.input[{index}]")
                for part in recognise:
                    self._recognise(entry, part)
                entries.append(entry)
        return entries

    def _rate_limits(self) -> bool:
        """Emit ``rate_limits.updated``; True when this response goes over a limit."""
        while self._usage_window and self._usage_window[0][0] <= self._now - 60:
            self._usage_window.popleft()
        self._usage_window.append((self._now, 0))
        requests = len(self._usage_window)
        tokens = sum(t for _, t in self._usage_window)
        reset = max(0.0, self._usage_window[0][0] + 60 - self._now)
        limits = self._limits
        self._emit(
            se.RateLimitsUpdated(
                rate_limits=[
                    se.RateLimit(
                        name="requests",
                        limit=limits.requests_per_minute,
                        remaining=max(0, limits.requests_per_minute - requests),
                        reset_seconds=round(reset, 3),
                    ),
                    se.RateLimit(
                        name="tokens",
                        limit=limits.tokens_per_minute,
                        remaining=max(0, limits.tokens_per_minute - tokens),
                        reset_seconds=round(reset, 3),
                    ),
                ]
            )
        )
        return requests > limits.requests_per_minute or tokens >= limits.tokens_per_minute

    def _resume_waiting(self) -> None:
        for response in list(self._responses.values()):
            if not response.generating:
                self._start_generation(response)

    def _start_generation(self, response: _Response) -> None:
        entries = response.inputs if response.inputs is not None else self.conversation.entries()
        if any(e.pending_recognition() for e in entries):
            return
        response.generating = True
        generate = self._generate_action(response, entries)
        if response.in_band and self._speculated is not None:
            speculated, self._speculated = self._speculated, None
            if dataclasses.replace(generate, response_id="") == speculated.speculation:
                # The user said what was speculated on: the held reply becomes the response.
                self._outbox.append(AdoptSpeculation(speculated.key, response.id))
                return
            self._outbox.append(DiscardSpeculation(speculated.key))
        self._outbox.append(generate)

    def _generate_action(self, response: _Response, entries: list[Entry]) -> Generate:
        """The engine work for ``response`` over ``entries``: the same for a speculative reply
        and the real one, so that one can become the other."""
        choice = response.tool_choice
        if isinstance(choice, ToolChoiceFunction):
            tool_choice = ToolChoice(mode="function", name=choice.name)
        else:
            tool_choice = ToolChoice(mode=choice)
        max_tokens = response.max_output_tokens
        request = GenerationRequest(
            messages=tuple(chat_messages(response.instructions, entries)),
            tools=tuple(
                FunctionTool(name=t.name, description=t.description, parameters=t.parameters)
                for t in response.tools
            ),
            tool_choice=tool_choice,
            max_tokens=None if max_tokens == "inf" else max_tokens,
            temperature=response.temperature,
        )
        return Generate(
            response_id=response.id,
            request=request,
            audio=response.audio,
            voice=response.voice,
            speed=response.speed,
            output_rate=format_rate(response.audio_format),
        )

    def _cancel_request(self, response_id: str | None) -> None:
        if response_id is not None:
            response = self._responses.get(response_id)
            if response is None:
                raise ProtocolError(
                    f"No response in progress with id {response_id[:100]}.",
                    "response_id",
                    "response_cancel_not_active",
                )
        else:
            response = self._in_band or next(iter(self._responses.values()), None)
            if response is None:
                raise ProtocolError(
                    "Cancellation failed: no active response found.",
                    code="response_cancel_not_active",
                )
        self._end_response(
            response, "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
        )

    def _live(self, response_id: str) -> _Response | None:
        return self._responses.get(response_id)

    def _add_output(self, response: _Response, entry: Entry) -> int:
        index = len(response.output)
        response.output.append(entry)
        self._emit(
            se.OutputItemAdded(response_id=response.id, output_index=index, item=entry.to_wire())
        )
        if response.in_band:
            previous = self.conversation.insert(entry)
            self._emit(se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire()))
        return index

    def _message(self, response: _Response) -> tuple[Entry, Part, dict[str, Any]]:
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
            entry = Entry(
                id=self.ids.new("item"),
                type="message",
                role="assistant",
                status="in_progress",
                parts=[part],
            )
            response.message = entry
            index = self._add_output(response, entry)
            self._emit(
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

    def on_text(self, response_id: str, delta: str, *, now: float) -> None:
        """LLM text for a text-only response."""
        if not self._at(now):
            return
        response = self._live(response_id)
        if response is None or response.audio or not delta:
            return
        _, part, position = self._message(response)
        part.text = (part.text or "") + delta
        self._emit(se.OutputTextDelta(delta=delta, **position))

    def on_audio(
        self, response_id: str, pcm: npt.NDArray[np.int16], transcript: str, *, now: float
    ) -> None:
        """Reply audio at the output rate; ``transcript`` is the text this audio starts to speak."""
        if not self._at(now):
            return
        response = self._live(response_id)
        if response is None or not response.audio:
            return
        _, part, position = self._message(response)
        assert part.audio is not None and part.audio_format is not None
        start = len(part.audio)
        part.extend_audio(pcm)
        if transcript or not part.segments:
            part.segments.append(AudioSegment(start, len(part.audio), transcript))
        else:
            part.segments[-1].end = len(part.audio)
        self._audio_produced = True
        if transcript:
            part.transcript = (part.transcript or "") + transcript
            self._emit(se.OutputAudioTranscriptDelta(delta=transcript, **position))
        if not len(pcm):
            return
        if self.plays_audio:
            self._playing[response.id] = _Playout(position["item_id"], response.in_band)
            self._outbox.append(PlayAudio(response.id, position["item_id"], pcm, part.rate))
        else:
            payload = base64.b64encode(encode_audio(part.audio_format, pcm)).decode()
            self._emit(se.OutputAudioDelta(delta=payload, **position))

    def _close_message(
        self, response: _Response, status: Literal["completed", "incomplete"]
    ) -> None:
        if response.message is None:
            return
        entry, part, position = self._message(response)
        response.message = None
        entry.status = status
        if part.type == "output_audio":
            part.compact_audio()
            self._limit_audio()
            self._emit(se.OutputAudioDone(**position))
            self._emit(se.OutputAudioTranscriptDone(transcript=part.transcript or "", **position))
        else:
            self._emit(se.OutputTextDone(text=part.text or "", **position))
        self._emit(se.ContentPartDone(part=_part_summary(part), **position))
        self._finish_item(response, entry, position["output_index"])

    def _finish_item(self, response: _Response, entry: Entry, index: int) -> None:
        self._emit(
            se.OutputItemDone(response_id=response.id, output_index=index, item=entry.to_wire())
        )
        if response.in_band and entry.id in self.conversation:
            entries = self.conversation.entries()
            position = entries.index(entry)
            previous = entries[position - 1].id if position else None
            self._emit(se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire()))

    def on_tool_call_started(
        self, response_id: str, call_id: str, name: str, *, now: float
    ) -> None:
        """The LLM began a function call."""
        if not self._at(now):
            return
        response = self._live(response_id)
        if response is None:
            return
        self._close_message(response, "completed")
        entry = Entry(
            id=self.ids.new("item"),
            type="function_call",
            status="in_progress",
            name=name,
            call_id=call_id,
        )
        response.calls[call_id] = entry
        self._add_output(response, entry)

    def on_tool_call_delta(self, response_id: str, call_id: str, delta: str, *, now: float) -> None:
        """A piece of a function call's arguments."""
        if not self._at(now):
            return
        response = self._live(response_id)
        entry = response.calls.get(call_id) if response else None
        if response is None or entry is None:
            return
        entry.arguments += delta
        self._emit(
            se.FunctionCallArgumentsDelta(
                response_id=response.id,
                item_id=entry.id,
                output_index=response.output.index(entry),
                call_id=call_id,
                delta=delta,
            )
        )

    def on_tool_call_finished(
        self, response_id: str, call_id: str, arguments: str, *, now: float
    ) -> None:
        """A function call is complete."""
        if not self._at(now):
            return
        response = self._live(response_id)
        entry = response.calls.pop(call_id, None) if response else None
        if response is None or entry is None:
            return
        entry.arguments = arguments
        entry.status = "completed"
        index = response.output.index(entry)
        self._emit(
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

    def on_generation_finished(self, response_id: str, finished: Finished, *, now: float) -> None:
        """The engines are done with a response."""
        if not self._at(now):
            return
        response = self._live(response_id)
        if response is None:
            return
        audio_ms = sum(
            p.duration_ms() for e in response.output for p in e.parts if p.type == "output_audio"
        )
        output_audio_tokens = math.ceil(audio_ms / 50)
        response.usage = se.Usage(
            total_tokens=finished.prompt_tokens + finished.completion_tokens + output_audio_tokens,
            input_tokens=finished.prompt_tokens,
            output_tokens=finished.completion_tokens + output_audio_tokens,
            input_token_details={
                "text_tokens": finished.prompt_tokens,
                "audio_tokens": 0,
                "image_tokens": 0,
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
        if self._usage_window:
            when, tokens = self._usage_window[-1]
            self._usage_window[-1] = (when, tokens + response.usage.total_tokens)
        if finished.reason == "length":
            self._end_response(
                response, "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
            )
        else:
            self._end_response(response, "completed", None)
        if response.in_band and not self.plays_audio:
            # Over WebSocket the client plays the reply as it arrives: allow for its length.
            self._arm_idle_timeout(audio_ms)

    def _arm_idle_timeout(self, after_ms: float) -> None:
        policy = self._policy
        if policy is not None and policy.idle_timeout_ms is not None:
            self._idle_deadline_ms = self._clock_ms + after_ms + policy.idle_timeout_ms

    # ----------------------------------------------------------------- playout (WebRTC, SIP)

    def _clear_playout(self, requested: bool = False) -> None:
        """Stop the audio playing: all of it when the client asks, the conversation's reply on
        barge-in (an out-of-band response is not part of the turn the user interrupts)."""
        if requested and not self._playing:
            raise ProtocolError("No audio is playing.", code="output_audio_buffer_empty")
        for response_id, playout in self._playing.items():
            if requested or playout.in_band:
                self._outbox.append(ClearAudio(response_id))

    def on_playout_started(self, response_id: str, *, now: float) -> None:
        """The transport began playing a response's audio."""
        if not self._at(now):
            return
        self._emit(se.OutputAudioBufferStarted(response_id=response_id))

    def on_playout_stopped(self, response_id: str, *, now: float) -> None:
        """The transport played a response's audio to the end."""
        if not self._at(now):
            return
        playout = self._playing.pop(response_id, None)
        if playout is not None:
            self._emit(se.OutputAudioBufferStopped(response_id=response_id))
            if playout.in_band:
                self._arm_idle_timeout(0)

    def on_playout_cleared(self, response_id: str, played_ms: int, *, now: float) -> None:
        """Playout stopped early (barge-in or a clear): the item keeps only what was heard."""
        if not self._at(now):
            return
        playout = self._playing.pop(response_id, None)
        if playout is None:
            return
        item_id = playout.item_id
        if item_id in self.conversation:
            part = self.conversation.get(item_id).parts[0]
            if part.audio is not None and played_ms < part.duration_ms():
                truncate_part(part, played_ms)
                self._emit(
                    se.ConversationItemTruncated(
                        item_id=item_id, content_index=0, audio_end_ms=played_ms
                    )
                )
        self._emit(se.OutputAudioBufferCleared(response_id=response_id))

    def on_generation_failed(self, response_id: str, message: str, *, now: float) -> None:
        """An engine failed: this response fails, the session goes on."""
        if not self._at(now):
            return
        response = self._live(response_id)
        if response is None:
            return
        self._end_response(
            response,
            "failed",
            {
                "type": "failed",
                "error": {"type": "server_error", "code": "engine_error", "message": message},
            },
        )

    def _end_response(
        self,
        response: _Response,
        status: Literal["completed", "cancelled", "failed", "incomplete"],
        details: dict[str, Any] | None,
    ) -> None:
        if response.id not in self._responses:
            return
        if status != "completed":
            self._outbox.append(CancelGeneration(response.id))
        item_status: Literal["completed", "incomplete"] = (
            "completed" if status == "completed" else "incomplete"
        )
        self._close_message(response, item_status)
        if response.id in self._playing:
            self._outbox.append(FinishAudio(response.id))
        for call_id, entry in list(response.calls.items()):
            entry.status = "incomplete"
            del response.calls[call_id]
            self._finish_item(response, entry, response.output.index(entry))
        response.status = status
        response.status_details = details
        del self._responses[response.id]
        if self._in_band is response:
            self._in_band = None
        self._emit(se.ResponseDone(response=response.to_wire()))
        if response.in_band:
            self._prefill()


def _duration(seconds: float) -> str:
    """``3600`` → "60 minutes" (OpenAI's wording), ``1.5`` → "1.5 seconds"."""
    value, unit = (
        (seconds // 60, "minute") if seconds >= 60 and seconds % 60 == 0 else (seconds, "second")
    )
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


def _voice_name(voice: str | VoiceId) -> str:
    return voice.id if isinstance(voice, VoiceId) else voice


def _part_summary(part: Part) -> dict[str, Any]:
    if part.type == "output_audio":
        return {"type": "audio", "transcript": part.transcript or ""}
    return {"type": "text", "text": part.text or ""}

"""The Realtime session as a sans-I/O state machine: the thin ``Session`` around its concepts.

Inputs are client events (``receive``), input audio (``append_audio``) and engine and
playout results (``handle``, the types of ``results``), each handed in with the wall time
``now`` (UNIX seconds), plus
``handle_timer(now)`` when ``next_deadline()`` has come; outputs are server events and actions
for the driver, collected with ``drain``. Turn-taking runs on the audio sample clock and the
session limit and rate windows on the wall time handed in, so a test can replay a conversation
and get the same events every time. Nothing here touches a socket, a thread or the system clock.

The session dispatches client events and inputs, routes results to the part that owns them,
and holds the session's config and limit; the rest lives with its concept: turn-taking (the
input buffer, speech start and stop, commits, pauses, the idle timeout, the VAD's failures:
``turn_taking``), the VAD feed (``vad_feed``), the turn policy (``turn_policy``),
speculation during pauses (``speculation``), recognition (``recognition``), responses and
the audio the conversation keeps (``response_lifecycle``), the client's items
(``client_items``), input waiting behind a denoise (``held_input``), rate limits
(``rate_limits``) and playout (``playout_state``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from hark.audio.formats import decode_audio
from hark.protocol import client_events as ce
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.protocol.limits import MAX_APPEND_BYTES, SESSION_LIMIT_S, MiB
from hark.protocol.response_params import parse_response_params
from hark.protocol.session_config import (
    SessionConfig,
    parse_session_config,
    session_config_to_dict,
)
from hark.session import results
from hark.session.actions import Close, Denoise
from hark.session.client_items import ClientItems
from hark.session.context import SessionContext
from hark.session.conversation import Conversation
from hark.session.held_input import Held, HeldInput
from hark.session.ids import IdGenerator
from hark.session.mcp_tools import ListingEnded, McpTools
from hark.session.noise_reduction import NoiseReduction
from hark.session.outbox import Outbox, Output
from hark.session.playout_state import PlayoutState
from hark.session.rate_limits import RateLimits, RateWindow
from hark.session.recognition import Recognition
from hark.session.response_lifecycle import ResponseLifecycle, voice_name
from hark.session.results import Result
from hark.session.speculation import Speculation
from hark.session.turn_taking import TurnTaking

# The most audio an append can carry: its base64 is at most MAX_APPEND_BYTES long.
_MAX_APPEND_AUDIO = MAX_APPEND_BYTES // 4 * 3
# How much conversation audio a session keeps as PCM, newest first, input and replies together.
# Kept whole, an hour of 24 kHz audio is 170 MB, the memory of a machine across hundreds of
# sessions. Five minutes (14 MB at 24 kHz, 5 MB for G.711) still covers what clients come back
# for, truncating the reply being played and retrieving recent turns; a client that wants a
# recording has had every byte of it already.
AUDIO_RETENTION_S = 5 * 60
# Appends longer than this (seconds of audio) with noise reduction on are denoised off the
# event loop (a ``Denoise`` action): the denoiser takes about 40 ms of CPU per second of audio,
# so a 15 MiB append would hold the worker's loop, and every other session on it, for seconds.
# Real-time clients send 20 to 100 ms at a time, and those stay inline.
DENOISE_INLINE_S = 0.5


class Session:
    """One Realtime session: config, input buffer, turn-taking, conversation, responses."""

    def __init__(
        self,
        *,
        model: str,
        vad_chunk_ms: int,
        asr_rate: int,
        config: SessionConfig | None = None,
        session_id: str | None = None,
        ids: IdGenerator | None = None,
        created_at: float = 0.0,
        max_duration_s: float = SESSION_LIMIT_S,
        rate_limits: RateLimits | None = None,
        plays_audio: bool = False,
        audio_retention_s: float = AUDIO_RETENTION_S,
        takes_images: bool = True,
    ) -> None:
        """``vad_chunk_ms``: the audio in each of the VAD's chunks (``VadEngine.chunk_ms``);
        ``asr_rate``: the sample rate recognition takes (``AsrEngine.sample_rate``).
        ``plays_audio``: the transport plays reply audio itself (WebRTC, SIP), so audio
        leaves as PlayAudio actions instead of ``response.output_audio.delta`` events.
        ``audio_retention_s``: how many seconds of the latest conversation audio items keep;
        older items keep only their words. ``takes_images``: whether the LLM reads images; when
        not, items with images are refused."""
        self.ids = ids or IdGenerator()
        self.id = session_id or self.ids.new("sess")
        base = config or SessionConfig()
        self.created_at = created_at
        self.expires_at = int(created_at + max_duration_s)
        self._max_duration_s = max_duration_s
        self._closed = False
        self._outbox = Outbox(self.ids)
        self.conversation = Conversation()
        context = SessionContext(
            self._outbox,
            self.ids,
            self.conversation,
            msgspec.structs.replace(base, model=model),
            audio_retention_ms=int(audio_retention_s * 1000),
            takes_images=takes_images,
            now=created_at,
        )
        self._context = context
        self._plays_audio = plays_audio
        self._playout = PlayoutState(self._outbox, self.conversation)
        self._noise = NoiseReduction(context)
        self._held = HeldInput(self._outbox)
        self._speculation = Speculation(self._outbox)
        self._recognition = Recognition(context, asr_rate)
        self._mcp = McpTools(context)
        self._responses = ResponseLifecycle(
            context,
            rates=RateWindow(rate_limits or RateLimits()),
            speculation=self._speculation,
            playout=self._playout,
            plays_audio=plays_audio,
            mcp=self._mcp,
            recognition=self._recognition,
        )
        self._items = ClientItems(
            context,
            recognition=self._recognition,
            responses=self._responses,
            mcp=self._mcp,
        )
        self._turns = TurnTaking(
            context,
            vad_chunk_ms=vad_chunk_ms,
            asr_rate=asr_rate,
            speculation=self._speculation,
            recognition=self._recognition,
            responses=self._responses,
            playout=self._playout,
            items=self._items,
        )
        # The type of the last client event received ("unknown" when it did not decode).
        self.last_event_type = "unknown"

    # ----------------------------------------------------------------- plumbing

    @property
    def config(self) -> SessionConfig:
        """The session's configuration in force."""
        return self._context.config

    def drain(self) -> list[Output]:
        """Everything produced since the last call: server events and actions, in order."""
        return self._outbox.drain()

    def report_internal_error(self) -> None:
        """Tell the client that the server failed on its last event (the session goes on)."""
        self._outbox.error(
            ProtocolError(
                "The server had an error while processing the event.",
                code="server_error",
                type="server_error",
            ),
            None,
        )

    def start(self) -> None:
        """Emit ``session.created``."""
        self._outbox.emit(se.SessionCreated(session=self._session_dict()))
        self._mcp.configure(self.config.tools)
        self._responses.prefill()

    def _session_dict(self) -> dict[str, Any]:
        return session_config_to_dict(self.config, session_id=self.id, expires_at=self.expires_at)

    def _at(self, now: float) -> bool:
        """Take the wall time handed in with an input; False once the session is over."""
        self._context.now = now
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
        if self._at(now):
            self._turns.handle_timer(now)

    def next_deadline(self) -> float | None:
        """The wall time (UNIX seconds) at which ``handle_timer`` must be called next, if no
        other input comes first; None when nothing waits on the clock."""
        if self._closed:
            return None
        idle = self._turns.idle_deadline
        return self.expires_at if idle is None else min(self.expires_at, idle)

    def end(self, error: ProtocolError, reason: str, *, now: float) -> None:
        """End the session for ``reason``: running responses are cancelled, the client gets
        ``error`` as an ``error`` event, and the transport is asked to close. Idempotent."""
        self._context.now = now
        if self._closed:
            return
        self._closed = True
        self._held.clear()
        self._responses.cancel_all()
        self._outbox.error(error, None)
        self._outbox.act(Close(reason))

    # ----------------------------------------------------------------- client events

    def receive(self, data: str | bytes, *, now: float) -> None:
        """Handle one client event (a WebSocket text frame). Never raises for bad input."""
        if not self._at(now):
            return
        if self._waits():
            self.last_event_type = _event_type(data)
            self._held.hold(Held("event", data, len(data)))
            return
        self._receive(data)

    def _receive(self, data: str | bytes) -> None:
        try:
            event = ce.decode_client_event(data)
        except ce.DecodeError as exc:
            self.last_event_type = "unknown"
            self._outbox.error(exc, exc.event_id)
            return
        self.last_event_type = ce.EVENT_TYPE[type(event)]
        try:
            self._dispatch(event)
        except ProtocolError as exc:
            self._outbox.error(exc, event.event_id)

    def receive_binary(self, data: bytes, *, now: float) -> None:
        """Binary frames are not part of the protocol: answer with an error."""
        if not self._at(now):
            return
        if self._waits():
            self._held.hold(Held("binary", b"", 0))
            return
        self._refuse_binary()

    def _refuse_binary(self) -> None:
        self._outbox.error(
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
        elif self.config.type == "transcription" and isinstance(event, _REALTIME_ONLY):
            raise ProtocolError(
                f"'{ce.EVENT_TYPE[type(event)]}' is not supported in a transcription session: "
                "it transcribes the input audio and never creates responses.",
                "type",
                "invalid_event",
            )
        elif isinstance(event, ce.SessionUpdate):
            self._update_session(event.session, event.event_id)
        elif isinstance(event, ce.InputAudioBufferCommit):
            self._turns.commit()
        elif isinstance(event, ce.InputAudioBufferClear):
            self._turns.clear()
        elif isinstance(event, ce.ConversationItemCreate):
            self._items.create(event.item, event.previous_item_id)
        elif isinstance(event, ce.ConversationItemRetrieve):
            entry = self.conversation.get(event.item_id)
            self._outbox.emit(se.ConversationItemRetrieved(item=entry.to_wire(include_audio=True)))
        elif isinstance(event, ce.ConversationItemTruncate):
            self._items.truncate(event.item_id, event.content_index, event.audio_end_ms)
        elif isinstance(event, ce.ConversationItemDelete):
            self._items.delete(event.item_id)
        elif isinstance(event, ce.ResponseCreate):
            self._responses.create(
                parse_response_params(event.response),
                self._items.response_inputs,
                self._context.now,
            )
        elif isinstance(event, ce.ResponseCancel):
            self._responses.cancel(event.response_id)
        elif isinstance(event, ce.OutputAudioBufferClear):
            if not self._plays_audio:
                raise ProtocolError(
                    "output_audio_buffer.clear is only supported on WebRTC and SIP sessions; "
                    "over WebSocket the client owns playback.",
                    code="invalid_event",
                )
            self._playout.clear(requested=True)

    def _update_session(self, update: dict[str, Any], event_id: str | None) -> None:
        # Any model name is taken and echoed: clients (the agents SDK among them) send their
        # own default, and hark serves the model it has whatever the session is called.
        # What hark cannot honour is set aside with an error each; the rest applies.
        refused: list[ProtocolError] = []
        self._apply_config(parse_session_config(update, base=self.config, refused=refused))
        for error in refused:
            self._outbox.error(error, event_id)
        self._outbox.emit(se.SessionUpdated(session=self._session_dict()))
        # MCP servers the update adds are listed after it, as OpenAI does.
        self._mcp.configure(self.config.tools)
        self._responses.prefill()

    def _apply_config(self, config: SessionConfig) -> None:
        old = self.config
        if self._responses.audio_produced and voice_name(config.audio.output.voice) != voice_name(
            old.audio.output.voice
        ):
            raise ProtocolError(
                "Cannot update a conversation's voice if assistant audio is present.",
                "session.audio.output.voice",
                "cannot_update_voice",
            )
        self._context.config = config
        if (
            config.audio.input.format != old.audio.input.format
            or config.audio.input.turn_detection != old.audio.input.turn_detection
        ):
            self._turns.setup()

    # ----------------------------------------------------------------- input audio

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
        pcm = decode_audio(self._turns.format, data)
        rate = self._turns.rate
        denoiser = self._noise.denoiser(rate)
        if denoiser is None:
            self._turns.append(pcm)
        elif len(pcm) <= rate * DENOISE_INLINE_S:
            self._turns.append(denoiser.process(pcm))
        else:
            job_id = self.ids.new("denoise")
            self._held.denoise(job_id, pcm)
            self._outbox.act(Denoise(job_id, pcm, denoiser.process))

    @property
    def input_rate(self) -> int:
        """Sample rate of the input format: what ``append_audio`` expects."""
        return self._turns.rate

    @property
    def last_pause_ms(self) -> float:
        """How long the pause that ended the last turn lasted (the end-of-turn wait)."""
        return self._turns.last_pause_ms

    def append_audio(self, pcm: npt.NDArray[np.int16], *, now: float) -> None:
        """Input audio that arrived as PCM at ``input_rate`` (a media track, not an event)."""
        if not self._at(now):
            return
        if self._waits():
            self._held.hold(Held("audio", pcm, pcm.nbytes))
            return
        self._turns.append(self._noise.apply(pcm, self._turns.rate))

    def _waits(self) -> bool:
        """Whether client input must wait, behind an append being denoised; input that waited
        after a job ended is taken back first (if taking it back stopped at an error)."""
        if self._held.releasable:
            self._replay()
        return self._held.denoising

    def _replay(self) -> None:
        """Handle the input that waited, in order, until it is all handled or another long
        append is sent off to be denoised."""
        for held in self._held.release():
            if held.kind == "event":
                assert not isinstance(held.data, np.ndarray)
                self._receive(held.data)
            elif held.kind == "binary":
                self._refuse_binary()
            else:
                assert isinstance(held.data, np.ndarray)
                self._turns.append(self._noise.apply(held.data, self._turns.rate))
            if self._closed:
                break

    def receive_dtmf(self, event: str, *, now: float) -> None:
        """A keypad press from the phone (SIP): told to the client, never heard as speech."""
        if self._at(now):
            self._outbox.emit(
                se.InputAudioBufferDtmfEventReceived(event=event, received_at=int(now))
            )

    # ----------------------------------------------------------------- results

    def handle(self, result: Result, *, now: float) -> None:
        """An engine's or the transport's result (see ``results``), routed to the part of the
        session that owns it."""
        if self._at(now):
            _ROUTES[type(result)](self, result)

    def _recognised(self, result: results.Recognised) -> None:
        if self._turns.backchannel_heard(result.request_id, result.transcript):
            return
        step = self._recognition.recognised(result.request_id, result.transcript)
        if step.read_ahead is not None:
            self._responses.prefill_turn(step.read_ahead)
        self._words_known(step.heard)
        if step.pause is not None:
            self._turns.pause_recognised(*step.pause)
        self._turns.recognise_turn()

    def _recognised_text(self, result: results.RecognisedText) -> None:
        step = self._recognition.recognised_text(result.request_id, result.words)
        if step.pause is not None:
            self._turns.pause_recognised(*step.pause)

    def _transcription_failed(self, result: results.TranscriptionFailed) -> None:
        if not self._turns.backchannel_failed(result.request_id):
            entry = self._recognition.failed(result.request_id, result.message)
            if entry is not None:
                # Those waiting for its words fail first, so that none starts without them.
                self._responses.words_failed(entry, result.message)
                self._words_known(True)
            self._turns.recognise_turn()

    def _words_known(self, heard: bool) -> None:
        """When an item's words became known, the responses waiting for them start."""
        if heard:
            self._responses.resume_waiting()

    def _denoised(self, result: results.Denoised) -> None:
        """Into the buffer with the append, then the input that waited for it."""
        if self._held.finish(result.job_id) is not None:
            self._turns.append(result.pcm)
            self._replay()

    def _denoise_failed(self, result: results.DenoiseFailed) -> None:
        """The client is told, and its audio goes in as it was sent rather than be lost; the
        denoiser starts afresh."""
        pcm = self._held.finish(result.job_id)
        if pcm is None:
            return
        self._noise.close()
        self._outbox.error(
            ProtocolError(
                f"Noise reduction failed ({result.message}); this audio was used as sent.",
                code="noise_reduction_failed",
                type="server_error",
            ),
            None,
        )
        self._turns.append(pcm)
        self._replay()

    def _mcp_list_failed(self, result: results.McpListFailed) -> None:
        ended = self._mcp.list_failed(result.item_id)
        self._listing_ended(ended)
        if ended is not None and result.error is not None:
            self._mcp.list_error(ended.label, result.error)

    def _listing_ended(self, ended: ListingEnded | None) -> None:
        if ended is None:
            return
        if ended.response_item is not None:
            self._responses.listing_done(ended.response_item)
        if ended.tools_changed:
            self._responses.prefill()

    def _replied(self, audio_ms: float | None) -> None:
        """A response ended; when it was the reply the client plays, the idle timeout counts
        from the end of its ``audio_ms``."""
        if audio_ms is not None:
            self._turns.arm_idle_timeout(audio_ms, self._context.now)

    def _playout_stopped(self, result: results.PlayoutStopped) -> None:
        if self._playout.stopped(result.response_id):
            # The user has heard the conversation's reply: the idle timeout runs from now.
            self._turns.arm_idle_timeout(0, self._context.now)

    def _playout_cleared(self, result: results.PlayoutCleared) -> None:
        """The item keeps only what was heard."""
        self._playout.cleared(result.response_id, result.played_ms)
        self._responses.audio_cleared(result.response_id)


# Where each result goes: one look-up per result, on the path of every audio chunk and delta.
_ROUTES: dict[type[Result], Callable[[Session, Any], None]] = {
    results.VadScored: lambda s, r: s._turns.on_vad(r.probability, r.epoch),
    results.VadMissed: lambda s, r: s._turns.vad_missed(r.epoch, r.error),
    results.TurnScored: lambda s, r: s._turns.on_turn_score(r.key, r.probability),
    results.TurnScoreFailed: lambda s, r: s._turns.on_turn_score_failed(r.key),
    results.TranscriptionDelta: lambda s, r: s._recognition.delta(r.request_id, r.delta),
    results.TranscriptionDone: lambda s, r: s._words_known(
        s._recognition.done(r.request_id, r.transcript, r.audio_seconds, r.language)
    ),
    results.TranscriptionFailed: Session._transcription_failed,
    results.RecognisedText: Session._recognised_text,
    results.Recognised: Session._recognised,
    results.Denoised: Session._denoised,
    results.DenoiseFailed: Session._denoise_failed,
    results.TextGenerated: lambda s, r: s._responses.text(r.response_id, r.delta),
    results.AudioGenerated: lambda s, r: s._responses.audio(r.response_id, r.pcm, r.transcript),
    results.ToolCallStarted: lambda s, r: s._responses.tool_call_started(
        r.response_id, r.call_id, r.name
    ),
    results.ToolCallDelta: lambda s, r: s._responses.tool_call_delta(
        r.response_id, r.call_id, r.delta
    ),
    results.ToolCallFinished: lambda s, r: s._replied(
        s._responses.tool_call_finished(r.response_id, r.call_id, r.arguments)
    ),
    results.GenerationFinished: lambda s, r: s._replied(
        s._responses.finished(r.response_id, r.finished)
    ),
    results.GenerationFailed: lambda s, r: s._responses.failed(
        r.response_id, r.message, r.code, r.error_type
    ),
    results.McpToolsListed: lambda s, r: s._listing_ended(s._mcp.listed(r.item_id, r.tools)),
    results.McpListFailed: Session._mcp_list_failed,
    results.McpCallDone: lambda s, r: s._replied(
        s._responses.mcp_call_done(r.response_id, r.item_id, output=r.output)
    ),
    results.McpCallFailed: lambda s, r: s._replied(
        s._responses.mcp_call_done(r.response_id, r.item_id, error=r.error)
    ),
    results.PlayoutStarted: lambda s, r: s._playout.started(r.response_id),
    results.PlayoutStopped: Session._playout_stopped,
    results.PlayoutCleared: Session._playout_cleared,
}

# What a transcription session refuses: it has no responses and no output, and its
# conversation holds only the user's transcribed turns.
_REALTIME_ONLY = (
    ce.ResponseCreate,
    ce.ResponseCancel,
    ce.ConversationItemCreate,
    ce.ConversationItemTruncate,
    ce.OutputAudioBufferClear,
)


class _EventType(msgspec.Struct):
    type: str = "unknown"


def _event_type(data: str | bytes) -> str:
    """An event's type, read without decoding the rest (for the metrics of an event that
    waits)."""
    try:
        return msgspec.json.decode(data, type=_EventType).type
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return "unknown"


def _duration(seconds: float) -> str:
    """``3600`` → "60 minutes" (OpenAI's wording), ``1.5`` → "1.5 seconds"."""
    value, unit = (
        (seconds // 60, "minute") if seconds >= 60 and seconds % 60 == 0 else (seconds, "second")
    )
    return f"{value:g} {unit}{'' if value == 1 else 's'}"

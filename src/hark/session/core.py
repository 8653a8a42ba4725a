"""The Realtime session as a sans-I/O state machine: the thin ``Session`` around its concepts.

Inputs are client events (``receive``), input audio (``append_audio``) and engine and
playout results (``on_*``), each handed in with the wall time ``now`` (UNIX seconds), plus
``handle_timer(now)`` when ``next_deadline()`` has come; outputs are server events and actions
for the driver, collected with ``drain``. Turn-taking runs on the audio sample clock and the
session limit and rate windows on the wall time handed in, so a test can replay a conversation
and get the same events every time. Nothing here touches a socket, a thread or the system clock.

The session dispatches client events and inputs, holds the session's config, limit and audio
retention, and edits conversation items; the rest lives with its concept: turn-taking (the
input buffer, speech start and stop, commits, pauses, the idle timeout: ``turn_taking``), the
VAD feed (``vad_feed``), the turn policy (``turn_policy``), speculation during pauses
(``speculation``), recognition (``recognition``), responses (``response_lifecycle``), rate
limits (``rate_limits``) and playout (``playout_state``).
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from hark.audio.formats import decode_audio
from hark.engines.asr import TimedTranscript
from hark.engines.llm import Finished
from hark.protocol import client_events as ce
from hark.protocol import items as wire
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError, from_validation_error
from hark.protocol.limits import MAX_APPEND_BYTES, SESSION_LIMIT_S, MiB
from hark.protocol.response_params import ResponseParams, parse_response_params
from hark.protocol.session_config import (
    SessionConfig,
    parse_session_config,
    session_config_to_dict,
)
from hark.session.actions import Close, CountDroppedAudio, Denoise
from hark.session.client_items import entry_from_wire
from hark.session.conversation import Conversation, Entry, Part, truncate_part
from hark.session.ids import IdGenerator
from hark.session.mcp_tools import McpTools
from hark.session.noise_reduction import NoiseReduction
from hark.session.outbox import Outbox, Output
from hark.session.playout_state import PlayoutState
from hark.session.rate_limits import RateLimits, RateWindow
from hark.session.recognition import Recognition
from hark.session.response_lifecycle import ResponseLifecycle, voice_name
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
# The most that items a client creates (``conversation.item.create``) may hold together, as
# their JSON: far more text than any model reads, and a bound on what a client can make a
# session keep (each event may carry 15 MiB, for an hour). Deleting items frees room.
MAX_CLIENT_ITEMS_BYTES = 64 * MiB
# Appends longer than this (seconds of audio) with noise reduction on are denoised off the
# event loop (a ``Denoise`` action): the denoiser takes about 40 ms of CPU per second of audio,
# so a 15 MiB append would hold the worker's loop, and every other session on it, for seconds.
# Real-time clients send 20 to 100 ms at a time, and those stay inline.
DENOISE_INLINE_S = 0.5
# What may wait while a session's audio is denoised off the loop: its later client events and
# media audio, in order. Two more appends of the largest size, or a minute of 20 ms frames.
MAX_HELD_INPUTS = 3000
MAX_HELD_BYTES = 2 * MAX_APPEND_BYTES
# The opt-in (session ``include``) for logprobs on input transcription events.
LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"


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
        self.config = msgspec.structs.replace(base, model=model)
        self.created_at = created_at
        self.expires_at = int(created_at + max_duration_s)
        self._max_duration_s = max_duration_s
        self._now = created_at
        self._closed = False
        self._outbox = Outbox(self.ids)
        self.conversation = Conversation()
        self._audio_retention_ms = int(audio_retention_s * 1000)
        # The size of each item the client created that is still in the conversation.
        self._client_items: dict[str, int] = {}
        self._client_items_bytes = 0
        self._plays_audio = plays_audio
        self._takes_images = takes_images
        self._playout = PlayoutState(self._outbox, self.conversation)
        # The parts call back into the session through a weak proxy: strong references would
        # make cycles, and a closed session, its conversation audio included, would then be
        # freed only by the cycle collector, long after its runner let go of it.
        me = weakref.proxy(self)
        self._noise = NoiseReduction(lambda: me.config.audio.input.noise_reduction)
        # The append being denoised off the loop (its job id and audio as sent), and the client
        # input that waits for it, in order (see ``_hold``).
        self._denoising: tuple[str, npt.NDArray[np.int16]] | None = None
        self._held: deque[_Held] = deque()
        self._held_bytes = 0
        self._held_audio_refused = False
        self._speculation = Speculation(self._outbox)
        self._recognition = Recognition(
            self._outbox,
            self.conversation,
            asr_rate,
            transcription=lambda: me.config.audio.input.transcription,
            on_heard=lambda: me._responses.resume_waiting(),
            logprobs=lambda: LOGPROBS_INCLUDE in (me.config.include or ()),
            on_words=lambda words: me._responses.prefill_turn(words),
            on_failed=lambda entry, message: me._responses.words_failed(entry, message),
        )
        self._mcp = McpTools(
            self._outbox,
            self.ids,
            self.conversation,
            tools_changed=lambda: me._responses.prefill(),
            response_listed=lambda entry: me._responses.listing_done(entry),
        )
        self._responses = ResponseLifecycle(
            self._outbox,
            self.ids,
            self.conversation,
            config=lambda: me.config,
            rates=RateWindow(rate_limits or RateLimits()),
            speculation=self._speculation,
            playout=self._playout,
            plays_audio=plays_audio,
            limit_audio=lambda: me._limit_audio(),
            reply_sent=lambda after_ms: me._turns.arm_idle_timeout(after_ms, me._now),
            mcp=self._mcp,
            words_unneeded=lambda entry: me._recognition.abandon(entry),
        )
        self._turns = TurnTaking(
            self._outbox,
            self.ids,
            self.conversation,
            config=lambda: me.config,
            vad_chunk_ms=vad_chunk_ms,
            asr_rate=asr_rate,
            speculation=self._speculation,
            recognition=self._recognition,
            responses=self._responses,
            playout=self._playout,
            respond=lambda: me._create_response(ResponseParams()),
            limit_audio=lambda: me._limit_audio(),
        )
        # The type of the last client event received ("unknown" when it did not decode).
        self.last_event_type = "unknown"
        # The VAD failed and has not answered since (its error was sent once).
        self._vad_failing = False

    # ----------------------------------------------------------------- plumbing

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
        self._now = now
        if self._closed:
            return
        self._closed = True
        self._denoising = None
        self._held.clear()
        self._held_bytes = 0
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
            self._hold(_Held("event", data, len(data)))
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
            self._hold(_Held("binary", b"", 0))
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
            self._create_item(event.item, event.previous_item_id)
        elif isinstance(event, ce.ConversationItemRetrieve):
            entry = self.conversation.get(event.item_id)
            self._outbox.emit(se.ConversationItemRetrieved(item=entry.to_wire(include_audio=True)))
        elif isinstance(event, ce.ConversationItemTruncate):
            self._truncate(event.item_id, event.content_index, event.audio_end_ms)
        elif isinstance(event, ce.ConversationItemDelete):
            self._delete(event.item_id)
        elif isinstance(event, ce.ResponseCreate):
            self._create_response(parse_response_params(event.response))
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
        self.config = config
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
            self._denoising = (job_id, pcm)
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
            self._hold(_Held("audio", pcm, pcm.nbytes))
            return
        self._turns.append(self._noise.apply(pcm, self._turns.rate))

    def on_denoised(self, job_id: str, pcm: npt.NDArray[np.int16], *, now: float) -> None:
        """The append ``Denoise(job_id)`` took is denoised: into the buffer with it, then the
        input that waited for it."""
        if self._at(now) and self._denoising is not None and self._denoising[0] == job_id:
            self._denoising = None
            self._turns.append(pcm)
            self._replay()

    def on_denoise_failed(self, job_id: str, message: str, *, now: float) -> None:
        """``Denoise(job_id)`` raised: the client is told, and its audio goes in as it was sent
        rather than be lost; the denoiser starts afresh."""
        if not self._at(now) or self._denoising is None or self._denoising[0] != job_id:
            return
        pcm = self._denoising[1]
        self._denoising = None
        self._noise.close()
        self._outbox.error(
            ProtocolError(
                f"Noise reduction failed ({message}); this audio was used as sent.",
                code="noise_reduction_failed",
                type="server_error",
            ),
            None,
        )
        self._turns.append(pcm)
        self._replay()

    def _waits(self) -> bool:
        """Whether client input must wait, behind an append being denoised; input that waited
        after a job ended is replayed first (if replaying stopped at an error)."""
        if self._denoising is None and self._held:
            self._replay()
        return self._denoising is not None

    def _hold(self, held: _Held) -> None:
        """Keep ``held`` until the append being denoised is in the buffer; past the bound, an
        event is refused with an error, and media audio is dropped (counted, one error)."""
        if len(self._held) < MAX_HELD_INPUTS and self._held_bytes + held.size <= MAX_HELD_BYTES:
            self._held.append(held)
            self._held_bytes += held.size
            return
        bound = f"at most {MAX_HELD_INPUTS} events or {MAX_HELD_BYTES // MiB} MiB"
        if held.kind == "audio":
            assert isinstance(held.data, np.ndarray)
            self._outbox.act(CountDroppedAudio(len(held.data)))
            if self._held_audio_refused:
                return
            self._held_audio_refused = True
        self._outbox.error(
            ProtocolError(
                "Input waits while an earlier append is denoised, and "
                f"{bound} may wait: this {'audio was' if held.kind == 'audio' else 'event was'} "
                "dropped.",
                code="input_backlog_full",
            ),
            None,
        )

    def _replay(self) -> None:
        """Handle the input that waited, in order, until it is all handled or another long
        append is sent off to be denoised."""
        self._held_audio_refused = False
        while self._held and self._denoising is None and not self._closed:
            held = self._held.popleft()
            self._held_bytes -= held.size
            if held.kind == "event":
                assert not isinstance(held.data, np.ndarray)
                self._receive(held.data)
            elif held.kind == "binary":
                self._refuse_binary()
            else:
                assert isinstance(held.data, np.ndarray)
                self._turns.append(self._noise.apply(held.data, self._turns.rate))

    def receive_dtmf(self, event: str, *, now: float) -> None:
        """A keypad press from the phone (SIP): told to the client, never heard as speech."""
        if self._at(now):
            self._outbox.emit(
                se.InputAudioBufferDtmfEventReceived(event=event, received_at=int(now))
            )

    def on_vad(self, probability: float, epoch: int, *, now: float) -> None:
        """The VAD's answer for the oldest chunk not yet answered (of this epoch)."""
        if self._at(now):
            self._vad_failing = False
            self._turns.on_vad(probability, epoch)

    def on_vad_missed(self, epoch: int, error: str | None, *, now: float) -> None:
        """No VAD answer for the oldest chunk not yet answered: dropped (``error`` None) or
        the VAD failed. A failure is told to the client once, until the VAD answers again;
        turn detection waits meanwhile rather than hear silence."""
        if not self._at(now):
            return
        self._turns.vad_missed(epoch)
        if error is None or self._vad_failing:
            return
        self._vad_failing = True
        self._outbox.error(
            ProtocolError(
                f"Voice activity detection failed ({error}); turns are not detected until it "
                "works again.",
                code="vad_failed",
                type="server_error",
            ),
            None,
        )

    def _limit_audio(self) -> None:
        """Hold conversation audio to the retention budget; replies still being generated or
        played keep theirs, whatever their length."""
        keep = self._responses.item_ids() | self._playout.item_ids()
        self.conversation.limit_audio(self._audio_retention_ms, keep)

    # ----------------------------------------------------------------- speculation

    def on_turn_score(self, key: str, probability: float, *, now: float) -> None:
        """How complete the utterance of the pause ``key`` sounds (semantic_vad)."""
        if self._at(now):
            self._turns.on_turn_score(key, probability)

    def on_turn_score_failed(self, key: str, *, now: float) -> None:
        """The end-of-turn model failed on the pause ``key``."""
        if self._at(now):
            self._turns.on_turn_score_failed(key)

    # ----------------------------------------------------------------- recognition results

    def on_transcription_delta(self, request_id: str, delta: str, *, now: float) -> None:
        """A piece of a transcript."""
        if self._at(now):
            self._recognition.delta(request_id, delta)

    def on_transcription_done(
        self,
        request_id: str,
        transcript: str,
        audio_seconds: float,
        language: str | None = None,
        *,
        now: float,
    ) -> None:
        """A whole transcript, and the language the engine heard it in (when it said)."""
        if self._at(now):
            self._recognition.done(request_id, transcript, audio_seconds, language)

    def on_recognised(self, request_id: str, transcript: TimedTranscript, *, now: float) -> None:
        """A step of incremental recognition (``Recognise``) heard ``transcript``."""
        if not self._at(now) or self._turns.backchannel_heard(request_id, transcript):
            return
        paused = self._recognition.recognised(request_id, transcript)
        if paused is not None:
            self._turns.pause_recognised(*paused)
        self._turns.recognise_turn()

    def on_transcription_failed(self, request_id: str, message: str, *, now: float) -> None:
        """Recognition failed: the LLM will see no words for that audio."""
        if self._at(now) and not self._turns.backchannel_failed(request_id):
            self._recognition.failed(request_id, message)
            self._turns.recognise_turn()

    # ----------------------------------------------------------------- conversation items

    def _create_item(self, raw: dict[str, Any], previous_item_id: str | None) -> None:
        try:
            item = msgspec.convert(raw, wire.Item)
        except msgspec.ValidationError as exc:
            raise from_validation_error(exc, "item") from None
        if isinstance(item, wire.McpApprovalResponseItem):
            self._mcp.check_response(item, "item")
        size = len(msgspec.json.encode(raw))
        if self._client_items_bytes + size > MAX_CLIENT_ITEMS_BYTES:
            raise ProtocolError(
                f"The conversation's items created by the client hold "
                f"{self._client_items_bytes} bytes; this one ({size} bytes) would pass the "
                f"{MAX_CLIENT_ITEMS_BYTES // MiB} MiB they may hold. Delete items to make room.",
                "item",
                "conversation_full",
            )
        entry, recognise = self._from_wire(item, "item")
        if entry.id in self.conversation:
            raise ProtocolError(
                f"Item with id {entry.id[:100]} already exists.", "item.id", "duplicate_item_id"
            )
        previous = self.conversation.insert(entry, previous_item_id)
        self._client_items[entry.id] = size
        self._client_items_bytes += size
        self._outbox.emit(se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire()))
        self._outbox.emit(se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire()))
        for part in recognise:
            self._recognition.recognise(entry, part)
        if isinstance(item, wire.McpApprovalResponseItem):
            self._responses.run_approved()
        self._limit_audio()
        self._responses.prefill()

    def _from_wire(self, item: wire.Item, param: str) -> tuple[Entry, list[Part]]:
        audio = self.config.audio
        return entry_from_wire(
            item,
            param,
            self.ids,
            audio.input.format,
            audio.output.format,
            takes_images=self._takes_images,
        )

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
        owner = self._responses.owner(entry)
        if owner is not None:
            self._responses.end_response(
                owner, "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
            )
        truncate_part(part, audio_end_ms)
        self._outbox.emit(
            se.ConversationItemTruncated(
                item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms
            )
        )
        self._responses.prefill()

    def _delete(self, item_id: str) -> None:
        entry = self.conversation.get(item_id)
        if self._responses.owner(entry) is not None:
            raise ProtocolError(
                "Cannot delete an item while its response is in progress.",
                "item_id",
                "invalid_value",
            )
        self.conversation.delete(item_id)
        self._client_items_bytes -= self._client_items.pop(item_id, 0)
        self._outbox.emit(se.ConversationItemDeleted(item_id=item_id))
        self._responses.prefill()

    # ----------------------------------------------------------------- responses

    def _create_response(self, params: ResponseParams) -> None:
        if self.config.type == "transcription":
            raise ProtocolError(
                "Transcription sessions do not create responses.", code="invalid_event"
            )
        self._responses.create(params, self._response_inputs, self._now)

    def _response_inputs(self, items: list[wire.ResponseInputItem]) -> list[Entry]:
        entries: list[Entry] = []
        # Recognition starts once every item is read: an invalid one refuses the response.
        to_recognise: list[tuple[Entry, Part]] = []
        for index, item in enumerate(items):
            if isinstance(item, wire.ItemReference):
                entries.append(self.conversation.get(item.id, f"response.input[{index}].id"))
            else:
                entry, recognise = self._from_wire(item, f"response.input[{index}]")
                to_recognise += [(entry, part) for part in recognise]
                entries.append(entry)
        for entry, part in to_recognise:
            self._recognition.recognise(entry, part)
        return entries

    def on_text(self, response_id: str, delta: str, *, now: float) -> None:
        """LLM text for a text-only response."""
        if self._at(now):
            self._responses.text(response_id, delta)

    def on_audio(
        self, response_id: str, pcm: npt.NDArray[np.int16], transcript: str, *, now: float
    ) -> None:
        """Reply audio at the output rate; ``transcript`` is the text this audio starts to speak."""
        if self._at(now):
            self._responses.audio(response_id, pcm, transcript)

    def on_tool_call_started(
        self, response_id: str, call_id: str, name: str, *, now: float
    ) -> None:
        """The LLM began a function call."""
        if self._at(now):
            self._responses.tool_call_started(response_id, call_id, name)

    def on_tool_call_delta(self, response_id: str, call_id: str, delta: str, *, now: float) -> None:
        """A piece of a function call's arguments."""
        if self._at(now):
            self._responses.tool_call_delta(response_id, call_id, delta)

    def on_tool_call_finished(
        self, response_id: str, call_id: str, arguments: str, *, now: float
    ) -> None:
        """A function call is complete."""
        if self._at(now):
            self._responses.tool_call_finished(response_id, call_id, arguments)

    def on_mcp_tools_listed(self, item_id: str, tools: list[wire.McpTool], *, now: float) -> None:
        """An MCP server listed its tools (``ListMcpTools``)."""
        if self._at(now):
            self._mcp.listed(item_id, tools)

    def on_mcp_list_failed(
        self, item_id: str, error: wire.McpCallError | None = None, *, now: float
    ) -> None:
        """An MCP server could not be listed (why: ``error``): it offers no tools, the session
        goes on."""
        if self._at(now):
            self._mcp.list_failed(item_id, error)

    def on_mcp_call_done(self, response_id: str, item_id: str, output: str, *, now: float) -> None:
        """An MCP call (``CallMcpTool``) returned ``output``."""
        if self._at(now):
            self._responses.mcp_call_done(response_id, item_id, output=output)

    def on_mcp_call_failed(
        self, response_id: str, item_id: str, error: wire.McpCallError, *, now: float
    ) -> None:
        """An MCP call failed; the next response reads the error."""
        if self._at(now):
            self._responses.mcp_call_done(response_id, item_id, error=error)

    def on_generation_finished(self, response_id: str, finished: Finished, *, now: float) -> None:
        """The engines are done with a response."""
        if self._at(now):
            self._responses.finished(response_id, finished)

    def on_generation_failed(
        self,
        response_id: str,
        message: str,
        code: str = "engine_error",
        error_type: str = "server_error",
        *,
        now: float,
    ) -> None:
        """An engine failed: this response fails with ``code`` (the error's ``type`` being
        ``error_type``), the session goes on."""
        if self._at(now):
            self._responses.failed(response_id, message, code, error_type)

    # ----------------------------------------------------------------- playout (WebRTC, SIP)

    def on_playout_started(self, response_id: str, *, now: float) -> None:
        """The transport began playing a response's audio."""
        if self._at(now):
            self._playout.started(response_id)

    def on_playout_stopped(self, response_id: str, *, now: float) -> None:
        """The transport played a response's audio to the end."""
        if self._at(now) and self._playout.stopped(response_id):
            # The user has heard the conversation's reply: the idle timeout runs from now.
            self._turns.arm_idle_timeout(0, now)

    def on_playout_cleared(self, response_id: str, played_ms: int, *, now: float) -> None:
        """Playout stopped early (barge-in or a clear): the item keeps only what was heard."""
        if self._at(now):
            self._playout.cleared(response_id, played_ms)
            self._responses.audio_cleared(response_id)


# What a transcription session refuses: it has no responses and no output, and its
# conversation holds only the user's transcribed turns.
_REALTIME_ONLY = (
    ce.ResponseCreate,
    ce.ResponseCancel,
    ce.ConversationItemCreate,
    ce.ConversationItemTruncate,
    ce.OutputAudioBufferClear,
)


class _Held(NamedTuple):
    """Client input that waits for an append being denoised: an event's text (``event``), a
    binary frame (``binary``) or media audio (``audio``); ``size`` counts toward the bound."""

    kind: str
    data: str | bytes | npt.NDArray[np.int16]
    size: int


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

"""Turn-taking: the user's input audio on the sample clock, and when it becomes a turn.

The input buffer fills with the client's audio; the VAD's answers, read by the turn policy's
detector, say where speech starts, pauses and stops. A stop (or ``input_audio_buffer.commit``,
or the idle timeout after the assistant's reply) commits the buffer's audio as a user item.
A turn is recognised as it is spoken, from speech start (or, without turn detection, from the
first audio of the uncommitted buffer); during a pause the turn so far is recognised at once
and a reply speculated on its words; with ``semantic_vad`` the end-of-turn model's verdict
sets how long the pause may last.

Turn-taking decides *when* audio is recognised (as it arrives, at a pause, at a commit);
``recognition`` owns the requests and where their transcripts go, ``speculation`` the pause's
speculative work.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hark.audio.formats import format_rate
from hark.audio.resample import resample
from hark.engines.asr import RecognitionRequest, TimedTranscript, Urgency
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.protocol.response_params import ResponseParams
from hark.protocol.session_config import AudioFormat
from hark.session.actions import CancelRecognition, CountDroppedAudio, Recognise, ScoreTurn
from hark.session.backchannel import Candidate, judge_words
from hark.session.client_items import ClientItems
from hark.session.context import SessionContext, SessionPart
from hark.session.conversation import Entry, Part
from hark.session.input_buffer import MAX_BUFFERED_S, InputAudioBuffer
from hark.session.playout_state import PlayoutState
from hark.session.recognition import Recognition
from hark.session.response_lifecycle import ResponseLifecycle
from hark.session.speculation import Pause, Speculation
from hark.session.turn_detection import MIN_SPEECH_MS, TurnDetector, TurnEvent
from hark.session.turn_policy import TurnPolicy, turn_policy
from hark.session.vad_feed import VadFeed

MIN_COMMIT_MS = 100
# The opt-in (session ``include``) for a ``hark.backchannel`` event per backchannel let pass.
BACKCHANNELS_INCLUDE = "hark.backchannels"


class TurnTaking(SessionPart):
    """The input buffer, the sample clock, and the turn in progress.

    ``context`` holds the session's outbox, ids, conversation, configuration and wall time;
    a turn that ends with ``create_response`` gets the conversation's response from
    ``responses``, as ``response.create`` with no parameters would (``items`` reads a
    response's input).
    """

    def __init__(
        self,
        context: SessionContext,
        *,
        vad_chunk_ms: int,
        asr_rate: int,
        speculation: Speculation,
        recognition: Recognition,
        responses: ResponseLifecycle,
        playout: PlayoutState,
        items: ClientItems,
    ) -> None:
        super().__init__(context)
        self._vad_chunk_ms = vad_chunk_ms
        self._asr_rate = asr_rate
        self._speculation = speculation
        self._recognition = recognition
        self._responses = responses
        self._playout = playout
        self._items = items
        self._vad: VadFeed | None = None
        # Milliseconds of input audio received: the sample clock turn-taking runs on.
        self._clock_ms = 0.0
        # The end of the latest chunk the VAD answered, on the sample clock.
        self._vad_now_ms = 0.0
        # The idle timeout, once armed: where the assistant's reply ends on the sample clock,
        # and when the timeout is due on the sample clock and in wall time (whichever first:
        # a client that stops sending still gets it, a replay faster than real time too).
        self._idle_start_ms = 0.0
        self._idle_deadline_ms: float | None = None
        self._idle_deadline: float | None = None
        self._speech_item_id: str | None = None
        self._speech_start_ms = 0.0
        # How long the pause that ended the last turn lasted (the end-of-turn wait).
        self.last_pause_ms = 0.0
        # Speech heard while the reply plays, until it is judged (``backchannel``); and
        # where, on the sample clock, the reply a WebSocket client plays ends at the latest.
        self._candidate: Candidate | None = None
        self._reply_until_ms = 0.0
        # How many backchannels were let pass.
        self.backchannels = 0
        # The VAD failed and has not answered since (its error was sent once).
        self._vad_failing = False
        self.setup()

    def setup(self) -> None:
        """(Re)build the input path for the current input format and turn detection."""
        audio_in = self._context.config.audio.input
        self.format: AudioFormat = audio_in.format
        self.rate = format_rate(audio_in.format)
        self._buffer = InputAudioBuffer(self.rate, self._clock_ms)
        self._policy: TurnPolicy | None = turn_policy(audio_in.turn_detection)
        self._detector = TurnDetector(self._policy) if self._policy is not None else None
        # The VAD hears its chunks at the input rate (it resamples them itself, for all
        # sessions at once); answers for an earlier feed are stale.
        epoch = self._vad.epoch + 1 if self._vad is not None else 0
        self._vad = VadFeed(self._outbox, self.rate, self._vad_chunk_ms, self._clock_ms, epoch)
        self._speech_item_id = None
        self._drop_candidate()
        self._drop_pause()
        self._recognition.stop_turn()

    # ----------------------------------------------------------------- input audio

    def append(self, pcm: npt.NDArray[np.int16]) -> None:
        """Input audio at ``rate``: buffered, and fed to the VAD when turns are detected."""
        overflowing = self._buffer.overflowing
        dropped = self._buffer.append(pcm)
        if dropped:
            self._buffer_full(dropped, overflowing)
        self._clock_ms += len(pcm) * 1000 / self.rate
        if self._detector is not None:
            assert self._vad is not None
            self._vad.push(pcm)
        elif self._speech_item_id is None and len(pcm):
            # Without turn detection the buffer is the turn: the commit will use this item id.
            self._speech_item_id = self._ids.new("item")
            self._speech_start_ms = self._buffer.start_ms
            self._recognition.start_turn(self._speech_item_id, self._speech_start_ms)
        self.recognise_turn()

    def _buffer_full(self, dropped: int, told: bool) -> None:
        """Audio past the buffer's bound was dropped: counted for the driver, and the client
        told once (``told``: already, since the buffer last emptied)."""
        self._outbox.act(CountDroppedAudio(dropped))
        if not told:
            self._outbox.error(
                ProtocolError(
                    f"The input audio buffer holds at most {MAX_BUFFERED_S} seconds of audio; "
                    "audio appended past that is dropped until the buffer is committed or "
                    "cleared.",
                    code="input_audio_buffer_full",
                ),
                None,
            )

    def recognise_turn(self) -> None:
        """A step of the turn being spoken, if one is due."""
        if self._recognition.streaming:
            self._recognition.advance(self._clock_ms, self._buffer.peek, self.rate)

    def commit(self) -> None:
        """``input_audio_buffer.commit``: the whole buffer becomes a user item."""
        if self._buffer.duration_ms < MIN_COMMIT_MS:
            raise ProtocolError(
                "Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{self._buffer.duration_ms:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        item_id = self._speech_item_id or self._ids.new("item")
        self._reset()
        start_ms = self._buffer.start_ms
        self._commit_audio(self._buffer.take_all(), item_id, start_ms=start_ms)

    def clear(self) -> None:
        """``input_audio_buffer.clear``: the buffer and the turn in progress are dropped."""
        self._buffer.clear()
        self._reset()
        self._recognition.stop_turn()
        self._outbox.emit(se.InputAudioBufferCleared())

    def _reset(self) -> None:
        if self._detector is not None:
            self._detector.reset()
        self._speech_item_id = None
        self._drop_candidate()
        self._drop_pause()

    def _commit_audio(
        self,
        pcm: npt.NDArray[np.int16],
        item_id: str,
        pause: Pause | None = None,
        start_ms: float | None = None,
    ) -> None:
        """``pcm`` becomes the user item ``item_id``; ``start_ms``: where it starts on the
        sample clock, when it is the turn recognised as it was spoken."""
        part = Part("input_audio", audio=pcm, audio_format=self.format, rate=self.rate)
        entry = Entry(id=item_id, type="message", role="user", parts=[part])
        previous = self._conversation.insert(entry)
        emit = self._outbox.emit
        emit(se.InputAudioBufferCommitted(previous_item_id=previous, item_id=item_id))
        emit(se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire()))
        emit(se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire()))
        if self._recognition.commit(entry, part, pause, start_ms):
            self._responses.resume_waiting()
        self._responses.limit_audio()

    # ----------------------------------------------------------------- VAD and turns

    def on_vad(self, probability: float, epoch: int) -> None:
        """The VAD's answer for the oldest chunk not yet answered (of this epoch)."""
        self._vad_failing = False
        vad = self._vad
        detector = self._detector
        policy = self._policy
        if vad is None or epoch != vad.epoch or detector is None or policy is None:
            return
        start, end = vad.answered()
        self._vad_now_ms = end
        decision = detector.feed(start, end, probability)
        if decision is not None:
            self._on_turn_event(decision)
        if self._candidate is not None:
            self._judge_candidate(end)
        pause = self._speculation.pause
        if (
            pause is not None
            and pause.asr_request is None
            and end - pause.start_ms >= min(policy.speculate_after_ms, detector.silence_ms)
        ):
            self._recognise_pause(pause)
        if not detector.speaking and self._candidate is None:
            self._buffer.trim_before(end - detector.prefix_padding_ms - 100)
            if self._idle_deadline_ms is not None and end >= self._idle_deadline_ms:
                self._idle_timeout(end)

    def vad_missed(self, epoch: int, error: str | None) -> None:
        """The VAD gave no answer for the oldest chunk not yet answered (of this epoch): no
        decision is made on it, and the next answer is for the chunk after it. It was dropped
        (``error`` None) or the VAD failed: a failure is told to the client once, until the
        VAD answers again; turn detection waits meanwhile rather than hear silence."""
        vad = self._vad
        if vad is not None and epoch == vad.epoch:
            vad.answered()
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

    def _on_turn_event(self, event: TurnEvent) -> None:
        if self._candidate is not None:
            self._candidate_event(event)
        elif event.kind == "speech_started":
            if self._judges_backchannels():
                self._candidate = Candidate(event.ms, self._voice_onset(event.ms))
                # A reply the server plays stops at once while the speech is judged, and goes
                # on from there if it was a backchannel: an interruption is not heard late.
                self._playout.hold()
            else:
                self._speech_started(event.ms)
        elif event.kind == "pause_started":
            self._speculation.pause_started(self._speech_item_id, event.ms)
        elif event.kind == "pause_ended":
            self._drop_pause()
            self.recognise_turn()
        else:
            self._speech_stopped(event.ms)

    # ----------------------------------------------------------------- backchannels

    def _judges_backchannels(self) -> bool:
        """Whether speech starting now is judged before it may interrupt: the policy asks
        for it and the conversation's reply is playing (over WebSocket: its audio is being
        sent, or was sent no longer ago than it lasts). A reply with no audio yet is not
        playing: speech then is a turn, as before."""
        policy = self._policy
        if policy is None or not policy.backchannels or not policy.interrupt_response:
            return False
        return self._reply_playing()

    def _reply_playing(self) -> bool:
        in_band = self._responses.in_band
        return (
            self._playout.plays_in_band
            or self._vad_now_ms < self._reply_until_ms
            or (
                in_band is not None
                and any(
                    part.audio is not None and len(part.audio)
                    for entry in in_band.output
                    for part in entry.parts
                    if part.type == "output_audio"
                )
            )
        )

    def _voice_onset(self, ms: float) -> float:
        """Where the voice of speech reported to start at ``ms`` (prefix padding included)
        began: its length counts from there."""
        policy = self._policy
        assert policy is not None
        return min(ms + policy.prefix_padding_ms, self._vad_now_ms - MIN_SPEECH_MS)

    def _candidate_event(self, event: TurnEvent) -> None:
        """What the detector decides while a candidate is judged: kept, not acted on."""
        candidate = self._candidate
        assert candidate is not None
        if event.kind == "speech_stopped":
            candidate.stopped_ms = event.ms
        elif event.kind in ("speech_started", "pause_ended"):
            # The listener goes on: the words asked for are of an utterance not over yet.
            candidate.stopped_ms = None
            candidate.end_ms = None
            if candidate.request_id is not None:
                self._outbox.act(CancelRecognition(candidate.request_id))
                candidate.request_id = None

    def _judge_candidate(self, now_ms: float) -> None:
        candidate = self._candidate
        detector = self._detector
        assert candidate is not None and detector is not None
        if detector.speaking:
            pause_from = detector.pause_from
        else:
            pause_from = candidate.end_ms if candidate.end_ms is not None else candidate.stopped_ms
        step = candidate.step(now_ms, pause_from)
        if step == "interrupt":
            self._interrupt()
        elif step == "ask":
            self._ask_words(candidate)

    def _ask_words(self, candidate: Candidate) -> None:
        """Recognise the candidate's utterance, ahead of anybody's captions."""
        assert candidate.end_ms is not None
        pcm = self._buffer.peek(candidate.voice_ms - 100, candidate.end_ms)
        audio = resample(pcm, self.rate, self._asr_rate).astype(np.float32) / 32768.0
        transcription = self._context.config.audio.input.transcription
        candidate.request_id = self._ids.new("backchannel")
        self._outbox.act(
            Recognise(
                candidate.request_id,
                RecognitionRequest(
                    audio=audio,
                    language=transcription.language if transcription is not None else None,
                    urgency=Urgency.DECISION,
                ),
            )
        )

    def backchannel_heard(self, request_id: str, transcript: TimedTranscript) -> bool:
        """The words of a candidate (``Recognise`` asked by ``_ask_words``); False when the
        request is not the candidate's."""
        candidate = self._candidate
        if candidate is None or candidate.request_id != request_id:
            return False
        candidate.request_id = None
        # Judged by what was said, even if the reply has ended meanwhile: it began over it.
        if judge_words(transcript.text) == "backchannel":
            self._let_pass(candidate, transcript.text)
        else:
            self._interrupt()
        return True

    def backchannel_failed(self, request_id: str) -> bool:
        """The candidate's words could not be heard: it interrupts. False when the request
        is not the candidate's."""
        candidate = self._candidate
        if candidate is None or candidate.request_id != request_id:
            return False
        candidate.request_id = None
        self._interrupt()
        return True

    def _interrupt(self) -> None:
        """The candidate is a turn after all: it starts (late) where its speech started, and
        what the detector decided meanwhile follows."""
        candidate = self._candidate
        detector = self._detector
        assert candidate is not None and detector is not None
        self._drop_candidate(resume=False)
        self._speech_started(candidate.start_ms)
        if candidate.stopped_ms is not None and not detector.speaking:
            self._speech_stopped(candidate.stopped_ms)
        elif detector.pause_from is not None:
            self._speculation.pause_started(self._speech_item_id, detector.pause_from)

    def _let_pass(self, candidate: Candidate, heard: str) -> None:
        """The candidate was a backchannel: forgotten, and the reply plays on; a client that
        asked (``include``) hears of it."""
        self._candidate = None
        self._playout.resume()
        self.backchannels += 1
        detector = self._detector
        if detector is not None and detector.speaking:
            detector.reset()
        if BACKCHANNELS_INCLUDE in (self._context.config.include or ()):
            assert candidate.end_ms is not None
            self._outbox.emit(
                se.HarkBackchannel(
                    audio_start_ms=int(candidate.start_ms),
                    audio_end_ms=int(candidate.end_ms),
                    transcript=heard.strip(),
                )
            )

    def _drop_candidate(self, resume: bool = True) -> None:
        """Forget the candidate (the buffer was cleared or committed, the input path rebuilt,
        or it interrupts: ``resume`` False, the reply's audio is about to be cleared)."""
        candidate, self._candidate = self._candidate, None
        if candidate is None:
            return
        if candidate.request_id is not None:
            self._outbox.act(CancelRecognition(candidate.request_id))
        if resume:
            self._playout.resume()

    # ----------------------------------------------------------------- turns

    def _speech_started(self, ms: float) -> None:
        policy = self._policy
        assert policy is not None
        self._speech_item_id = self._ids.new("item")
        self._speech_start_ms = max(ms, self._buffer.start_ms)
        self._disarm_idle_timeout()
        self._recognition.start_turn(self._speech_item_id, self._speech_start_ms)
        # The VAD may answer late: a step may be due at once.
        self.recognise_turn()
        self._outbox.emit(
            se.SpeechStarted(
                audio_start_ms=int(self._speech_start_ms), item_id=self._speech_item_id
            )
        )
        if policy.interrupt_response:
            in_band = self._responses.in_band
            if in_band is not None:
                self._responses.end_response(
                    in_band, "cancelled", {"type": "cancelled", "reason": "turn_detected"}
                )
            self._playout.clear(requested=False)

    def _speech_stopped(self, ms: float) -> None:
        policy = self._policy
        assert policy is not None and self._speech_item_id is not None
        item_id, self._speech_item_id = self._speech_item_id, None
        pause = self._speculation.end_pause()
        self.last_pause_ms = ms - pause.start_ms if pause is not None else 0.0
        self._outbox.emit(se.SpeechStopped(audio_end_ms=int(ms), item_id=item_id))
        pcm = self._buffer.take(self._speech_start_ms, ms)
        self._commit_audio(pcm, item_id, pause, self._speech_start_ms)
        if (
            policy.create_response
            and self._context.config.type == "realtime"
            and self._responses.in_band is None
        ):
            self._respond()
        if self._responses.in_band is None:
            # No response for this turn (or it failed at once): nobody adopts the speculation.
            self._speculation.discard()

    def _respond(self) -> None:
        """The conversation's response to the turn just committed."""
        if self._context.config.type == "transcription":
            raise ProtocolError(
                "Transcription sessions do not create responses.", code="invalid_event"
            )
        self._responses.create(ResponseParams(), self._items.response_inputs, self._context.now)

    # ----------------------------------------------------------------- idle timeout

    def arm_idle_timeout(self, after_ms: float, now: float) -> None:
        """The assistant's reply ends ``after_ms`` after wall time ``now`` (OpenAI: the
        ``response.done`` time plus the audio's duration, or when playout stopped): the idle
        timeout counts from there."""
        self._reply_until_ms = self._clock_ms + after_ms
        policy = self._policy
        if policy is not None and policy.idle_timeout_ms is not None:
            self._idle_start_ms = self._clock_ms + after_ms
            self._idle_deadline_ms = self._idle_start_ms + policy.idle_timeout_ms
            self._idle_deadline = now + (after_ms + policy.idle_timeout_ms) / 1000

    def _disarm_idle_timeout(self) -> None:
        self._idle_deadline_ms = self._idle_deadline = None

    @property
    def idle_deadline(self) -> float | None:
        """When the idle timeout is due in wall time (UNIX seconds), if it is armed."""
        return self._idle_deadline

    def handle_timer(self, now: float) -> None:
        """Wall time ``now`` has come: the idle timeout fires if it is due, on the audio
        written so far (a client may have stopped sending)."""
        if self._idle_deadline is not None and now >= self._idle_deadline:
            self._idle_timeout(self._clock_ms)

    def _idle_timeout(self, end_ms: float) -> None:
        """No speech since the reply ended: the audio written since (the silence, as far as
        it was sent, up to ``end_ms``) becomes a user item, and a response follows."""
        self._disarm_idle_timeout()
        policy = self._policy
        if policy is None or policy.idle_timeout_ms is None or self._responses.in_band is not None:
            # Turned off since, or a response is under way: its end arms the timeout again.
            return
        item_id = self._ids.new("item")
        # Reply audio a client was still playing when it stopped sending ends after the last
        # audio written: then the silent segment is empty.
        start_ms = min(self._idle_start_ms, end_ms)
        self._outbox.emit(
            se.InputAudioBufferTimeoutTriggered(
                audio_start_ms=int(start_ms), audio_end_ms=int(end_ms), item_id=item_id
            )
        )
        # As OpenAI does, the segment is committed even when it is empty.
        # Committing creates no response (it may only start those waiting for words): the
        # conversation still has none.
        self._commit_audio(self._buffer.take(start_ms, end_ms), item_id)
        self._respond()

    # ----------------------------------------------------------------- pauses

    def _drop_pause(self) -> None:
        """The user went on (or the turn was reset): speculative work is thrown away."""
        pause = self._speculation.drop_pause()
        if pause is not None:
            self._recognition.forget(pause)

    def _recognise_pause(self, pause: Pause) -> None:
        """Recognise the turn so far while the pause is waited out: up to where the VAD has
        heard, since a word's last sounds are often quieter than its threshold."""
        # With semantic_vad these words decide whether the turn ends: they go before captions.
        decides = self._policy is not None and self._policy.scores_turns
        self._recognition.recognise_pause(
            pause, self._vad_now_ms, self._buffer.peek, self.rate, decides=decides
        )

    def pause_recognised(self, pause: Pause, transcript: str) -> None:
        """Recognition heard ``transcript`` in ``pause``: if the turn is still in that pause,
        with a policy that scores turns the end-of-turn model is asked how complete the words
        sound, and a reply is speculated on them. The verdict goes first, and is not held
        back for the reply: it decides when the turn ends, the reply is only speculative."""
        if pause is not self._speculation.pause:
            return
        pause.transcript = transcript
        if self._policy is not None and self._policy.scores_turns:
            self._outbox.act(ScoreTurn(pause.key, transcript, self._last_assistant_text()))
        self._speculate_reply(pause)

    def _speculate_reply(self, pause: Pause) -> None:
        """Start the reply the turn would get if it ended now; it stays unseen until it does."""
        policy = self._policy
        if (
            policy is None
            or not policy.create_response
            or self._context.config.type != "realtime"
            or self._responses.in_band is not None
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
        response = self._responses.new_response(ResponseParams(), response_id="")
        entries = [*self._conversation.entries(), turn]
        self._speculation.speculate(pause, self._responses.generate_action(response, entries))

    def _last_assistant_text(self) -> str | None:
        for entry in reversed(self._conversation.entries()):
            if entry.type == "message" and entry.role == "assistant":
                return " ".join(p.transcript or p.text or "" for p in entry.parts).strip() or None
        return None

    def on_turn_score(self, key: str, probability: float) -> None:
        """How complete the utterance of the pause ``key`` sounds (``semantic_vad``): the
        silence that ends the turn follows, and may already have passed."""
        policy = self._policy
        pause = self._speculation.pause
        if pause is None or pause.key != key or self._detector is None or policy is None:
            return
        if not policy.scores_turns:
            return
        self._detector.silence_ms = policy.silence_after(probability)
        decision = self._detector.check(self._vad_now_ms)
        if decision is not None:
            self._on_turn_event(decision)

    def on_turn_score_failed(self, key: str) -> None:
        """The end-of-turn model failed on the pause ``key``: the pause ends as an unjudged
        one does (``TurnPolicy.silence_ms``), which it may already have passed."""
        pause = self._speculation.pause
        if pause is None or pause.key != key or self._detector is None:
            return
        self._detector.silence_ms = self._detector.default_silence_ms
        decision = self._detector.check(self._vad_now_ms)
        if decision is not None:
            self._on_turn_event(decision)

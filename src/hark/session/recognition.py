"""Recognition: speech recognition in flight, and transcripts onto the user's items.

A turn being spoken is recognised in steps as its audio arrives (``Recognise``): the commit
policy (``local_agreement``) says which words are settled, and those go out as transcription
deltas on the item the turn will become. A pause is recognised at once on the chance that it
ends the turn (a speculative step); if the turn ends there its result completes the
transcript, and if the speaker goes on it is cancelled. Otherwise a final step at the turn's
end decodes what is left. Audio that is not a turn (an item created with audio, the idle
timeout's buffer) is recognised whole (``Transcribe``).

No audio is skipped when steps fall behind: a step decodes from where the policy's window
starts, and when that is longer ago than the engine hears, from its start onwards, and the
words it settles move the window up for the next. At the turn's end, such a backlog is
decoded in several windows in order, each prompted with the words before it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from hark.audio.resample import StreamResampler, resample
from hark.engines.asr import RecognitionRequest, TimedTranscript, TimedWord, Urgency
from hark.protocol import server_events as se
from hark.protocol.session_config import Transcription
from hark.session.actions import CancelRecognition, Recognise, Transcribe
from hark.session.context import SessionContext, SessionPart
from hark.session.conversation import Entry, Part
from hark.session.local_agreement import (
    DEFAULT_DELAY,
    DELAYS,
    DelayName,
    LocalAgreement,
    text_of,
)
from hark.session.speculation import Pause

Pcm = npt.NDArray[np.int16]
# Reads the input buffer: the audio in [start_ms, end_ms) on the session clock.
Peek = Callable[[float, float], Pcm]
# A word's log probability when the engine does not know it.
_UNKNOWN_LOGPROB = 0.0
# The most audio one step decodes (``RecognitionRequest``: Whisper hears 30 s).
_MAX_WINDOW_MS = 30_000
# A probability the decoder rounded to zero still has a finite log.
_SMALLEST_P = 1e-12
# A window's end not yet released by the turn's stream resampler is resampled on its own from
# this much earlier, where the edge of that resampling has died away.
_SEAM_GUARD_S = 0.04
_INT16_SCALE = np.float32(1 / 32768)
# The turn's words are offered to the LLM (``StepHeard.read_ahead``) first as soon as a step
# hears any, then each time they reach this much further into the turn: often enough that
# little is left to read when it ends, seldom enough that the reading costs little.
PREFILL_EVERY_S = 1.0
# Without input transcription nobody reads captions: the turn is stepped only as often as the
# LLM reads ahead (a step a ``PREFILL_EVERY_S``), two of every five steps of the default
# delay saved (each is a model call: about 0.2 s of a core for a 2 s window of Whisper tiny).
_UNCAPTIONED_DELAY: DelayName = "medium"


@dataclass(slots=True)
class _Step:
    """A step in flight: what it decodes, in seconds from the turn's start."""

    kind: Literal["caption", "pause", "final"]
    window_start: float
    window_end: float
    pause: Pause | None = None
    # False when the window stops short of the audio asked for (longer than the engine
    # hears): the step catches up, and another is needed for the rest.
    whole: bool = True
    # A pause step's words as judged before their times came (``recognised_text``).
    said: str | None = None


class _TurnAudio:
    """The turn being spoken at the ASR's rate, resampled once as its steps ask for more.

    Each caption step decodes the turn from its window's start: resampling that window again
    at every step cost more of the server's CPU than the VAD's own share of a session (a
    fifth at 150 sessions sending 100 ms appends). A stream resampler takes each stretch of
    the input once. It holds back its last few dozen milliseconds (over a hundred from 8 kHz),
    which each read resamples on its own from a little before, so that a window ends where it
    is asked to, as the window resampled whole would.
    """

    def __init__(self, start_ms: float, rate: int, asr_rate: int) -> None:
        """``start_ms``: the turn's first sample on the session clock; ``rate``: the input's."""
        self.start_ms = start_ms
        self.rate = rate
        self._asr_rate = asr_rate
        # Input and output sample counts that span the same time exactly.
        common = math.gcd(rate, asr_rate)
        self._in_step, self._out_step = rate // common, asr_rate // common
        self._guard = math.ceil(_SEAM_GUARD_S * asr_rate / self._out_step)
        self._resampler = StreamResampler(rate, asr_rate)
        # Input samples fed to the resampler, from the turn's start.
        self._fed = 0
        # The output released so far: self._out[:self._released - self._base], where
        # self._base is the turn's output index of self._out[0] (the window's start only
        # moves on, so what is before it is let go).
        self._out = np.empty(2 * asr_rate, np.float32)
        self._base = 0
        self._released = 0

    def _ms(self, sample: int) -> float:
        return self.start_ms + sample * 1000 / self.rate

    def read(self, peek: Peek, start_ms: float, end_ms: float) -> npt.NDArray[np.float32]:
        """The turn's audio in ``[start_ms, end_ms)`` at the ASR's rate, as float32 in [-1, 1]
        (a new array); ``peek`` reads the input there."""
        in_first = max(0, round((start_ms - self.start_ms) * self.rate / 1000))
        in_end = round((end_ms - self.start_ms) * self.rate / 1000)
        if in_end > self._fed:
            pcm = peek(self._ms(self._fed), self._ms(in_end))
            self._fed += len(pcm)
            self._keep(self._resampler.process(pcm.astype(np.float32) * _INT16_SCALE))
        out_first = round(in_first * self._asr_rate / self.rate)
        self._let_go(out_first)
        # The seam, where the one-shot end takes over: on a whole span of both rates.
        seam = min(self._released, round(in_end * self._asr_rate / self.rate))
        seam -= seam % self._out_step
        span = seam // self._out_step
        if seam <= out_first or span < self._guard:
            # Little or nothing released: the window resampled whole.
            whole = peek(self._ms(in_first), self._ms(in_end)).astype(np.float32)
            return resample(whole * _INT16_SCALE, self.rate, self._asr_rate)
        lead = (span - self._guard) * self._in_step
        tail = peek(self._ms(lead), self._ms(in_end)).astype(np.float32) * _INT16_SCALE
        ending = resample(tail, self.rate, self._asr_rate)[self._guard * self._out_step :]
        released = self._out[out_first - self._base : seam - self._base]
        return np.concatenate((released, ending))

    def _keep(self, out: npt.NDArray[np.float32]) -> None:
        held = self._released - self._base
        if held + len(out) > len(self._out):
            grown = np.empty(max(2 * len(self._out), held + len(out)), np.float32)
            grown[:held] = self._out[:held]
            self._out = grown
        self._out[held : held + len(out)] = out
        self._released += len(out)

    def _let_go(self, before: int) -> None:
        """Forget the output before the turn's output index ``before`` once it is a good
        share of what is kept."""
        drop = min(before, self._released) - self._base
        if drop <= self._asr_rate or 2 * drop < self._released - self._base:
            return
        held = self._released - self._base
        self._out[: held - drop] = self._out[drop:held]
        self._base += drop


@dataclass(slots=True)
class _Stream:
    """The incremental recognition of one turn."""

    item_id: str
    # The turn's first sample on the session clock.
    start_ms: float
    step_ms: float
    policy: LocalAgreement
    # The end of the audio the latest caption step decoded (session clock).
    stepped_ms: float
    steps: int = 0
    caption: str | None = None
    # The pause being recognised (a speculative step, ``pause.asr_request``), until the
    # speaker goes on.
    pause: Pause | None = None
    # The pause step's words not yet committed, once its result is in.
    pause_rest: list[TimedWord] | None = None
    # Once the turn is an item: the item's audio part, waiting for its last words.
    part: Part | None = None
    # Seconds of audio the item has (its audio may be dropped before the words come).
    seconds: float = 0.0
    # Committed words already sent as deltas.
    sent: int = 0
    # The turn ended in a pause whose words were in and whose times were not: the item was
    # heard with those words (the reply reads them), and its transcript waits for the times.
    heard_early: bool = False
    # Where the words offered to the LLM ended (turn seconds); None before the first offer.
    offered_s: float | None = None
    # Once the turn is an item: its audio on the session clock, for the final steps.
    peek: Peek | None = None
    end_ms: float = 0.0
    rate: int = 0
    requests: set[str] = field(default_factory=set)
    # The turn's audio as the ASR hears it, while it is being spoken.
    audio: _TurnAudio | None = None
    # The language the engine last heard the turn in.
    language: str | None = None


@dataclass(frozen=True, slots=True)
class StepHeard:
    """What a step's result means beyond the events it sent, for the parts that react to it
    (at most one of these): ``pause``, a pause's step: the pause and the turn's words up to
    it; ``read_ahead``, the turn's committed words, grown far enough for the LLM to read
    ahead; ``heard``, the ended turn's item has its words, so responses waiting for them may
    start."""

    pause: tuple[Pause, str] | None = None
    read_ahead: str | None = None
    heard: bool = False


_NOTHING = StepHeard()
_HEARD = StepHeard(heard=True)


# The opt-in (session ``include``) for logprobs on input transcription events.
LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"


class Recognition(SessionPart):
    """Requests the ASR engine works on, each for a user item, a step of the turn being
    spoken, or a pause of it, and what their results do.

    ``context`` holds the session's outbox, conversation and configuration: its
    ``audio.input.transcription`` (None: the client did not ask for transcripts, and the
    words are only the LLM's), and whether the client asked for logprobs (``include``).
    What a request's end means for the responses is returned to the caller, who tells them:
    whether an item's words became known (responses waiting for them can start), which item's
    words could not be heard (responses waiting for them fail instead), and a step's
    read-ahead words (``StepHeard``).
    """

    def __init__(self, context: SessionContext, asr_rate: int) -> None:
        super().__init__(context)
        self._asr_rate = asr_rate
        # Whole-item requests: request id → the item and the part it is for. The entry is
        # held, not looked up: an item of ``response.create``'s ``input`` is in no conversation.
        self._requests: dict[str, tuple[Entry, Part]] = {}
        # Steps in flight: request id → the stream and what the step decodes.
        self._steps: dict[str, tuple[_Stream, _Step]] = {}
        # The turn being spoken, if any.
        self._live: _Stream | None = None

    @property
    def _transcription(self) -> Transcription | None:
        return self._context.config.audio.input.transcription

    @property
    def _logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self._context.config.include or ())

    def _audio(self, pcm: Pcm, rate: int) -> npt.NDArray[np.float32]:
        return resample(pcm, rate, self._asr_rate).astype(np.float32) / 32768.0

    def _transcribe(self, request_id: str, pcm: Pcm, rate: int) -> None:
        transcription = self._transcription
        self._outbox.act(
            Transcribe(
                request_id=request_id,
                audio=self._audio(pcm, rate),
                language=_language(transcription),
                prompt=_hints(transcription),
                languages=_allowed(transcription),
            )
        )

    def recognise(self, entry: Entry, part: Part) -> bool:
        """Recognise an item's audio part whole: an item of the conversation, or one of a
        response's own ``input``, whose words only that response reads. Returns whether its
        words are known at once (there was nothing to hear)."""
        assert part.audio is not None
        if not len(part.audio):
            # Nothing to hear (the idle timeout commits its segment even when empty).
            self._heard(entry, part, "", 0.0)
            return True
        index = _index_of(entry, part)
        request_id = entry.id if index == 0 else f"{entry.id}:{index}"
        self._requests[request_id] = (entry, part)
        self._transcribe(request_id, part.audio, part.rate)
        return False

    def abandon(self, entry: Entry) -> None:
        """Nobody waits for ``entry``'s words any more (a response's own input, the response
        ended): its requests still running are cancelled. An item of the conversation is
        left alone, as its transcript is the client's."""
        if self._in_conversation(entry):
            return
        for request_id, (held, _) in list(self._requests.items()):
            if held is entry:
                del self._requests[request_id]
                self._outbox.act(CancelRecognition(request_id))

    def _in_conversation(self, entry: Entry) -> bool:
        """Whether ``entry`` is an item of the conversation (the client hears of its words)."""
        return entry.id in self._conversation and self._conversation.get(entry.id) is entry

    # ----------------------------------------------------------------- the turn being spoken

    @property
    def streaming(self) -> bool:
        """Whether a turn is being recognised as it is spoken."""
        return self._live is not None

    def start_turn(self, item_id: str, start_ms: float) -> None:
        """A turn began at ``start_ms`` (session clock); it will become ``item_id``."""
        self.stop_turn()
        transcription = self._transcription
        if transcription is None:
            delay = DELAYS[_UNCAPTIONED_DELAY]
        else:
            delay = DELAYS[transcription.delay or DEFAULT_DELAY]
        self._live = _Stream(
            item_id=item_id,
            start_ms=start_ms,
            step_ms=delay.step_s * 1000,
            policy=LocalAgreement(delay.agreement),
            stepped_ms=start_ms,
        )

    def stop_turn(self) -> None:
        """The turn was dropped (cleared, or the input path rebuilt): its steps are of no use."""
        stream, self._live = self._live, None
        if stream is not None:
            for request_id in list(stream.requests):
                self._cancel(stream, request_id)

    def advance(self, end_ms: float, peek: Peek, rate: int) -> None:
        """The turn's audio now reaches ``end_ms``: a caption step when one is due (a step
        interval of new audio, none in flight, no pause being recognised)."""
        stream = self._live
        if (
            stream is None
            or stream.caption is not None
            or stream.pause is not None
            or end_ms - stream.stepped_ms < stream.step_ms
        ):
            return
        stream.stepped_ms = end_ms
        stream.caption = self._step(stream, "caption", end_ms, peek, rate, Urgency.CAPTION)

    def recognise_pause(
        self, pause: Pause, end_ms: float, peek: Peek, rate: int, *, decides: bool = False
    ) -> None:
        """Recognise the turn up to ``end_ms``, in its pause, while the pause is waited out;
        no new caption step starts until the speaker goes on. The caption step in flight (if
        any) goes on: on a loaded machine it has waited its turn, and a pause every sentence
        would otherwise cancel every caption. ``decides``: the words decide whether the turn
        ends (``semantic_vad``), so the step goes before captions (``Urgency.DECISION``);
        otherwise it is speculation, after them."""
        stream = self._live
        if stream is None:
            # Only a turn being spoken pauses: nothing to recognise.
            pause.asr_request = ""
            return
        stream.pause = pause
        stream.pause_rest = None
        urgency = Urgency.DECISION if decides else Urgency.SPECULATION
        pause.asr_request = self._step(
            stream, "pause", end_ms, peek, rate, urgency, pause, text_first=decides
        )

    def forget(self, pause: Pause) -> None:
        """The pause is over without a turn (the speaker went on): its step is cancelled."""
        stream = self._live
        if stream is None or stream.pause is not pause:
            return
        self._cancel_pause_step(stream)
        stream.pause = stream.pause_rest = None

    def _step(
        self,
        stream: _Stream,
        kind: Literal["caption", "pause", "final"],
        end_ms: float,
        peek: Peek,
        rate: int,
        urgency: Urgency,
        pause: Pause | None = None,
        *,
        text_first: bool = False,
    ) -> str:
        """Start a step decoding the turn up to ``end_ms``; ``text_first``: its words are
        awaited before their times (a pause's that decide the turn's end), and come first
        unless the window is a backlog's, whose words settle only with their times."""
        policy = stream.policy
        start_ms = stream.start_ms + policy.window_start * 1000
        # Steps that fell behind leave more audio than the engine hears: decode its beginning
        # now (the policy settles the words there) and the rest in the steps after.
        whole = end_ms - start_ms <= _MAX_WINDOW_MS
        if not whole:
            end_ms = start_ms + _MAX_WINDOW_MS
        transcription = self._transcription
        stream.steps += 1
        request_id = f"{stream.item_id}:{kind}{stream.steps}"
        context = [_hints(transcription), policy.prompt()]
        if stream.part is None:
            if stream.audio is None or stream.audio.rate != rate:
                stream.audio = _TurnAudio(stream.start_ms, rate, self._asr_rate)
            audio = stream.audio.read(peek, start_ms, end_ms)
        else:
            audio = self._audio(peek(start_ms, end_ms), rate)
        self._outbox.act(
            Recognise(
                request_id,
                RecognitionRequest(
                    audio=audio,
                    prompt=" ".join(c for c in context if c) or None,
                    language=_language(transcription),
                    urgency=urgency,
                    languages=_allowed(transcription),
                ),
                text_first=text_first and whole,
            )
        )
        window = _Step(
            kind,
            (start_ms - stream.start_ms) / 1000,
            (end_ms - stream.start_ms) / 1000,
            pause,
            whole,
        )
        self._steps[request_id] = (stream, window)
        stream.requests.add(request_id)
        return request_id

    def _cancel_pause_step(self, stream: _Stream) -> None:
        request_id = stream.pause.asr_request if stream.pause is not None else None
        if request_id in self._steps:
            assert request_id is not None
            self._cancel(stream, request_id)

    def _cancel(self, stream: _Stream, request_id: str) -> None:
        self._steps.pop(request_id, None)
        stream.requests.discard(request_id)
        if stream.caption == request_id:
            stream.caption = None
        self._outbox.act(CancelRecognition(request_id))

    # ----------------------------------------------------------------- the turn becomes an item

    def commit(
        self, entry: Entry, part: Part, pause: Pause | None, start_ms: float | None = None
    ) -> bool:
        """The turn became ``entry``, whose audio ``part`` starts at ``start_ms`` on the
        session clock: its words are the committed ones and the pause step's (if it ran and
        the turn ended in that pause), or those of a final step; audio that was not
        recognised as it was spoken is recognised whole. Returns whether its words are known
        already."""
        stream = self._live
        if stream is None or stream.item_id != entry.id or start_ms is None:
            return self.recognise(entry, part)
        self._live = None
        assert part.audio is not None
        audio = part.audio
        stream.part = part
        stream.audio = None
        stream.seconds = len(audio) / part.rate
        stream.end_ms = start_ms + len(audio) * 1000 / part.rate
        stream.rate = part.rate

        def peek(first: float, last: float) -> Pcm:
            index = round((first - start_ms) * part.rate / 1000)
            return audio[max(0, index) : round((last - start_ms) * part.rate / 1000)]

        stream.peek = peek
        if stream.caption is not None:
            self._cancel(stream, stream.caption)
        if pause is not None and pause is stream.pause and stream.pause_rest is not None:
            # Recognised while the end of the turn was waited out: the words are known already.
            stream.policy.accept(stream.pause_rest)
            return self._finish(stream)
        if not (pause is not None and pause is stream.pause and pause.asr_request in self._steps):
            # No pause step under way to complete this item's transcript: a final step does.
            self._cancel_pause_step(stream)
            self._final_step(stream)
            return False
        said = self._steps[pause.asr_request][1].said
        if said is None:
            return False
        # The pause's words are in, their times are not: they are the turn's words, the
        # ones judged and replied to, so the reply need not wait for the times (which wait
        # while other models compute what someone waits for: ``Urgency.TIMES``).
        part.heard = said
        stream.heard_early = True
        return True

    def _final_step(self, stream: _Stream) -> None:
        """Decode what is left of the ended turn (or its next window, when much is left)."""
        assert stream.peek is not None
        self._step(stream, "final", stream.end_ms, stream.peek, stream.rate, Urgency.ANSWER)

    # ----------------------------------------------------------------- results

    def recognised_text(self, request_id: str, words: Sequence[str]) -> StepHeard:
        """A pause step's ``words`` before their times: the pause and the turn's words up to
        it (``StepHeard.pause``) if the turn is still in that pause, so that they are judged
        and replied to now; the step stays in flight for its times (``recognised``)."""
        found = self._steps.get(request_id)
        if found is None:
            return _NOTHING
        stream, step = found
        if step.pause is None or stream.part is not None or stream.pause is not step.pause:
            return _NOTHING
        if stream.caption is not None:
            # The caption step still in flight decodes less than this one did: of no use.
            self._cancel(stream, stream.caption)
        policy = stream.policy
        tail = policy.tail_words(words, step.window_start)
        step.said = " ".join(w.strip() for w in (text_of(policy.committed), *tail) if w.strip())
        return StepHeard(pause=(step.pause, step.said))

    def recognised(self, request_id: str, transcript: TimedTranscript) -> StepHeard:
        """A step's hypothesis; returns what it means for the turn and the responses (see
        ``StepHeard``): the pause and its words when it was a pause's step and the turn is
        still in that pause."""
        found = self._steps.pop(request_id, None)
        if found is None:
            return _NOTHING
        stream, step = found
        stream.requests.discard(request_id)
        if transcript.language:
            stream.language = transcript.language
        policy = stream.policy
        if stream.caption == request_id:
            stream.caption = None
        if not step.whole:
            # A window of a backlog (steps fell behind): the words it holds whole are settled
            # as they stand, and the rest is decoded next; a pause step's words are not the
            # turn's yet.
            policy.settle(transcript, step.window_start, step.window_end)
            self._send_committed(stream)
            # The next caption step is due at once: the audio past this window is not heard.
            stream.stepped_ms = min(stream.stepped_ms, stream.start_ms + step.window_end * 1000)
            if stream.part is not None:
                self._final_step(stream)
                return _NOTHING
            return self._offer(stream)
        if stream.part is not None:
            # The turn has ended and waited for this step: its words are the last.
            policy.finish(transcript, step.window_start)
            return _HEARD if self._finish(stream) else _NOTHING
        if step.kind == "caption":
            tail = policy.tail(transcript, step.window_start)
            committed = policy.hypothesis(transcript, step.window_start, step.window_end)
            self._send_committed(stream)
            return self._offer(stream, tail[len(committed) :])
        assert step.pause is not None
        if stream.caption is not None:
            # The caption step still in flight decodes less than this one did: of no use.
            self._cancel(stream, stream.caption)
        tail = policy.tail(transcript, step.window_start)
        words = text_of([*policy.committed, *tail])
        committed = policy.hypothesis(transcript, step.window_start, step.window_end)
        stream.pause_rest = tail[len(committed) :]
        # No read-ahead here: the reply speculated on these words reads them now.
        self._send_committed(stream)
        if words == step.said:
            # Judged and replied to already, as they came before their times.
            return _NOTHING
        return StepHeard(pause=(step.pause, words))

    def _offer(self, stream: _Stream, pending: Sequence[TimedWord] = ()) -> StepHeard:
        """The turn's words for the LLM to read ahead: the committed ones and those of the
        latest hypothesis ``pending`` but its last (the one the next audio most often
        changes). The first words are offered at once, so that a short question has its
        beginning read before its pause; then each time they reach ``PREFILL_EVERY_S``
        further into the turn. A hypothesis word that changes after it was read costs the
        LLM a re-read from there, as the reply reads the turn anyway."""
        if stream is not self._live:
            return _NOTHING
        words = [*stream.policy.committed, *pending[:-1]]
        if not words:
            return _NOTHING
        end = words[-1].end
        if stream.offered_s is not None and end - stream.offered_s < PREFILL_EVERY_S:
            return _NOTHING
        stream.offered_s = end
        return StepHeard(read_ahead=text_of(words))

    def _send_committed(self, stream: _Stream) -> None:
        """Committed words not sent yet go out as one delta (with transcription on)."""
        words = stream.policy.committed[stream.sent :]
        if not words or self._transcription is None:
            return
        first = stream.sent == 0
        delta = text_of(words) if first else " " + text_of(words)
        stream.sent += len(words)
        logprobs = _logprobs(words, first=first) if self._logprobs else None
        self._outbox.emit(
            se.InputTranscriptionDelta(
                item_id=stream.item_id, content_index=0, delta=delta, logprobs=logprobs
            )
        )

    def _finish(self, stream: _Stream) -> bool:
        """The ended turn's words are all in: its item is transcribed; returns whether it was
        (it may be gone, or heard already)."""
        part = stream.part
        assert part is not None
        self._send_committed(stream)
        early, stream.heard_early = stream.heard_early, False
        if stream.item_id not in self._conversation or (part.heard is not None and not early):
            return False
        entry = self._conversation.get(stream.item_id)
        words = stream.policy.committed
        self._transcribed(
            entry,
            part,
            text_of(words),
            stream.seconds,
            _logprobs(words, first=True) if self._logprobs else None,
            stream.language,
        )
        # Heard early, the words were known already.
        return not early

    def _transcribed_early(self, stream: _Stream) -> None:
        """The item heard early has its transcript: the words it was heard with."""
        part = stream.part
        if part is None or part.heard is None or stream.item_id not in self._conversation:
            return
        entry = self._conversation.get(stream.item_id)
        self._transcribed(entry, part, part.heard, stream.seconds, heard_in=stream.language)

    def _pending_part(self, item_id: str) -> tuple[Entry, Part] | None:
        if item_id not in self._conversation:
            return None
        entry = self._conversation.get(item_id)
        part = next((p for p in entry.parts if p.type == "input_audio" and p.heard is None), None)
        return None if part is None else (entry, part)

    def delta(self, request_id: str, delta: str) -> None:
        """A piece of a whole item's transcript."""
        request = self._requests.get(request_id)
        if request is None or self._transcription is None:
            return
        entry, part = request
        if part.heard is None and self._in_conversation(entry):
            self._outbox.emit(
                se.InputTranscriptionDelta(
                    item_id=entry.id, content_index=_index_of(entry, part), delta=delta
                )
            )

    def done(
        self, request_id: str, transcript: str, audio_seconds: float, language: str | None = None
    ) -> bool:
        """A whole item's transcript, and the language the engine heard it in if it said;
        returns whether an item's words became known by it."""
        request = self._requests.pop(request_id, None)
        if request is None or request[1].heard is not None:
            return False
        entry, part = request
        self._heard(entry, part, transcript, audio_seconds, language)
        return True

    def _heard(
        self,
        entry: Entry,
        part: Part,
        transcript: str,
        seconds: float,
        language: str | None = None,
    ) -> None:
        """A whole item's words: the client hears of those of an item of the conversation;
        a response's own ``input`` only has them."""
        if self._in_conversation(entry):
            self._transcribed(entry, part, transcript, seconds, heard_in=language)
        else:
            part.heard = transcript

    def _transcribed(
        self,
        entry: Entry,
        part: Part,
        transcript: str,
        seconds: float,
        logprobs: list[se.LogProb] | None = None,
        heard_in: str | None = None,
    ) -> None:
        """``heard_in``: the language the engine heard, when it said."""
        part.heard = transcript
        transcription = self._transcription
        if transcription is not None:
            part.transcript = transcript
            language = heard_in or _language(transcription)
            self._outbox.emit(
                se.InputTranscriptionCompleted(
                    item_id=entry.id,
                    content_index=_index_of(entry, part),
                    transcript=transcript,
                    usage={"type": "duration", "seconds": round(seconds, 3)},
                    logprobs=logprobs,
                    languages=[{"code": language}] if language else None,
                )
            )

    def failed(self, request_id: str, message: str) -> Entry | None:
        """Recognition failed: a caption step is tried again with the next audio; an item
        whose words depended on the request gets none, and is returned: the responses waiting
        for its words must fail rather than answer words nobody heard."""
        found = self._steps.pop(request_id, None)
        if found is not None:
            stream = found[0]
            stream.requests.discard(request_id)
            if stream.caption == request_id:
                stream.caption = None
            if stream.part is None:
                return None
            self._send_committed(stream)
            if stream.heard_early:
                # Only the times failed: the words the reply read are the transcript.
                stream.heard_early = False
                self._transcribed_early(stream)
                return None
            pending = self._pending_part(stream.item_id)
        else:
            pending = self._requests.pop(request_id, None)
        if pending is None or pending[1].heard is not None:
            return None
        entry, part = pending
        part.heard = ""
        if self._transcription is not None and self._in_conversation(entry):
            self._outbox.emit(
                se.InputTranscriptionFailed(
                    item_id=entry.id,
                    content_index=_index_of(entry, part),
                    error={
                        "type": "server_error",
                        "code": "transcription_failed",
                        "message": message,
                        "param": None,
                    },
                )
            )
        return entry


def _index_of(entry: Entry, part: Part) -> int:
    """Where ``part`` is in ``entry``'s content (by identity: parts hold arrays)."""
    return next(i for i, p in enumerate(entry.parts) if p is part)


def _logprobs(words: list[TimedWord], *, first: bool) -> list[se.LogProb]:
    """One entry per word, its token as the transcript spells it (with the space before it,
    except for the transcript's first word)."""
    entries: list[se.LogProb] = []
    for index, word in enumerate(words):
        token = word.word.strip()
        if index or not first:
            token = " " + token
        p = word.probability
        logprob = math.log(max(p, _SMALLEST_P)) if p is not None else _UNKNOWN_LOGPROB
        entries.append(se.LogProb(token=token, logprob=logprob, bytes=list(token.encode())))
    return entries


def _language(transcription: Transcription | None) -> str | None:
    """The language the engine is told to hear: ``language``, else the one language
    ``languages`` allows (with several, the engine tells which it hears)."""
    if transcription is None:
        return None
    if transcription.language:
        return transcription.language
    languages = transcription.languages or []
    return languages[0] if len(languages) == 1 else None


def _allowed(transcription: Transcription | None) -> tuple[str, ...]:
    """The languages the engine may tell between, when the session fixes none: those of
    ``languages`` (several; none means any)."""
    if transcription is None or _language(transcription) is not None:
        return ()
    return tuple(transcription.languages or ())


def _hints(transcription: Transcription | None) -> str | None:
    """What the recogniser is prompted with: the client's ``prompt``, then its ``keywords``
    (Whisper takes the words of its prompt as likely, OpenAI's advice for ``whisper-1``)."""
    if transcription is None:
        return None
    keywords = ", ".join(k for k in transcription.keywords or () if k.strip())
    hints = [h for h in (transcription.prompt, keywords) if h]
    return " ".join(hints) or None

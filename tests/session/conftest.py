"""A sample-clock driver for the sans-I/O session core."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.engines.asr import TimedSegment, TimedTranscript, TimedWord, Urgency
from hark.engines.llm import Finished
from hark.protocol.limits import SESSION_LIMIT_S
from hark.protocol.server_events import ServerEvent, encode_event
from hark.protocol.session_config import SessionConfig
from hark.session.actions import (
    Action,
    AdoptSpeculation,
    AnalyzeSpeech,
    DiscardSpeculation,
    Generate,
    Recognise,
    ScoreTurn,
    Speculate,
    Transcribe,
)
from hark.session.core import AUDIO_RETENTION_S, Session
from hark.session.ids import IdGenerator
from hark.session.results import (
    AudioGenerated,
    GenerationFinished,
    Recognised,
    RecognisedText,
    Result,
    TranscriptionDone,
    TurnScored,
    VadScored,
)

RATE = 24000
# The engines' facts the core is given: Silero's chunk and Whisper's rate.
VAD_CHUNK_MS = 32
ASR_RATE = 16000


def voiced(ms: int, rate: int = RATE) -> npt.NDArray[np.int16]:
    """A loud harmonic tone standing in for speech."""
    t = np.arange(rate * ms // 1000) / rate
    wave = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.1 * np.sin(2 * np.pi * 720 * t)
    return (wave * 32767).astype(np.int16)


def silence(ms: int, rate: int = RATE) -> npt.NDArray[np.int16]:
    """Digital silence."""
    return np.zeros(rate * ms // 1000, np.int16)


def timed(
    text: str, seconds: float, start: float = 0.0, probability: float = 0.9
) -> TimedTranscript:
    """What an engine hears in a window of ``seconds``: ``text``'s words spread evenly from
    ``start`` (seconds into the window) to its end, one segment."""
    heard = text.split()
    step = (seconds - start) / len(heard) if heard else 0.0
    words = tuple(
        TimedWord(f" {w}", start + i * step, start + (i + 1) * step, probability)
        for i, w in enumerate(heard)
    )
    segments = (TimedSegment(start, seconds, text.strip()),) if heard else ()
    return TimedTranscript(segments, "en", seconds, words)


def energy_probability(chunk: npt.NDArray[np.int16]) -> float:
    """The tests' stand-in for the VAD model: loud chunks are speech.

    The real Silero model is tested in tests/engines and end to end; here the subject is the
    state machine, so the probabilities must be exactly predictable.
    """
    samples = chunk.astype(np.float32) / 32768
    return 1.0 if float(np.sqrt(np.mean(samples**2))) > 0.05 else 0.0


class Driver:
    """Feeds a Session and records its events and actions, answering VAD requests in order.

    An adopted speculation is recorded twice: as the ``AdoptSpeculation`` and as the
    ``Generate`` the engines then run for the response (the speculated one under the
    response's id), as a runner does; tests of the engines' part take the ``Generate``.
    """

    def __init__(
        self,
        config: SessionConfig | None = None,
        created_at: float = 1000.0,
        plays_audio: bool = False,
        audio_retention_s: float = AUDIO_RETENTION_S,
        max_duration_s: float = SESSION_LIMIT_S,
        vad_chunk_ms: int = VAD_CHUNK_MS,
        asr_rate: int = ASR_RATE,
    ) -> None:
        self.session = Session(
            model="gpt-realtime",
            config=config,
            ids=IdGenerator(seed=7),
            created_at=created_at,
            plays_audio=plays_audio,
            audio_retention_s=audio_retention_s,
            max_duration_s=max_duration_s,
            vad_chunk_ms=vad_chunk_ms,
            asr_rate=asr_rate,
        )
        # The wall time handed to the core with each input: it moves with the audio sent, as
        # it would for a client streaming in real time.
        self.now = created_at
        self.asr_rate = asr_rate
        self.vad_chunk_sizes: set[int] = set()
        self.events: list[dict[str, Any]] = []
        self.actions: list[Action] = []
        # When set, recognition and end-of-turn scoring are answered at once with these (see
        # ``ANSWERS``).
        self.asr_text: str | None = None
        self.turn_score: float | None = None
        # The replies speculated and not yet adopted or discarded, by key.
        self.speculations: dict[str, Generate] = {}
        self.session.start()
        self.pump()

    def pump(self) -> list[dict[str, Any]]:
        """Collect outputs: server events are returned, and each action is answered with the
        results ``ANSWERS`` maps it to (recorded, unless it is a VAD request)."""
        new: list[dict[str, Any]] = []
        while out := self.session.drain():
            for item in out:
                if isinstance(item, ServerEvent):
                    new.append(json.loads(encode_event(item)))
                    continue
                answer = ANSWERS.get(type(item))
                if answer is None:
                    self.actions.append(item)
                    continue
                for result in answer(self, item):
                    self.session.handle(result, now=self.now)
        self.events.extend(new)
        return new

    def advance(self, seconds: float) -> list[dict[str, Any]]:
        """Move the wall time on, firing the core's timer as a driver does when its deadline
        passes."""
        self.now += seconds
        deadline = self.session.next_deadline()
        if deadline is not None and deadline <= self.now:
            self.session.handle_timer(self.now)
            return self.pump()
        return []

    def send(self, event: dict[str, Any] | str) -> list[dict[str, Any]]:
        """Send one client event; returns the server events it caused."""
        self.session.receive(event if isinstance(event, str) else json.dumps(event), now=self.now)
        return self.pump()

    def append(self, pcm: npt.NDArray[np.int16], chunk_ms: int = 20) -> list[dict[str, Any]]:
        """Stream audio in 20 ms appends, as a real-time client does."""
        step = RATE * chunk_ms // 1000
        new: list[dict[str, Any]] = []
        for i in range(0, len(pcm), step):
            piece = pcm[i : i + step]
            new += self.advance(len(piece) / RATE)
            audio = base64.b64encode(piece.astype("<i2").tobytes()).decode()
            new += self.send({"type": "input_audio_buffer.append", "audio": audio})
        return new

    def stream(self, pcm: npt.NDArray[np.int16], frame_ms: int = 20) -> list[dict[str, Any]]:
        """Feed audio as a media track does (WebRTC, SIP): PCM frames, no client events."""
        step = RATE * frame_ms // 1000
        new: list[dict[str, Any]] = []
        for i in range(0, len(pcm), step):
            piece = pcm[i : i + step]
            new += self.advance(len(piece) / RATE)
            self.session.append_audio(piece, now=self.now)
            new += self.pump()
        return new

    def take(self, kind: type) -> list[Any]:
        """Remove and return the recorded actions of one kind."""
        found = [a for a in self.actions if isinstance(a, kind)]
        self.actions = [a for a in self.actions if not isinstance(a, kind)]
        return found

    def heard(self, action: Recognise, text: str | None = None) -> TimedTranscript:
        """``text`` (else ``asr_text``) heard across the window of a recognition step."""
        spoken = self.asr_text if text is None else text
        return timed(spoken or "", len(action.request.audio) / self.asr_rate)

    def transcribe_all(self, text: str = "What is the capital of France?") -> list[dict[str, Any]]:
        """Answer every pending transcription, and every recognition step somebody waits
        for, with ``text``; caption steps are dropped unanswered."""
        for action in self.take(Transcribe):
            self.session.handle(
                TranscriptionDone(action.request_id, text, len(action.audio) / self.asr_rate),
                now=self.now,
            )
        for step in self.take(Recognise):
            if step.request.urgency != Urgency.CAPTION:
                self.session.handle(
                    Recognised(step.request_id, self.heard(step, text)), now=self.now
                )
        return self.pump()

    def steps(self, *urgencies: Urgency) -> list[Recognise]:
        """Remove and return the recorded recognition steps (of these urgencies, when given;
        the others stay recorded)."""
        found = [
            a
            for a in self.actions
            if isinstance(a, Recognise) and (not urgencies or a.request.urgency in urgencies)
        ]
        self.actions = [a for a in self.actions if not any(a is f for f in found)]
        return found

    def speak_reply(self, generate: Generate, clauses: list[str], ms_per_clause: int = 400) -> None:
        """Play the engines' part for an audio response."""
        for clause in clauses:
            pcm = voiced(ms_per_clause, generate.output_rate)
            self.session.handle(AudioGenerated(generate.response_id, pcm, clause), now=self.now)
        self.session.handle(
            GenerationFinished(
                generate.response_id, Finished("stop", prompt_tokens=20, completion_tokens=8)
            ),
            now=self.now,
        )
        self.pump()

    def types(self, events: list[dict[str, Any]] | None = None) -> list[str]:
        """Event types, in order."""
        return [e["type"] for e in (self.events if events is None else events)]


def _vad(driver: Driver, action: AnalyzeSpeech) -> list[Result]:
    driver.vad_chunk_sizes.update(len(chunk) for chunk in action.chunks)
    return [VadScored(energy_probability(chunk), action.epoch) for chunk in action.chunks]


def _transcribe(driver: Driver, action: Transcribe) -> list[Result]:
    driver.actions.append(action)
    if driver.asr_text is None:
        return []
    seconds = len(action.audio) / driver.asr_rate
    return [TranscriptionDone(action.request_id, driver.asr_text, seconds)]


def _recognise(driver: Driver, action: Recognise) -> list[Result]:
    driver.actions.append(action)
    if driver.asr_text is None or action.request.urgency == Urgency.CAPTION:
        return []
    heard = driver.heard(action)
    if not action.text_first:
        return [Recognised(action.request_id, heard)]
    # An engine that can: the words, then their times.
    words = tuple(word.word for word in heard.words)
    return [RecognisedText(action.request_id, words), Recognised(action.request_id, heard)]


def _score_turn(driver: Driver, action: ScoreTurn) -> list[Result]:
    driver.actions.append(action)
    return [] if driver.turn_score is None else [TurnScored(action.key, driver.turn_score)]


def _speculate(driver: Driver, action: Speculate) -> list[Result]:
    driver.actions.append(action)
    driver.speculations[action.key] = action.generate
    return []


def _discard(driver: Driver, action: DiscardSpeculation) -> list[Result]:
    driver.actions.append(action)
    driver.speculations.pop(action.key, None)
    return []


def _adopt(driver: Driver, action: AdoptSpeculation) -> list[Result]:
    driver.actions.append(action)
    speculated = driver.speculations.pop(action.key)
    driver.actions.append(dataclasses.replace(speculated, response_id=action.response_id))
    return []


# The tests' engines: what each action the core emits is answered with at once. Actions not
# here are only recorded, for the test to answer; VAD requests are answered with the energy
# stand-in, recognition and end-of-turn scoring with ``asr_text`` and ``turn_score`` when set
# (steps of incremental recognition only when somebody waits for them).
ANSWERS: dict[type[Any], Callable[[Driver, Any], list[Result]]] = {
    AnalyzeSpeech: _vad,
    Transcribe: _transcribe,
    Recognise: _recognise,
    ScoreTurn: _score_turn,
    Speculate: _speculate,
    DiscardSpeculation: _discard,
    AdoptSpeculation: _adopt,
}


def manual(driver: Driver) -> None:
    """Turn detection off: the test commits audio and asks for responses itself."""
    driver.send(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
    )


@pytest.fixture
def driver() -> Driver:
    """A session with the default configuration (server VAD, audio out, pcm)."""
    return Driver()

"""One simulated phone call: a person talking into a Realtime session, and what came back."""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import deque
from dataclasses import dataclass

import aiohttp
import numpy as np

from hark.bench.load.config import LoadConfig
from hark.bench.load.results import Results
from hark.bench.load.script import Script

# Send times kept per call: enough for any decision to refer back to.
_RING = 4096
_AUDIO_DELTA = "response.output_audio.delta"


@dataclass(eq=False)
class Call:
    """One simulated phone call: a Realtime session with a person talking into it.

    ``started`` is the run's start (monotonic seconds), which the timeline counts from.
    """

    config: LoadConfig
    script: Script
    results: Results
    started: float
    ws: aiohttp.ClientWebSocketResponse
    rng: random.Random
    hangup_at: float
    phase: int

    def __post_init__(self) -> None:
        self.failed: str | None = None
        self.closed = asyncio.Event()
        self.sent = np.zeros(_RING)
        self.count = 0
        self.expected = 0
        self.detected = 0
        self._frames: deque[str] = deque()
        self._asks_next = False
        self._voiced_chunk: int | None = None
        # The last question's voiced chunk, until its speech_stopped is timed.
        self._stop_due: int | None = None
        self._expect_at: int | None = None
        self._stopped_at: float | None = None
        # A question counts as expected once this much silence followed its last word.
        self._settle = self._chunks(self.config.silence_ms / 1000 + 1.0)
        self._think()

    # -- the person

    def _chunks(self, seconds: float) -> int:
        return max(1, round(seconds * 1000 / self.script.chunk_ms))

    def _silence(self, seconds: float) -> list[str]:
        variants = self.script.silence
        return [variants[self.rng.randrange(len(variants))] for _ in range(self._chunks(seconds))]

    def _think(self) -> None:
        self._frames.extend(self._silence(self.rng.uniform(*self.config.think_s)))
        self._asks_next = True

    def _ask(self) -> None:
        question = self.rng.choice(self.script.questions)
        self._voiced_chunk = self._stop_due = self.count + question.last_voiced_chunk
        self._expect_at = self._voiced_chunk + self._settle
        self._frames.extend(question.frames)
        self._frames.extend(self._silence(self.rng.uniform(*self.config.pause_s)))
        self._asks_next = False
        self.results.questions += 1

    def next_frame(self) -> str:
        """The next chunk to send: a word of the question, or the quiet around it."""
        if not self._frames:
            if self._asks_next:
                self._ask()
            else:
                self._think()
        return self._frames.popleft()

    def sent_chunk(self, at: float) -> None:
        """The chunk from ``next_frame`` left at ``at`` (monotonic seconds)."""
        self.sent[self.count % _RING] = at
        self.count += 1
        if self._expect_at is not None and self.count >= self._expect_at:
            self._expect_at = None
            self.expected += 1

    def _sent_at(self, chunk: int) -> float | None:
        if chunk < 0 or chunk >= self.count or chunk < self.count - _RING:
            return None
        return float(self.sent[chunk % _RING])

    # -- the server

    def received(self, text: str, at: float) -> None:
        """One server event, received at ``at``."""
        if _AUDIO_DELTA in text[:120]:
            if self._stopped_at is not None:
                self._first_audio(at)
            return
        try:
            event = json.loads(text)
        except ValueError:
            self.fail("bad_json")
            return
        kind = event.get("type")
        results = self.results
        if kind == "input_audio_buffer.speech_stopped":
            self.detected += 1
            self._stopped_at = at
            end_ms = event.get("audio_end_ms")
            if isinstance(end_ms, int | float):
                sent = self._sent_at(math.ceil(end_ms / self.script.chunk_ms) - 1)
                if sent is not None:
                    results.vad_lag.append((at - self.started, (at - sent) * 1000))
                self._time_speech_end(end_ms, at)
        elif kind == "response.done":
            status = str(event.get("response", {}).get("status", "unknown"))
            results.responses[status] += 1
            if status == "failed":
                self.fail("response_failed")
        elif kind == "conversation.item.input_audio_transcription.completed":
            results.transcripts += 1
        elif kind == "hark.turn_timings":
            for key, values in (("e2a_ms", results.server_e2a), ("v2v_ms", results.server_v2v)):
                value = event.get(key)
                if isinstance(value, int | float):
                    values.append(float(value))
        elif kind == "error":
            code = str(event.get("error", {}).get("code") or "none")
            results.errors[code] += 1
            self.fail(f"error:{code}")

    def _time_speech_end(self, end_ms: object, at: float) -> None:
        """The question's end of speech, timed by the first ``speech_stopped`` whose audio
        reaches past its last voiced chunk (a pause inside the question ends earlier)."""
        chunk = self._stop_due
        if chunk is None or not isinstance(end_ms, int | float):
            return
        if end_ms < chunk * self.script.chunk_ms:
            return
        self._stop_due = None
        sent = self._sent_at(chunk)
        if sent is not None:
            lag = (at - sent) * 1000 - self.config.silence_ms
            self.results.speech_end_lag.append((at - self.started, lag))

    def _first_audio(self, at: float) -> None:
        assert self._stopped_at is not None
        results = self.results
        results.e2a.append((at - self.started, (at - self._stopped_at) * 1000))
        if self._voiced_chunk is not None:
            sent = self._sent_at(self._voiced_chunk)
            if sent is not None:
                results.v2v.append((at - sent) * 1000)
        self._stopped_at = None

    def fail(self, reason: str) -> None:
        """Mark the call failed; the first reason is the one reported."""
        if self.failed is None:
            self.failed = reason

    def finish(self) -> None:
        """Add this call's outcome to the results."""
        results = self.results
        results.turns_expected += self.expected
        results.turns_detected += self.detected
        results.missed_turns += max(0, self.expected - self.detected)
        if self.failed is None:
            results.calls_completed += 1
        else:
            results.failures[self.failed] += 1

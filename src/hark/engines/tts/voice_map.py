"""The operator's voice map (``--voice-map``): which installed voice speaks for a voice a
client names that the engine does not have, an OpenAI custom voice id (``voice_…``) above
all. Sessions accept any custom id; unmapped, one the engine lacks speaks with its default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import numpy as np
import numpy.typing as npt

from hark.engines.tts import TtsEngine, installed_voices


class VoiceMapError(ValueError):
    """A voice map that cannot be used; the message says which entry and why."""


def parse_voice_map(value: object) -> tuple[tuple[str, str], ...]:
    """``"ID=VOICE,ID=VOICE"`` (the command line, the environment) or a table of strings
    (the configuration file) as pairs; raises ``VoiceMapError``."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, str):
        pairs = []
        for entry in (e.strip() for e in value.split(",")):
            if entry:
                name, equals, voice = entry.partition("=")
                if not equals:
                    raise VoiceMapError(f"voice_map entries are ID=VOICE, not {entry!r}")
                pairs.append((name.strip(), voice.strip()))
    else:
        raise VoiceMapError("voice_map must be ID=VOICE[,ID=VOICE…] or a table")
    for name, voice in pairs:
        if not isinstance(name, str) or not isinstance(voice, str) or not name or not voice:
            raise VoiceMapError(f"voice_map entries need a voice and an id: {name!r}={voice!r}")
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise VoiceMapError("voice_map maps an id twice")
    return tuple(pairs)


class MappedVoices:
    """``tts`` speaking each voice of ``mapping`` with the voice it maps to (one of the
    engine's own, or a name it maps in turn, OpenAI's); every other voice as ``tts`` would."""

    def __init__(self, tts: TtsEngine, mapping: Mapping[str, str]) -> None:
        installed = installed_voices(tts)
        if installed is not None:
            known = {*installed, *_engine_map(tts)}
            unknown = sorted({voice for voice in mapping.values() if voice not in known})
            if unknown:
                raise VoiceMapError(
                    f"voice_map names voices the TTS engine does not have: {', '.join(unknown)}"
                    f" (it has {', '.join(installed)} and OpenAI's names)"
                )
        self.tts = tts
        self.mapping = dict(mapping)
        self.sample_rate = tts.sample_rate

    def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        """Speak ``text`` with the voice ``voice`` maps to (``voice`` itself when unmapped)."""
        spoken = self.mapping.get(voice, voice) if voice is not None else None
        return self.tts.synthesize(text, voice=spoken, speed=speed, slack_s=slack_s)

    async def warmup(self) -> None:
        """Warm the engine."""
        await self.tts.warmup()

    def installed_voices(self) -> tuple[str, ...] | None:
        """The engine's own voices (None when it keeps no list)."""
        return installed_voices(self.tts)

    def voice_map(self) -> dict[str, str]:
        """The engine's map of the names it maps (OpenAI's), with the operator's entries over
        it."""
        return {**_engine_map(self.tts), **self.mapping}

    async def aclose(self) -> None:
        """Release what the engine holds."""
        close = getattr(self.tts, "aclose", None)
        if close is not None:
            await close()


def _engine_map(tts: TtsEngine) -> dict[str, str]:
    """The names ``tts`` maps onto its voices (``VoiceCatalog.voice_map``); none for an
    engine without the method."""
    own = getattr(tts, "voice_map", None)
    return own() if own is not None else {}

"""The backchannel judge's words on real speech: the fixtures of ``hark bench turns
--backchannels`` (six backchannels and four interruptions, said by Piper and two espeak-ng
voices) recognised by Whisper tiny.en as the session asks for a candidate's words (from
100 ms before the voice to its end), at 16 kHz and band-limited to a phone's 8 kHz, then
judged by ``judge_words``.

Whisper tiny.en mishears two or three of these 60 (espeak-ng's British "Mm-hmm." as "and
then them", its "Wait." and "Wait, stop." through 8 kHz as nothing, as a laugh is heard);
the assertion allows three, so that a different CPU's rounding on a borderline utterance
does not fail it, while a judge that let words through or stopped on hums would.
"""

from __future__ import annotations

import numpy as np
import pytest

from hark.audio.resample import resample
from hark.bench.backchannels import fixtures
from hark.engines.asr import RecognitionRequest, Urgency
from hark.engines.asr.whisper import WhisperAsr
from hark.session.backchannel import judge_words

pytestmark = pytest.mark.slow

_LEAD = np.zeros(1600, np.float32)


async def test_the_fixtures_are_judged_as_they_were_said() -> None:
    asr = WhisperAsr()
    wrong = []
    for said in await fixtures(None):
        for rate in (16000, 8000):
            pcm = resample(said.pcm, 24000, rate)
            if rate != 16000:
                pcm = resample(pcm, rate, 16000)
            audio = np.concatenate((_LEAD, pcm.astype(np.float32) / 32768.0))
            heard = await asr.recognise(
                RecognitionRequest(audio=audio, language="en", urgency=Urgency.DECISION)
            )
            verdict = judge_words(heard.text)
            if (verdict == "backchannel") != said.backchannel:
                wrong.append(f"{said.voice} at {rate} Hz said {said.text!r}, heard {heard.text!r}")
    assert len(wrong) <= 3, wrong

"""The backchannel judge's words on real speech: the fixtures of ``hark bench turns
--backchannels`` (six backchannels and four interruptions, said by Piper and two espeak-ng
voices) recognised by Whisper tiny.en after ``WORDS_PROMPT``, as the session asks for a
candidate's words, at 16 kHz and band-limited to a phone's 8 kHz, then judged by
``judge_words``.

Without the prompt, 2 to 5 of these 60 were misjudged, depending on how much of the pause
the window kept (espeak-ng's British "Mm-hmm." heard as "and then them", its "Wait." and
"Wait, stop." through 8 kHz heard as nothing, as a laugh is, and, before a run of one word
counted once, laughs heard as a dozen "ha"s or "ah"s); with it, none. The assertion allows
one, so that a different CPU's rounding on a borderline utterance does not fail it.
"""

from __future__ import annotations

import numpy as np
import pytest

from hark.audio.resample import resample
from hark.bench.backchannels import fixtures
from hark.engines.asr import RecognitionRequest, Urgency
from hark.engines.asr.whisper import WhisperAsr
from hark.session.backchannel import WORDS_PROMPT, WORDS_TAIL_MS, judge_words

pytestmark = pytest.mark.slow

# The judge's window starts 100 ms before the voice and takes WORDS_TAIL_MS of the pause.
_LEAD = np.zeros(1600, np.float32)
_TAIL = np.zeros(WORDS_TAIL_MS * 16, np.float32)


async def test_the_fixtures_are_judged_as_they_were_said() -> None:
    asr = WhisperAsr()
    wrong = []
    for said in await fixtures(None):
        for rate in (16000, 8000):
            pcm = resample(said.pcm, 24000, rate)
            if rate != 16000:
                pcm = resample(pcm, rate, 16000)
            audio = np.concatenate((_LEAD, pcm.astype(np.float32) / 32768.0, _TAIL))
            heard = await asr.recognise(
                RecognitionRequest(
                    audio=audio, prompt=WORDS_PROMPT, language="en", urgency=Urgency.DECISION
                )
            )
            text = " ".join(segment.text for segment in heard.segments)
            verdict = judge_words(text)
            if (verdict == "backchannel") != said.backchannel:
                wrong.append(f"{said.voice} at {rate} Hz said {said.text!r}, heard {text!r}")
    assert len(wrong) <= 1, wrong

"""``audio.input.noise_reduction``: the input buffer hears denoised audio, switched on and off
with ``session.update``, on the sample clock of the audio sent."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.formats import decode_audio
from hark.protocol.session_config import NoiseReduction as NoiseReductionConfig
from hark.protocol.session_config import PcmuFormat
from hark.session.noise_reduction import wet_share
from tests.session.conftest import RATE, Driver
from tests.speech import spoken


def white_noise(ms: int, rms: float = 0.03, seed: int = 3) -> npt.NDArray[np.int16]:
    """Gaussian noise of ``rms`` (full scale 1)."""
    noise = np.random.default_rng(seed).normal(0.0, rms * 32768, RATE * ms // 1000)
    return np.clip(noise, -32768, 32767).astype(np.int16)


def rms_db(pcm: npt.NDArray[np.int16]) -> float:
    """The level of ``pcm`` in dB below full scale."""
    samples = pcm.astype(np.float64) / 32768
    return float(10 * np.log10(np.mean(samples**2) + 1e-20))


def manual(noise_reduction: dict[str, Any] | None) -> Driver:
    """A session with manual turns and this ``noise_reduction``."""
    driver = Driver()
    events = driver.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": None, "noise_reduction": noise_reduction}},
            },
        }
    )
    assert driver.types(events) == ["session.updated"]
    return driver


def committed_audio(driver: Driver, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    """Send ``pcm`` in 20 ms appends, commit, and read back the user item's audio."""
    driver.append(pcm)
    events = driver.send({"type": "input_audio_buffer.commit"})
    item_id = next(e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed")
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": item_id})
    audio = retrieved[0]["item"]["content"][0]["audio"]
    return np.frombuffer(base64.b64decode(audio), "<i2").astype(np.int16)


def test_off_by_default_the_buffer_holds_the_audio_sent() -> None:
    noise = white_noise(1000)
    np.testing.assert_array_equal(committed_audio(manual(None), noise), noise)


@pytest.mark.parametrize("kind", ["far_field", "near_field"])
def test_noise_reduction_takes_noise_out_of_the_buffer(kind: str) -> None:
    noise = white_noise(2000)
    heard = committed_audio(manual({"type": kind}), noise)
    # As many samples as were sent: the sample clock is the client's.
    assert len(heard) == len(noise)
    assert rms_db(heard[RATE // 2 :]) < rms_db(noise) - 15


def test_far_field_takes_out_more_than_near_field() -> None:
    noise = white_noise(2000)
    far = committed_audio(manual({"type": "far_field"}), noise)[RATE // 2 :]
    near = committed_audio(manual({"type": "near_field"}), noise)[RATE // 2 :]
    assert rms_db(far) < rms_db(near) - 5


def test_the_vad_hears_the_denoised_audio() -> None:
    """Loud noise is speech to the energy stand-in for the VAD; denoised, it is not."""
    loud = white_noise(3000, rms=0.2)
    speech_events = ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped")
    plain = Driver()
    heard = [t for t in plain.types(plain.append(loud)) if t in speech_events]
    assert heard == ["input_audio_buffer.speech_started"]
    denoised = Driver()
    denoised.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"noise_reduction": {"type": "far_field"}}},
            },
        }
    )
    heard = [t for t in denoised.types(denoised.append(loud)) if t in speech_events]
    # The network may need a moment to learn the noise; then the VAD hears silence.
    assert heard in ([], list(speech_events))


def test_turned_off_mid_session_the_audio_passes_untouched() -> None:
    driver = manual({"type": "far_field"})
    committed_audio(driver, white_noise(500))
    driver.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"noise_reduction": None}}},
        }
    )
    noise = white_noise(500, seed=4)
    np.testing.assert_array_equal(committed_audio(driver, noise), noise)


def test_turned_on_mid_session_it_takes_effect_at_once() -> None:
    driver = manual(None)
    committed_audio(driver, white_noise(500))
    driver.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"noise_reduction": {"type": "far_field"}}},
            },
        }
    )
    noise = white_noise(2000, seed=5)
    heard = committed_audio(driver, noise)
    assert rms_db(heard[RATE // 2 :]) < rms_db(noise) - 15


def test_media_track_audio_is_denoised_too() -> None:
    driver = manual({"type": "far_field"})
    noise = white_noise(2000)
    driver.stream(noise)
    events = driver.send({"type": "input_audio_buffer.commit"})
    item_id = next(e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed")
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": item_id})
    heard = np.frombuffer(base64.b64decode(retrieved[0]["item"]["content"][0]["audio"]), "<i2")
    assert len(heard) == len(noise)
    assert rms_db(heard[RATE // 2 :].astype(np.int16)) < rms_db(noise) - 15


def test_strength_scales_the_denoised_share_and_persists_across_updates() -> None:
    assert wet_share(None) == 0.0
    assert wet_share(NoiseReductionConfig(type="far_field")) == 1.0
    assert wet_share(NoiseReductionConfig(type="near_field", strength=0.5)) == pytest.approx(0.45)
    driver = manual({"type": "far_field", "strength": 0.4})
    events = driver.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"noise_reduction": {"type": "near_field"}}},
            },
        }
    )
    # As OpenAI documents: an update that leaves out strength keeps the current one.
    assert events[0]["session"]["audio"]["input"]["noise_reduction"] == {
        "type": "near_field",
        "strength": 0.4,
    }


def test_strength_zero_leaves_the_audio_alone() -> None:
    noise = white_noise(500)
    heard = committed_audio(manual({"type": "far_field", "strength": 0.0}), noise)
    np.testing.assert_array_equal(heard, noise)


def test_a_new_input_format_gets_a_denoiser_at_its_rate() -> None:
    """G.711 input is 8 kHz: the denoiser follows the format. Speech comes through 21 ms late
    at 8 kHz (168 samples), which a denoiser still at 24 kHz would make three times as long."""
    driver = manual({"type": "far_field"})
    driver.append(white_noise(100))
    driver.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
        }
    )
    assert driver.session.input_rate == 8000
    speech = spoken("What is the capital of France?", 8000)
    for start in range(0, len(speech), 160):
        driver.session.append_audio(speech[start : start + 160], now=driver.now)
    events = driver.send({"type": "input_audio_buffer.commit"})
    item_id = next(e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed")
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": item_id})
    heard = decode_audio(
        PcmuFormat(), base64.b64decode(retrieved[0]["item"]["content"][0]["audio"])
    )
    assert len(heard) == len(speech)
    out, source = heard.astype(np.float64), speech.astype(np.float64)
    lag = max(range(400), key=lambda k: float(np.dot(out[k:], source[: len(out) - k])))
    assert lag == pytest.approx(168, abs=3)

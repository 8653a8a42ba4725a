"""``audio.input.noise_reduction``: the input buffer hears denoised audio, switched on and off
with ``session.update``, on the sample clock of the audio sent."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.denoise import Denoiser
from hark.audio.formats import decode_audio
from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.registry import build_engines
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import NoiseReduction as NoiseReductionConfig
from hark.protocol.session_config import PcmuFormat
from hark.session import held_input
from hark.session.actions import CountDroppedAudio, Denoise
from hark.session.core import DENOISE_INLINE_S
from hark.session.noise_reduction import wet_share
from hark.session.results import Denoised, DenoiseFailed
from tests.audio.test_denoise import rms_db
from tests.audio.test_denoise import white_noise as noise_samples
from tests.session.conftest import RATE, Driver
from tests.speech import spoken


def white_noise(ms: int, rms: float = 0.03, seed: int = 3) -> npt.NDArray[np.int16]:
    """``ms`` of Gaussian noise of ``rms`` (full scale 1) at the session's rate."""
    return noise_samples(RATE * ms // 1000, rms, seed)


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


def one_append(driver: Driver, pcm: npt.NDArray[np.int16]) -> list[dict[str, Any]]:
    """Send ``pcm`` as one append, as a client uploading a recording does."""
    audio = base64.b64encode(pcm.astype("<i2").tobytes()).decode()
    return driver.send({"type": "input_audio_buffer.append", "audio": audio})


def denoise_jobs(driver: Driver) -> list[Denoise]:
    """The ``Denoise`` actions the session asked for so far."""
    return [a for a in driver.actions if isinstance(a, Denoise)]


def test_streamed_appends_and_media_audio_are_denoised_inline() -> None:
    driver = manual({"type": "far_field"})
    driver.append(white_noise(2000), chunk_ms=100)
    driver.stream(white_noise(1000, seed=4))
    one_append(driver, white_noise(int(DENOISE_INLINE_S * 1000)))
    assert denoise_jobs(driver) == []


def test_a_long_append_is_denoised_off_the_loop_and_later_events_wait_in_order() -> None:
    driver = manual({"type": "far_field"})
    noise = white_noise(3000)
    assert one_append(driver, noise) == []
    (job,) = denoise_jobs(driver)
    np.testing.assert_array_equal(job.pcm, noise)
    # Nothing the client sends after it is handled before its audio is in the buffer.
    assert driver.send({"type": "input_audio_buffer.commit"}) == []
    note = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "and then this"}],
    }
    assert driver.send({"type": "conversation.item.create", "item": note}) == []
    driver.session.receive_binary(b"\x00binary", now=driver.now)
    assert driver.pump() == []
    denoised = job.denoise(job.pcm)
    driver.session.handle(Denoised(job.job_id, denoised), now=driver.now)
    events = driver.pump()
    assert driver.types(events) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.added",
        "conversation.item.done",
        "error",
    ]
    assert events[3]["item"]["content"][0]["text"] == "and then this"
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": events[0]["item_id"]})
    heard = np.frombuffer(base64.b64decode(retrieved[0]["item"]["content"][0]["audio"]), "<i2")
    np.testing.assert_array_equal(heard, denoised)
    assert rms_db(heard[RATE // 2 :].astype(np.int16)) < rms_db(noise) - 15
    # Events are handled at once again.
    assert driver.types(driver.send({"type": "input_audio_buffer.clear"})) == [
        "input_audio_buffer.cleared"
    ]


def test_one_job_at_a_time_so_the_denoiser_stream_stays_in_order() -> None:
    driver = manual({"type": "far_field"})
    first, second = white_noise(1000), white_noise(1000, seed=4)
    one_append(driver, first)
    one_append(driver, second)
    (job,) = denoise_jobs(driver)
    driver.session.handle(Denoised(job.job_id, job.denoise(job.pcm)), now=driver.now)
    driver.pump()
    # The held append is replayed and becomes the next job, on the same stream.
    jobs = denoise_jobs(driver)
    assert len(jobs) == 2
    np.testing.assert_array_equal(jobs[1].pcm, second)
    assert jobs[1].denoise.__self__ is job.denoise.__self__  # type: ignore[attr-defined]


def test_media_audio_waits_behind_a_long_append() -> None:
    driver = manual({"type": "far_field"})
    one_append(driver, np.zeros(RATE, np.int16))
    (job,) = denoise_jobs(driver)
    loud = white_noise(200, rms=0.01, seed=6)
    driver.session.append_audio(loud, now=driver.now)
    driver.session.handle(Denoised(job.job_id, job.pcm), now=driver.now)
    events = driver.send({"type": "input_audio_buffer.commit"})
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": events[0]["item_id"]})
    heard = np.frombuffer(base64.b64decode(retrieved[0]["item"]["content"][0]["audio"]), "<i2")
    # The media audio came after the append's second, not before it.
    assert len(heard) == RATE + len(loud)
    assert not heard[:RATE].any()
    assert heard[RATE:].any()


def test_what_waits_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(held_input, "MAX_HELD_INPUTS", 2)
    driver = manual({"type": "far_field"})
    one_append(driver, white_noise(1000))
    (job,) = denoise_jobs(driver)
    assert driver.send({"type": "input_audio_buffer.commit"}) == []
    assert driver.send({"type": "input_audio_buffer.clear"}) == []
    refused = driver.send({"type": "input_audio_buffer.commit"})
    assert [e["error"]["code"] for e in refused] == ["input_backlog_full"]
    # Media audio past the bound is dropped and counted, with one error for the job.
    frame = white_noise(20)
    driver.session.append_audio(frame, now=driver.now)
    driver.session.append_audio(frame, now=driver.now)
    events = driver.pump()
    assert [e["error"]["code"] for e in events] == ["input_backlog_full"]
    assert [a.samples for a in driver.actions if isinstance(a, CountDroppedAudio)] == [
        len(frame),
        len(frame),
    ]
    driver.session.handle(Denoised(job.job_id, job.denoise(job.pcm)), now=driver.now)
    assert driver.types(driver.pump()) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "input_audio_buffer.cleared",
    ]


def test_a_failed_job_is_an_error_and_the_audio_goes_in_as_sent() -> None:
    driver = manual({"type": "far_field"})
    noise = white_noise(1000)
    one_append(driver, noise)
    (job,) = denoise_jobs(driver)
    driver.send({"type": "input_audio_buffer.commit"})
    driver.session.handle(DenoiseFailed(job.job_id, "librnnoise crashed"), now=driver.now)
    events = driver.pump()
    assert driver.types(events)[:2] == ["error", "input_audio_buffer.committed"]
    assert events[0]["error"]["code"] == "noise_reduction_failed"
    retrieved = driver.send({"type": "conversation.item.retrieve", "item_id": events[1]["item_id"]})
    heard = np.frombuffer(base64.b64decode(retrieved[0]["item"]["content"][0]["audio"]), "<i2")
    np.testing.assert_array_equal(heard, noise)


def test_a_session_that_ends_drops_the_job_and_what_waits() -> None:
    driver = manual({"type": "far_field"})
    one_append(driver, white_noise(1000))
    (job,) = denoise_jobs(driver)
    driver.send({"type": "input_audio_buffer.commit"})
    driver.session.end(ProtocolError("bye", code="server_shutdown"), "shutdown", now=driver.now)
    driver.pump()
    driver.session.handle(Denoised(job.job_id, job.pcm), now=driver.now)
    assert driver.pump() == []


async def test_the_runner_serves_other_sessions_while_a_long_append_is_denoised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Session A uploads half a minute of noisy audio in one append and commits; session B,
    on the same loop, asks a question. The denoiser is held back until B is answered: were it
    run on the loop, B could not be answered first, and A's commit would come first."""
    answered = threading.Event()
    process = Denoiser.process

    def gated(self: Denoiser, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        if len(pcm) > RATE * DENOISE_INLINE_S:
            # Bounded so that the run on the loop fails its assertion instead of hanging.
            answered.wait(20)
        return process(self, pcm)

    monkeypatch.setattr(Denoiser, "process", gated)
    engines = build_engines(Settings(engines="fake"))
    a = SessionRunner(engines, model="m")
    b = SessionRunner(engines, model="m")
    await a.start()
    await b.start()
    seen: list[tuple[str, str]] = []

    async def read(name: str, runner: SessionRunner, last: str) -> None:
        async for text in runner.outgoing():
            event = json.loads(text)
            seen.append((name, event["type"]))
            if name == "b" and event["type"] == "response.done":
                answered.set()
            if event["type"] == last:
                return

    update = {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "audio": {"input": {"turn_detection": None, "noise_reduction": {"type": "far_field"}}},
        },
    }
    a.receive_text(json.dumps(update))
    audio = base64.b64encode(white_noise(30_000).astype("<i2").tobytes()).decode()
    a.receive_text(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    a.receive_text(json.dumps({"type": "input_audio_buffer.commit"}))
    a.receive_text(json.dumps({"type": "input_audio_buffer.clear"}))
    for event in (
        {"type": "session.update", "session": {"output_modalities": ["text"]}},
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            },
        },
        {"type": "response.create"},
    ):
        b.receive_text(json.dumps(event))
    await asyncio.wait_for(
        asyncio.gather(read("a", a, "input_audio_buffer.cleared"), read("b", b, "response.done")),
        60,
    )
    assert seen.index(("b", "response.done")) < seen.index(("a", "input_audio_buffer.committed"))
    a_events = [t for name, t in seen if name == "a"]
    assert a_events[-4:] == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "input_audio_buffer.cleared",
    ]
    await a.close()
    await b.close()

"""Transports that play audio themselves (WebRTC, SIP): playout, barge-in and truncation."""

from __future__ import annotations

import base64

from hark.engines.llm import Finished
from hark.session.actions import ClearAudio, FinishAudio, Generate, PlayAudio
from hark.session.results import (
    AudioGenerated,
    GenerationFinished,
    PlayoutCleared,
    PlayoutStarted,
    PlayoutStopped,
)

from .conftest import Driver, silence, voiced
from .test_out_of_band import manual, out_of_band


def answered(driver: Driver) -> Generate:
    driver.append(silence(300))
    driver.append(voiced(800))
    driver.append(silence(700))
    driver.transcribe_all()
    (generate,) = driver.take(Generate)
    # Three clauses of 400 ms: "Paris" 0-400, " is the capital" 400-800, " of France." 800-1200.
    driver.speak_reply(generate, ["Paris", " is the capital", " of France."])
    return generate


def test_audio_goes_to_the_player_not_into_events() -> None:
    driver = Driver(plays_audio=True)
    generate = answered(driver)
    types = driver.types()
    assert "response.output_audio.delta" not in types
    assert types.count("response.output_audio_transcript.delta") == 3
    plays = driver.take(PlayAudio)
    assert len(plays) == 3
    assert {p.response_id for p in plays} == {generate.response_id}
    assert sum(len(p.pcm) for p in plays) == 24000 * 1200 // 1000
    # The generation finished: the player is told that no more audio comes.
    assert driver.take(FinishAudio) == [FinishAudio(generate.response_id)]
    driver.session.handle(PlayoutStarted(generate.response_id), now=driver.now)
    driver.session.handle(PlayoutStopped(generate.response_id), now=driver.now)
    assert driver.types(driver.pump()) == [
        "output_audio_buffer.started",
        "output_audio_buffer.stopped",
    ]


def test_barge_in_during_playout_truncates_to_what_was_heard() -> None:
    driver = Driver(plays_audio=True)
    generate = answered(driver)
    item_id = driver.take(PlayAudio)[0].item_id
    driver.session.handle(PlayoutStarted(generate.response_id), now=driver.now)
    driver.pump()
    # The reply is generated (response.done) but still playing when the user speaks.
    driver.append(voiced(200))
    (clear,) = driver.take(ClearAudio)
    assert clear.response_id == generate.response_id
    driver.session.handle(PlayoutCleared(generate.response_id, 700), now=driver.now)
    new = driver.pump()
    assert driver.types(new) == ["conversation.item.truncated", "output_audio_buffer.cleared"]
    assert new[0]["item_id"] == item_id and new[0]["audio_end_ms"] == 700
    item = driver.send({"type": "conversation.item.retrieve", "item_id": item_id})[0]["item"]
    assert item["content"][0]["transcript"] == "Paris is the"


def test_client_clear_and_nothing_playing() -> None:
    driver = Driver(plays_audio=True)
    assert driver.send({"type": "output_audio_buffer.clear"})[0]["error"]["code"] == (
        "output_audio_buffer_empty"
    )
    generate = answered(driver)
    driver.take(PlayAudio)
    driver.send({"type": "output_audio_buffer.clear"})
    assert [a.response_id for a in driver.take(ClearAudio)] == [generate.response_id]
    driver.session.handle(PlayoutCleared(generate.response_id, 1200), now=driver.now)
    # Everything had been heard: nothing to truncate.
    assert driver.types(driver.pump()) == ["output_audio_buffer.cleared"]


def test_audio_made_after_a_clear_is_neither_played_nor_kept() -> None:
    driver = Driver(plays_audio=True)
    driver.append(silence(300))
    driver.append(voiced(800))
    driver.append(silence(700))
    driver.transcribe_all()
    (generate,) = driver.take(Generate)
    driver.session.handle(
        AudioGenerated(generate.response_id, voiced(400), "Paris"), now=driver.now
    )
    driver.pump()
    item_id = driver.take(PlayAudio)[0].item_id
    driver.session.handle(PlayoutStarted(generate.response_id), now=driver.now)
    driver.send({"type": "output_audio_buffer.clear"})
    assert [a.response_id for a in driver.take(ClearAudio)] == [generate.response_id]
    driver.session.handle(PlayoutCleared(generate.response_id, 300), now=driver.now)
    assert driver.types(driver.pump()) == [
        "conversation.item.truncated",
        "output_audio_buffer.cleared",
    ]
    # The engines go on a little before they hear of it: what they make is not heard.
    driver.session.handle(
        AudioGenerated(generate.response_id, voiced(400), " is the capital"), now=driver.now
    )
    driver.pump()
    assert not driver.take(PlayAudio)
    driver.session.handle(
        GenerationFinished(generate.response_id, Finished("stop")), now=driver.now
    )
    assert "response.output_audio_transcript.delta" not in driver.types(driver.pump())
    item = driver.send({"type": "conversation.item.retrieve", "item_id": item_id})[0]["item"]
    content = item["content"][0]
    assert len(base64.b64decode(content["audio"])) == 300 * 24 * 2
    assert "capital" not in content["transcript"]


def test_websocket_sessions_refuse_output_audio_buffer_clear(driver: Driver) -> None:
    assert driver.send({"type": "output_audio_buffer.clear"})[0]["error"]["code"] == "invalid_event"


def test_an_out_of_band_reply_is_played_to_the_end_and_reported_stopped() -> None:
    driver = Driver(plays_audio=True)
    manual(driver)
    generate = out_of_band(driver, "aside", "audio")
    driver.session.handle(
        AudioGenerated(generate.response_id, voiced(300), "Aside."), now=driver.now
    )
    driver.pump()
    assert not driver.take(FinishAudio)
    driver.session.handle(
        GenerationFinished(generate.response_id, Finished("stop")), now=driver.now
    )
    driver.pump()
    assert driver.take(FinishAudio) == [FinishAudio(generate.response_id)]
    driver.session.handle(PlayoutStarted(generate.response_id), now=driver.now)
    driver.session.handle(PlayoutStopped(generate.response_id), now=driver.now)
    assert driver.types(driver.pump()) == [
        "output_audio_buffer.started",
        "output_audio_buffer.stopped",
    ]


def test_a_cancelled_reply_still_finishes_its_audio() -> None:
    driver = Driver(plays_audio=True)
    manual(driver)
    generate = out_of_band(driver, "aside", "audio")
    driver.session.handle(
        AudioGenerated(generate.response_id, voiced(300), "Aside."), now=driver.now
    )
    driver.send({"type": "response.cancel", "response_id": generate.response_id})
    assert driver.take(FinishAudio) == [FinishAudio(generate.response_id)]


def test_barge_in_clears_the_conversations_reply_and_a_client_clear_clears_all() -> None:
    driver = Driver(plays_audio=True)
    generate = answered(driver)
    aside = out_of_band(driver, "aside", "audio")
    driver.session.handle(AudioGenerated(aside.response_id, voiced(300), "Aside."), now=driver.now)
    driver.pump()
    driver.append(voiced(200))
    assert [a.response_id for a in driver.take(ClearAudio)] == [generate.response_id]
    driver.send({"type": "output_audio_buffer.clear"})
    assert {a.response_id for a in driver.take(ClearAudio)} == {
        generate.response_id,
        aside.response_id,
    }

"""How much audio a conversation keeps: reply audio built up chunk by chunk, the per-session
retention budget, and what retrieve and truncate do once an item's audio is gone."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.engines.llm import Finished
from hark.session.actions import ClearAudio, Generate
from hark.session.conversation import Part
from hark.session.results import AudioGenerated, GenerationFinished, PlayoutCleared, PlayoutStarted

from .conftest import RATE, Driver, silence, voiced


def manual(driver: Driver) -> None:
    """Manual turns, with input transcription on so user items carry their words."""
    driver.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}
                }
            },
        }
    )


def user_turn(driver: Driver, ms: int, words: str) -> str:
    """Commit ``ms`` of speech that is recognised as ``words``; returns the item id."""
    driver.append(voiced(ms))
    committed = driver.send({"type": "input_audio_buffer.commit"})[0]
    driver.transcribe_all(words)
    return str(committed["item_id"])


def reply(driver: Driver, ms: int, words: str) -> str:
    """An audio response of ``ms`` speaking ``words``; returns its item id."""
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    driver.speak_reply(generate, [words], ms_per_clause=ms)
    return str(driver.events[-1]["response"]["output"][0]["id"])


def part_of(driver: Driver, item_id: str) -> Part:
    return driver.session.conversation.get(item_id).parts[0]


def retrieve(driver: Driver, item_id: str) -> dict[str, Any]:
    new = driver.send({"type": "conversation.item.retrieve", "item_id": item_id})
    assert driver.types(new) == ["conversation.item.retrieved"]
    content: dict[str, Any] = new[0]["item"]["content"][0]
    return content


def finish(driver: Driver, generate: Generate) -> None:
    driver.session.handle(
        GenerationFinished(
            generate.response_id, Finished("stop", prompt_tokens=20, completion_tokens=8)
        ),
        now=driver.now,
    )
    driver.pump()


# ---------------------------------------------------------------- reply audio


def test_long_reply_from_many_small_chunks_is_their_concatenation(driver: Driver) -> None:
    manual(driver)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    rng = np.random.default_rng(3)
    chunks = [
        rng.integers(-32768, 32767, int(n), dtype=np.int16) for n in rng.integers(0, 480, 3000)
    ]
    # One single-word clause every 100 chunks: a cut inside a clause keeps none of its words.
    clauses = {i: f" w{i // 100}" for i in range(0, len(chunks), 100)}
    part: Part | None = None
    copies = 0
    previous: npt.NDArray[np.int16] | None = None
    for i, pcm in enumerate(chunks):
        driver.session.handle(
            AudioGenerated(generate.response_id, pcm, clauses.get(i, "")), now=driver.now
        )
        driver.pump()
        part = part or part_of(driver, driver.events[-1]["item_id"])
        assert part.audio is not None
        if previous is not None and len(previous) and not np.may_share_memory(previous, part.audio):
            copies += 1
        previous = part.audio
    assert part is not None
    # Appending by concatenation would copy everything so far at each of the 3000 chunks.
    assert copies <= 20
    finish(driver, generate)
    whole = np.concatenate(chunks)
    assert part.audio is not None
    assert np.array_equal(part.audio, whole)
    # The spare room of the growing buffer went with the end of the response.
    assert part.audio.base is None or part.audio.base.nbytes == part.audio.nbytes
    item_id = driver.events[-1]["response"]["output"][0]["id"]
    audio = base64.b64decode(retrieve(driver, item_id)["audio"])
    assert audio == whole.astype("<i2").tobytes()

    cut_ms = 9_000
    cut = cut_ms * RATE // 1000
    starts = np.cumsum([0] + [len(c) for c in chunks])
    heard = "".join(text for i, text in clauses.items() if starts[min(i + 100, len(chunks))] <= cut)
    new = driver.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": cut_ms,
        }
    )
    assert driver.types(new) == ["conversation.item.truncated"]
    content = retrieve(driver, item_id)
    assert base64.b64decode(content["audio"]) == whole[:cut].astype("<i2").tobytes()
    assert content["transcript"] == heard and heard


def test_reply_in_progress_keeps_its_audio_over_the_budget() -> None:
    driver = Driver(audio_retention_s=1)
    manual(driver)
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    first = [voiced(500), voiced(500), voiced(500)]
    for pcm in first:
        driver.session.handle(AudioGenerated(generate.response_id, pcm, " Hello"), now=driver.now)
    driver.pump()
    reply_id = driver.events[-1]["item_id"]
    # A turn committed while the 1.5 s reply is still being generated applies the budget.
    user_id = user_turn(driver, 300, "wait")
    assert part_of(driver, user_id).audio is not None
    more = voiced(200)
    driver.session.handle(AudioGenerated(generate.response_id, more, " there."), now=driver.now)
    finish(driver, generate)
    audio = part_of(driver, reply_id).audio
    assert audio is not None and np.array_equal(audio, np.concatenate([*first, more]))
    # Once the response is over, the next turn lets its audio go.
    user_turn(driver, 300, "go on")
    assert part_of(driver, reply_id).audio is None
    assert part_of(driver, reply_id).transcript == " Hello Hello Hello there."


# ---------------------------------------------------------------- retention budget


def over_budget(driver: Driver) -> list[str]:
    """Four items under a 2 s budget; the two oldest lose their audio."""
    manual(driver)
    u1 = user_turn(driver, 800, "one")
    a1 = reply(driver, 600, "Reply one.")
    assert part_of(driver, u1).audio is not None and part_of(driver, a1).audio is not None
    u2 = user_turn(driver, 800, "two")  # 2.2 s in all: the oldest goes
    a2 = reply(driver, 700, "Reply two.")  # 2.1 s without the oldest: the next goes too
    return [u1, a1, u2, a2]


def test_budget_drops_the_oldest_audio_first_and_keeps_the_words() -> None:
    driver = Driver(audio_retention_s=2)
    ids = over_budget(driver)
    parts = [part_of(driver, i) for i in ids]
    assert [p.audio is not None for p in parts] == [False, False, True, True]
    assert [p.duration_ms() for p in parts] == [0, 0, 800, 700]
    assert parts[1].segments == []
    assert [p.transcript for p in parts] == ["one", "Reply one.", "two", "Reply two."]
    # The LLM reads the same conversation as before the audio went.
    driver.send({"type": "response.create"})
    (generate,) = driver.take(Generate)
    said = [m.content for m in generate.request.messages if m.role != "system"]
    assert said == ["one", "Reply one.", "two", "Reply two."]


def test_retrieve_after_the_drop_gives_the_words_without_audio() -> None:
    driver = Driver(audio_retention_s=2)
    u1, a1, u2, _ = over_budget(driver)
    for item_id, transcript in ((u1, "one"), (a1, "Reply one.")):
        content = retrieve(driver, item_id)
        assert content.get("audio") is None
        assert content["transcript"] == transcript
    kept = base64.b64decode(retrieve(driver, u2)["audio"])
    assert len(kept) == 2 * RATE * 800 // 1000


def test_truncate_of_a_dropped_item_is_an_error_and_the_session_goes_on() -> None:
    driver = Driver(audio_retention_s=2)
    _, a1, _, a2 = over_budget(driver)
    new = driver.send(
        {
            "type": "conversation.item.truncate",
            "item_id": a1,
            "content_index": 0,
            "audio_end_ms": 100,
            "event_id": "evt_1",
        }
    )
    assert driver.types(new) == ["error"]
    error = new[0]["error"]
    assert error["code"] == "invalid_value" and error["param"] == "item_id"
    assert error["event_id"] == "evt_1"
    assert "no longer kept" in error["message"] and "2 seconds" in error["message"]
    new = driver.send(
        {
            "type": "conversation.item.truncate",
            "item_id": a2,
            "content_index": 0,
            "audio_end_ms": 300,
        }
    )
    assert driver.types(new) == ["conversation.item.truncated"]
    assert len(base64.b64decode(retrieve(driver, a2)["audio"])) == 2 * RATE * 300 // 1000
    driver.send({"type": "response.create"})
    assert driver.take(Generate)


def test_reply_being_played_keeps_its_audio_and_can_be_cut() -> None:
    driver = Driver(plays_audio=True, audio_retention_s=1)
    driver.append(silence(300))
    driver.append(voiced(800))
    driver.append(silence(700))
    driver.transcribe_all()
    (generate,) = driver.take(Generate)
    user_id = driver.session.conversation.entries()[0].id
    driver.speak_reply(generate, ["Paris", " is the capital", " of France."])
    reply_id = driver.events[-1]["response"]["output"][0]["id"]
    # The 1.2 s reply is over the 1 s budget on its own: the turn before it goes, it stays.
    assert part_of(driver, user_id).audio is None
    assert part_of(driver, reply_id).duration_ms() == 1200
    driver.session.handle(PlayoutStarted(generate.response_id), now=driver.now)
    driver.pump()
    # The user talks over it; the turn is committed before the player reports the cut.
    driver.append(voiced(300))
    assert [c.response_id for c in driver.take(ClearAudio)] == [generate.response_id]
    driver.append(silence(700))
    assert "input_audio_buffer.committed" in driver.types()
    assert part_of(driver, reply_id).duration_ms() == 1200
    driver.session.handle(PlayoutCleared(generate.response_id, 700), now=driver.now)
    new = driver.pump()
    assert driver.types(new) == ["conversation.item.truncated", "output_audio_buffer.cleared"]
    content = retrieve(driver, reply_id)
    assert len(base64.b64decode(content["audio"])) == 2 * RATE * 700 // 1000
    assert content["transcript"] == "Paris is the"


def test_default_budget_is_five_minutes_of_audio(driver: Driver) -> None:
    manual(driver)
    ids = []
    for seconds in (150, 140, 20):
        driver.send({"type": "response.create"})
        (generate,) = driver.take(Generate)
        for _ in range(seconds // 10):
            driver.session.handle(
                AudioGenerated(generate.response_id, silence(10_000), " la"), now=driver.now
            )
        finish(driver, generate)
        ids.append(driver.events[-1]["response"]["output"][0]["id"])
        if seconds == 140:
            # 290 s: all kept.
            assert all(part_of(driver, i).audio is not None for i in ids)
    assert [part_of(driver, i).audio is not None for i in ids] == [False, True, True]

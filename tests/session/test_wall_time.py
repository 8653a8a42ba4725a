"""Wall time as an input of the core: handed in with every input, never read by the core."""

from __future__ import annotations

from hark.engines.llm import Finished
from hark.session.actions import Generate
from hark.session.rate_limits import RateLimits, RateWindow
from hark.session.results import AudioGenerated, GenerationFinished, PlayoutStarted, PlayoutStopped

from .conftest import Driver, silence, voiced

TURN_S = 20
PROMPT_TOKENS = 1500


def test_a_two_hour_voice_only_call_is_never_rate_limited() -> None:
    # A WebRTC call: audio from the media track, reply audio played by the transport, and not
    # one client event. Each response reads a 1500-token prompt, so a window that never slid
    # would reach the 200,000 tokens a minute by the 130th response, some 45 minutes in.
    hours = 2
    driver = Driver(plays_audio=True, max_duration_s=(hours + 1) * 3600)
    driver.asr_text = "What is the capital of France?"
    turn = [voiced(1000), silence(800)]
    statuses: list[str] = []
    for _ in range(hours * 3600 // TURN_S):
        for pcm in turn:
            driver.stream(pcm, frame_ms=100)
        for generate in driver.take(Generate):
            rid = generate.response_id
            driver.session.handle(AudioGenerated(rid, voiced(500), "Paris."), now=driver.now)
            driver.session.handle(
                GenerationFinished(
                    rid, Finished("stop", prompt_tokens=PROMPT_TOKENS, completion_tokens=3)
                ),
                now=driver.now,
            )
            driver.session.handle(PlayoutStarted(rid), now=driver.now)
            driver.stream(silence(500), frame_ms=100)
            driver.session.handle(PlayoutStopped(rid), now=driver.now)
        driver.stream(silence(TURN_S * 1000 - 2300), frame_ms=100)
        statuses += response_statuses(driver)
        driver.actions.clear()
    assert statuses == ["completed"] * (hours * 3600 // TURN_S)


def test_the_token_window_still_limits_a_burst() -> None:
    # The other side of the sliding window: responses inside one minute count together.
    driver = Driver(plays_audio=True)
    per_response = RateLimits().tokens_per_minute // 4
    statuses: list[str] = []
    for _ in range(5):
        driver.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        for generate in driver.take(Generate):
            driver.session.handle(
                GenerationFinished(generate.response_id, Finished("stop", per_response, 0)),
                now=driver.now,
            )
        driver.pump()
        driver.now += 1
        statuses += response_statuses(driver)
    assert statuses == ["completed"] * 4 + ["failed"]


def response_statuses(driver: Driver) -> list[str]:
    """The statuses of the responses done since the last call, in order."""
    done = [e["response"]["status"] for e in driver.events if e["type"] == "response.done"]
    driver.events.clear()
    return done


def test_the_request_window_slides_and_refused_responses_do_not_fill_it() -> None:
    window = RateWindow(RateLimits(requests_per_minute=3))
    assert [window.admit(now)[1] for now in (0.0, 1.0, 2.0, 30.0)] == [False, False, False, True]
    update, over = window.admit(60.5)
    # The response of 0.0 left the window; the refused one of 30.0 was never in it.
    assert not over
    requests = update.rate_limits[0]
    assert (requests.name, requests.remaining, requests.reset_seconds) == ("requests", 0, 0.5)

"""Spoken turns over WebRTC: the microphone track, barge-in, and a real conversation."""

from __future__ import annotations

import base64
from collections.abc import Callable

import aiohttp
import numpy as np
import pytest

from hark.bench.webrtc import AUDIBLE_RMS, CallClient, ReceivedFrame
from hark.transports.webrtc.playout import FRAME_SAMPLES, PLAYOUT_RATE
from tests.e2e.conftest import speech, transcribe, words
from tests.transports.conftest import (
    API_KEY,
    LONG_REPLY,
    RtcServer,
    StartRtcServer,
    collect,
    first_reply,
    of_type,
    track_past,
    until,
)

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

MakeClient = Callable[..., CallClient]
QUESTION = "What is the capital of France?"
INTERRUPTION = "Wait, stop, I have another question."


async def connect(http: aiohttp.ClientSession, server: RtcServer, client: CallClient) -> None:
    await client.connect(http, server.url, api_key=API_KEY)
    await client.next_event("session.created")


def say(client: CallClient, text_id: str, pcm: np.ndarray, rate: int = 24000) -> None:
    client.microphone.play(text_id, "", pcm, rate)
    client.microphone.finish(text_id)


def audible(frames: list[ReceivedFrame]) -> list[ReceivedFrame]:
    return [f for f in frames if f.rms > AUDIBLE_RMS]


def silent_since(frames: list[ReceivedFrame], since: float) -> list[ReceivedFrame]:
    """The run of silent frames at the end of ``frames``, counting those arrived after
    ``since`` only."""
    run: list[ReceivedFrame] = []
    for frame in reversed(frames):
        if frame.rms > AUDIBLE_RMS or frame.arrival < since:
            break
        run.append(frame)
    return run


async def test_the_microphone_track_drives_turns(
    http: aiohttp.ClientSession, rtc_server: RtcServer, clients: MakeClient
) -> None:
    client = clients()
    await connect(http, rtc_server, client)
    say(client, "q", await speech(QUESTION))
    events = await collect(client, "output_audio_buffer.stopped", limit_s=60)
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index(
        "input_audio_buffer.speech_stopped"
    )
    assert "input_audio_buffer.committed" in kinds
    (done,) = of_type(events, "response.done")
    assert done["response"]["status"] == "completed"
    await until(lambda: len(audible(client.frames)) * 20 >= 2000)


async def test_the_microphone_follows_a_change_of_input_format(
    http: aiohttp.ClientSession, rtc_server: RtcServer, clients: MakeClient
) -> None:
    client = clients()
    await connect(http, rtc_server, client)
    client.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"format": {"type": "audio/pcmu"}}},
            },
        }
    )
    await client.next_event("session.updated")
    say(client, "q", await speech(QUESTION))
    stopped = await client.next_event("input_audio_buffer.speech_stopped")
    # The sample clock runs at the new rate: the question ends about when it was spoken.
    spoken_ms = len(await speech(QUESTION)) * 1000 // 24000
    assert spoken_ms - 600 <= stopped["audio_end_ms"] <= spoken_ms + 1500


async def test_barge_in_cuts_the_reply_where_the_item_is_truncated(
    http: aiohttp.ClientSession, long_reply_server: RtcServer, clients: MakeClient
) -> None:
    client = clients(keep_audio=True)
    await connect(http, long_reply_server, client)
    say(client, "q1", await speech(QUESTION))
    interruption = await speech(INTERRUPTION)
    events = await collect(client, "output_audio_buffer.started", limit_s=60)
    (item,) = [e["item"] for e in of_type(events, "response.output_item.added")]
    await until(lambda: len(audible(client.frames)) >= 30)
    say(client, "q2", interruption)
    events = await collect(client, "output_audio_buffer.cleared", limit_s=60)
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index(
        "conversation.item.truncated"
    )
    # The fake engines finish generating at once: the reply was done, only its playout
    # was still going on.
    (truncated,) = of_type(events, "conversation.item.truncated")
    assert truncated["item_id"] == item["id"]
    end_ms = truncated["audio_end_ms"]
    assert 600 <= end_ms < 400 * len(LONG_REPLY.split())

    # What came over the track: the reply, cut where the server said it was. A reply that
    # went on after the cut would fill more frames within a second of it; the next reply
    # (to the interruption) only starts once the interruption is over.
    await collect(client, "output_audio_buffer.started", limit_s=60)
    await until(lambda: track_past(client.frames, first_reply(client.frames)), limit_s=60)
    sent_ms = len(first_reply(client.frames)) * FRAME_SAMPLES * 1000 / PLAYOUT_RATE
    assert abs(sent_ms - end_ms) <= 20, (sent_ms, end_ms)

    client.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    content = (await client.next_event("conversation.item.retrieved"))["item"]["content"][0]
    assert len(base64.b64decode(content["audio"])) == end_ms * 24 * 2
    kept = content["transcript"].split()
    assert kept == LONG_REPLY.split()[: len(kept)]
    assert abs(len(kept) - sent_ms / 400) <= 1


async def test_a_spoken_question_gets_a_spoken_answer(
    http: aiohttp.ClientSession, start_rtc_server: StartRtcServer, clients: MakeClient
) -> None:
    server = await start_rtc_server(engines="embedded")
    client = clients(keep_audio=True)
    await connect(http, server, client)
    client.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"transcription": {"model": "whisper-1"}}},
            },
        }
    )
    await client.next_event("session.updated")
    say(client, "q", await speech(QUESTION))
    events = await collect(client, "output_audio_buffer.stopped", limit_s=120)
    (heard,) = of_type(events, "conversation.item.input_audio_transcription.completed")
    assert "france" in words(heard["transcript"])
    (done,) = of_type(events, "response.done")
    assert done["response"]["status"] == "completed"
    (transcript,) = of_type(events, "response.output_audio_transcript.done")
    # The track is in order and plays silence after a reply: once ten silent frames have come
    # after the stop, the reply's last frames are in, however slow the way here was.
    stopped = events[-1]["_received"]
    await until(lambda: len(silent_since(client.frames, stopped)) >= 10, limit_s=30)
    reply = client.audio(since=audible(client.frames)[0].arrival)
    assert len(reply) > PLAYOUT_RATE // 2
    recognised = await transcribe(reply, PLAYOUT_RATE)
    expected = set(words(transcript["transcript"]))
    assert len(set(words(recognised)) & expected) >= max(1, len(expected) // 2), (
        recognised,
        transcript["transcript"],
    )

"""Realtime translation sessions (``/v1/realtime/translations``, issue 28, point 10) driven by
the official SDK's translation client against a real hark with the fake engines and the real
VAD: spoken audio in, its words, their translation and the translation spoken out, in the
SDK's own types."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest

from hark.audio.resample import resample
from hark.config import Settings
from hark.engines.fake import FakeLlm
from hark.engines.llm import GenerationRequest, LlmEvent
from hark.engines.registry import Engines
from tests.speech import spoken

from .conftest import API_KEY, StartServer

KEYED = Settings(api_keys=(API_KEY,))
QUESTION = "What is the capital of France?"
ANSWER = "Quelle est la capitale de la France ?"
# 200 ms of 24 kHz PCM16, as OpenAI advises appending.
CHUNK = 4800


class RecordingLlm(FakeLlm):
    """The fake LLM, noting what it is asked."""

    def __init__(self) -> None:
        super().__init__(ANSWER)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        self.requests.append(request)
        async for event in super().generate(request):
            yield event


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=url + "/v1", websocket_base_url=url.replace("http", "ws") + "/v1", api_key=API_KEY
    )


def appends(seconds_of_silence: float) -> list[str]:
    """The spoken question then silence, 24 kHz PCM16 in 200 ms pieces, base64."""
    speech = resample(spoken(QUESTION), 16000, 24000)
    pcm = np.concatenate([speech, np.zeros(int(24000 * seconds_of_silence), np.int16)])
    return [
        base64.b64encode(pcm[i : i + CHUNK].astype("<i2").tobytes()).decode()
        for i in range(0, len(pcm), CHUNK)
    ]


async def test_a_spoken_sentence_is_heard_translated_and_spoken_back(
    start_server: StartServer, fake_engines: Engines
) -> None:
    llm = fake_engines.llm = RecordingLlm()
    server = await start_server(KEYED, fake_engines)
    events: list[Any] = []
    async with (
        sdk(server.url) as client,
        client.realtime.translations.connect(
            model="gpt-realtime-translate", max_retries=0
        ) as connection,
    ):
        created = await connection.recv()
        assert created.type == "session.created"
        assert created.session.type == "translation"
        assert created.session.model == "gpt-realtime-translate"
        assert created.session.id.startswith("sess_")
        await connection.send(
            {
                "type": "session.update",
                "session": {
                    "audio": {
                        "output": {"language": "fr"},
                        "input": {"transcription": {"model": "whisper-1"}},
                    }
                },
            }
        )
        updated = await connection.recv()
        assert updated.type == "session.updated"
        assert updated.session.audio.output is not None
        assert updated.session.audio.output.language == "fr"
        for audio in appends(1.0):
            await connection.send({"type": "session.input_audio_buffer.append", "audio": audio})
        await connection.send({"type": "session.close"})
        async for event in connection:
            events.append(event)
            if event.type == "session.closed":
                break
    kinds = [event.type for event in events]
    assert kinds[-1] == "session.closed" and "error" not in kinds
    heard = "".join(e.delta for e in events if e.type == "session.input_transcript.delta")
    said = "".join(e.delta for e in events if e.type == "session.output_transcript.delta")
    spoken_back = [e for e in events if e.type == "session.output_audio.delta"]
    assert heard == "What is the capital of France?"
    assert said == ANSWER
    assert spoken_back
    assert {(e.sample_rate, e.channels, e.format) for e in spoken_back} == {(24000, 1, "pcm16")}
    assert sum(len(base64.b64decode(e.delta)) for e in spoken_back) > 0
    # In order: the words heard, their translation, the translation spoken.
    assert kinds.index("session.input_transcript.delta") < kinds.index(
        "session.output_transcript.delta"
    )
    assert kinds.index("session.output_transcript.delta") < kinds.index(
        "session.output_audio.delta"
    )
    (request,) = llm.requests
    assert "French" in request.messages[0].content
    assert request.messages[-1].content == "What is the capital of France?"


async def test_without_transcription_only_the_translation_comes_back(
    start_server: StartServer, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with (
        sdk(server.url) as client,
        client.realtime.translations.connect(model="m", max_retries=0) as connection,
    ):
        created = await connection.recv()
        assert created.type == "session.created"
        assert created.session.audio.input is not None
        assert created.session.audio.input.transcription is None
        for audio in appends(1.0):
            await connection.send({"type": "session.input_audio_buffer.append", "audio": audio})
        await connection.send({"type": "session.close"})
        kinds = []
        async for event in connection:
            kinds.append(event.type)
            if event.type == "session.closed":
                break
    assert "session.input_transcript.delta" not in kinds
    assert "session.output_transcript.delta" in kinds
    assert kinds[-1] == "session.closed"


@pytest.mark.parametrize(
    ("event", "param"),
    [
        ({"type": "response.create"}, "type"),
        ({"type": "session.update", "session": {"model": "another"}}, "session.model"),
        ({"type": "session.update", "session": {"voice": "alloy"}}, "session"),
        ({"type": "session.input_audio_buffer.append", "audio": "not base64!"}, "audio"),
    ],
)
async def test_what_a_translation_session_does_not_take_is_an_error_and_it_goes_on(
    start_server: StartServer, fake_engines: Engines, event: dict[str, Any], param: str
) -> None:
    server = await start_server(KEYED, fake_engines)
    async with (
        sdk(server.url) as client,
        client.realtime.translations.connect(model="m", max_retries=0) as connection,
    ):
        assert (await connection.recv()).type == "session.created"
        await connection.send({**event, "event_id": "evt_1"})  # type: ignore[arg-type]
        error = await connection.recv()
        assert error.type == "error"
        assert error.error.param == param
        assert error.error.event_id == "evt_1"
        await connection.send({"type": "session.close"})
        assert (await connection.recv()).type == "session.closed"


async def test_a_stranger_and_a_realtime_client_secret_are_refused(
    start_server: StartServer, fake_engines: Engines
) -> None:
    server = await start_server(KEYED, fake_engines)
    url = server.url.replace("http", "ws") + "/v1/realtime/translations?model=m"
    async with sdk(server.url) as client:
        secret = await client.realtime.client_secrets.create()
    async with aiohttp.ClientSession() as http:
        for key, status in (("sk-stranger", 401), (secret.value, 403)):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url, headers={"Authorization": f"Bearer {key}"})
            assert refused.value.status == status

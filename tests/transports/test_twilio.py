"""Twilio Media Streams against the real server (``--engines fake``): a peer that speaks
Twilio's documented side of a stream (``connected``, ``start``, ``media`` at real pace,
``dtmf``, ``stop``; marks echoed once the audio before them has "played", at once on
``clear``) calls in, signed with the account's auth token."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from openai.types.webhooks import RealtimeCallIncomingWebhookEvent

from hark.audio.codecs.g711 import ulaw_decode, ulaw_encode
from hark.audio.resample import resample
from hark.bench.echo import BARGE_IN, SESSION, Room, reply_trial
from hark.bench.spoken_questions import RATE as SPEECH_RATE
from hark.config import Settings
from hark.engines.fake import FakeLlm
from hark.server.app import CALL_REGISTRIES, STATE, create_app
from hark.transports.twilio import SIGNATURE_HEADER, STREAM_PATH, TwilioStreams
from hark.transports.twilio_account import signature
from tests.conftest import engines_sharing_turn
from tests.e2e.conftest import speech, transcribe, words
from tests.server.conftest import RunningServer, serving, wait_ready
from tests.server.webhook_receiver import WebhookReceiver, webhook_receiver
from tests.speech import spoken
from tests.transports.conftest import LONG_REPLY

API_KEY = "sk-test-twilio-owner-0123456789"
AUTH_TOKEN = "twilio-auth-token-0123456789abcdef"
RATE = 8000
FRAME = RATE // 50
QUESTION = "What is the capital of France?"
LONG_QUESTION = "Could you tell me what the capital of France is, and how many people live there?"
INTERRUPTION = "Wait, stop, I have another question."
SECRET = "whsec_" + base64.b64encode(b"twilio-test-webhook-secret-0123").decode()


def twilio_settings(**changes: Any) -> Settings:
    """A server with keys, no SIP, and Twilio streams signed with ``AUTH_TOKEN``."""
    base = Settings(engines="fake", api_keys=(API_KEY,), sip=False, twilio_auth_token=AUTH_TOKEN)
    return dataclasses.replace(base, **changes)


def streams_of(server: RunningServer) -> TwilioStreams:
    """The server's Twilio registry."""
    found = [r for r in server.app[CALL_REGISTRIES] if isinstance(r, TwilioStreams)]
    assert len(found) == 1
    return found[0]


def stream_url(server: RunningServer, query: str = "") -> str:
    """The stream endpoint as Twilio requests it."""
    return server.url.replace("http://", "ws://") + STREAM_PATH + query


class TwilioPeer:
    """Twilio's side of one stream: sends the caller, "plays" what it gets at real pace.

    ``played`` is the reply audio that finished playing, ``cleared`` counts ``clear``
    messages, ``marks_sent`` the mark echoes; ``heard_at_clear`` is how much had played when
    each ``clear`` came.
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, stream_sid: str) -> None:
        self.ws = ws
        self.stream_sid = stream_sid
        self.played: list[npt.NDArray[np.int16]] = []
        self.received_samples = 0
        self.cleared = 0
        self.heard_at_clear: list[int] = []
        self.marks_sent = 0
        self._buffer: deque[tuple[str, Any]] = deque()
        self._wake = asyncio.Event()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._play())]

    @property
    def played_ms(self) -> int:
        """Milliseconds of reply audio played so far."""
        return sum(len(p) for p in self.played) * 1000 // RATE

    async def send(self, message: dict[str, Any]) -> None:
        """One message of Twilio's, with the stream's sid."""
        await self.ws.send_str(json.dumps({**message, "streamSid": self.stream_sid}))

    async def speak(self, pcm: npt.NDArray[np.int16]) -> None:
        """The caller says ``pcm`` (8 kHz): 20 ms media messages at real pace."""
        for chunk, start in enumerate(range(0, len(pcm) - FRAME + 1, FRAME)):
            payload = base64.b64encode(ulaw_encode(pcm[start : start + FRAME])).decode()
            media = {"track": "inbound", "chunk": str(chunk + 1), "payload": payload}
            await self.send({"event": "media", "media": media})
            await asyncio.sleep(0.02)

    async def say(self, pcm: npt.NDArray[np.int16]) -> None:
        """The caller says ``pcm`` and then nothing, as a phone line goes on, for two
        minutes."""
        await self.speak(pcm)
        await self.silence(120)

    async def silence(self, seconds: float) -> None:
        """The caller says nothing for ``seconds``."""
        await self.speak(np.zeros(int(seconds * RATE), np.int16))

    async def close(self) -> None:
        """Stop playing and reading."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            assert data["streamSid"] == self.stream_sid
            if data["event"] == "media":
                pcm = ulaw_decode(base64.b64decode(data["media"]["payload"]))
                self.received_samples += len(pcm)
                self._buffer.append(("media", pcm))
            elif data["event"] == "mark":
                self._buffer.append(("mark", data["mark"]["name"]))
            elif data["event"] == "clear":
                # Twilio drops the audio it holds and returns the marks it held.
                self.cleared += 1
                self.heard_at_clear.append(self.played_ms)
                held = [value for kind, value in self._buffer if kind == "mark"]
                self._buffer.clear()
                for name in held:
                    await self._echo(name)
            self._wake.set()

    async def _play(self) -> None:
        while True:
            while not self._buffer:
                self._wake.clear()
                await self._wake.wait()
            kind, value = self._buffer[0]
            if kind == "media":
                await asyncio.sleep(len(value) / RATE)
                if self._buffer and self._buffer[0][1] is value:
                    self._buffer.popleft()
                    self.played.append(value)
            else:
                self._buffer.popleft()
                await self._echo(value)

    async def _echo(self, name: str) -> None:
        self.marks_sent += 1
        await self.send({"event": "mark", "mark": {"name": name}})


def start_message(
    stream_sid: str, parameters: dict[str, str] | None = None, account_sid: str = "AC0123"
) -> dict[str, Any]:
    """Twilio's ``start``, as documented."""
    return {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": stream_sid,
        "start": {
            "accountSid": account_sid,
            "streamSid": stream_sid,
            "callSid": "CA0123",
            "tracks": ["inbound"],
            "customParameters": parameters or {},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        },
    }


@contextlib.asynccontextmanager
async def twilio_call(
    http: aiohttp.ClientSession,
    server: RunningServer,
    stream_sid: str = "MZ0001",
    parameters: dict[str, str] | None = None,
    account_sid: str = "AC0123",
    peer_of: Callable[[aiohttp.ClientWebSocketResponse, str], TwilioPeer] = TwilioPeer,
) -> AsyncIterator[TwilioPeer]:
    """A signed stream that has started, with ``parameters`` as its ``<Parameter>``s, its
    Twilio side ``peer_of(socket, stream_sid)``."""
    url = stream_url(server)
    headers = {SIGNATURE_HEADER: signature(AUTH_TOKEN, url)}
    async with http.ws_connect(url, headers=headers) as ws:
        await ws.send_str(
            json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        )
        await ws.send_str(json.dumps(start_message(stream_sid, parameters, account_sid)))
        peer = peer_of(ws, stream_sid)
        try:
            yield peer
        finally:
            await peer.close()


@contextlib.asynccontextmanager
async def sideband(
    http: aiohttp.ClientSession, server: RunningServer, call_id: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """The call's events, attached with ``?call_id=``."""
    async with http.ws_connect(
        f"{server.ws_url}?call_id={call_id}", headers={"Authorization": f"Bearer {API_KEY}"}
    ) as ws:
        yield ws


@contextlib.asynccontextmanager
async def on_the_phone(
    http: aiohttp.ClientSession, server: RunningServer, **stream: Any
) -> AsyncIterator[tuple[TwilioPeer, aiohttp.ClientWebSocketResponse]]:
    """A stream (``twilio_call(**stream)``) answered, and its sideband past
    ``session.created``."""
    async with twilio_call(http, server, **stream) as peer:
        call_id = await answered_call(server)
        async with sideband(http, server, call_id) as events:
            await next_event(events, "session.created")
            yield peer, events


async def next_event(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    """The next event of type ``kind``."""
    while True:
        message = await asyncio.wait_for(ws.receive(), 60)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        event = json.loads(message.data)
        if event["type"] == kind:
            return event


async def call_action(
    http: aiohttp.ClientSession,
    server: RunningServer,
    call_id: str,
    action: str,
    body: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """``POST /v1/realtime/calls/{call_id}/{action}`` with the API key: status and body."""
    async with http.post(
        f"{server.url}/v1/realtime/calls/{call_id}/{action}",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
    ) as response:
        return response.status, await response.json() if response.status != 200 else {}


async def answered_call(server: RunningServer) -> str:
    """The id of the server's one Twilio call, once it has a session."""
    streams = streams_of(server)
    for _ in range(400):
        calls = list(streams)
        if calls and calls[0].runner is not None:
            return calls[0].id
        await asyncio.sleep(0.025)
    raise AssertionError("the stream never became an answered call")


async def until(condition: Callable[[], bool]) -> None:
    """Wait (boundedly) until ``condition`` holds."""
    for _ in range(800):
        if condition():
            return
        await asyncio.sleep(0.025)
    raise AssertionError("the condition never held")


Served = Callable[..., Awaitable[RunningServer]]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """Starts a server of ``twilio_settings(**changes)``, ready, on its engines (``--engines
    fake`` and the real VAD unless changed; ``llm`` in place of the LLM when given)."""
    async with serving() as start_server:

        async def start(llm: FakeLlm | None = None, **changes: Any) -> RunningServer:
            engines = engines_sharing_turn(twilio_settings(**changes))
            if llm is not None:
                engines = dataclasses.replace(engines, llm=llm)
            server = await start_server(twilio_settings(**changes), engines)
            async with aiohttp.ClientSession() as http:
                await wait_ready(http, server)
            return server

        yield start


# ---------------------------------------------------------------------- who may stream


async def test_no_auth_token_means_no_endpoint(served: Served) -> None:
    """A stranger's probe: without an auth token there is nothing at the stream path."""
    server = await served(twilio_auth_token=None)
    url = stream_url(server)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url, headers={SIGNATURE_HEADER: signature("guess", url)})
    assert refused.value.status == 404
    assert not any(r.name == "twilio" for r in server.app[CALL_REGISTRIES])


@pytest.mark.parametrize("header", [None, "not-a-signature", "the wrong token"])
async def test_unsigned_or_missigned_streams_are_refused(
    served: Served, header: str | None
) -> None:
    """No signature, a malformed one or one made with another token: 403 before any upgrade."""
    server = await served()
    url = stream_url(server, "?prompt=x")
    headers = {}
    if header == "the wrong token":
        headers[SIGNATURE_HEADER] = signature("another-account-token", url)
    elif header is not None:
        headers[SIGNATURE_HEADER] = header
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url, headers=headers)
        assert refused.value.status == 403
        # The signature covers the query: one signed without it does not pass with it.
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(
                url, headers={SIGNATURE_HEADER: signature(AUTH_TOKEN, stream_url(server))}
            )
        assert refused.value.status == 403
    assert len(streams_of(server)) == 0


async def test_signature_over_the_public_url(served: Served) -> None:
    """Behind a proxy, the signature is of the URL Twilio requested (``twilio_url``)."""
    server = await served(twilio_url="wss://voice.example.com")
    local = stream_url(server)
    public = "wss://voice.example.com" + STREAM_PATH
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(local, headers={SIGNATURE_HEADER: signature(AUTH_TOKEN, local)})
        assert refused.value.status == 403
        headers = {SIGNATURE_HEADER: signature(AUTH_TOKEN, public)}
        async with http.ws_connect(local, headers=headers) as ws:
            await ws.send_str(json.dumps(start_message("MZ0002")))
            await answered_call(server)


async def test_a_draining_worker_takes_no_stream(served: Served) -> None:
    """A signed stream to a worker that drains is turned away (503) before the upgrade."""
    server = await served()
    server.app[STATE].draining = True
    url = stream_url(server)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url, headers={SIGNATURE_HEADER: signature(AUTH_TOKEN, url)})
    assert refused.value.status == 503
    assert len(streams_of(server)) == 0


# ---------------------------------------------------------------------- the call


async def test_signed_stream_is_a_call_with_a_session(served: Served) -> None:
    """``start`` makes a call answered with a session; its sideband gets the held events;
    ``stop`` ends it and the server closes the stream."""
    server = await served()
    async with aiohttp.ClientSession() as http, twilio_call(http, server) as peer:
        call_id = await answered_call(server)
        assert call_id.startswith("rtc_")
        async with sideband(http, server, call_id) as events:
            created = await next_event(events, "session.created")
            assert created["session"]["type"] == "realtime"
            await peer.send(
                {"event": "stop", "stop": {"accountSid": "AC0123", "callSid": "CA0123"}}
            )
            await until(lambda: peer.ws.closed)
        await until(lambda: len(streams_of(server)) == 0)
        # The session it counted as is released.
        await until(lambda: server.app[STATE].admitted == 0)


async def test_a_prompt_parameter_names_the_session(served: Served, tmp_path: Path) -> None:
    """``<Parameter name="prompt">`` answers the call with that stored prompt; one that
    does not exist leaves the call unanswered, and its stream is closed."""
    (tmp_path / "front-desk.txt").write_text("You answer the phone for Example Corp.")
    server = await served(prompts=str(tmp_path))
    async with aiohttp.ClientSession() as http:
        async with twilio_call(http, server, parameters={"prompt": "front-desk"}):
            call_id = await answered_call(server)
            async with sideband(http, server, call_id) as events:
                created = await next_event(events, "session.created")
                assert created["session"]["instructions"] == (
                    "You answer the phone for Example Corp."
                )
        await until(lambda: len(streams_of(server)) == 0)
        async with twilio_call(http, server, "MZ0005", {"prompt": "no-such-prompt"}) as peer:
            await until(lambda: peer.ws.closed)
        assert len(streams_of(server)) == 0


async def test_the_call_webhook_accepts_and_rejects(served: Served) -> None:
    """With the call webhook, a stream raises ``realtime.call.incoming`` (Twilio's ids as
    headers) and rings until the SDK accepts it; a rejected one has its stream closed."""
    with webhook_receiver() as receiver:
        server = await served(sip_webhook_url=receiver.url, sip_webhook_secret=SECRET)
        sdk = openai.AsyncOpenAI(
            api_key=API_KEY, base_url=server.url + "/v1", webhook_secret=SECRET, max_retries=0
        )
        async with sdk, aiohttp.ClientSession() as http:
            async with twilio_call(http, server, parameters={"shop": "Lyon"}):
                event = await incoming(receiver, sdk)
                headers = {h.name: h.value for h in event.data.sip_headers}
                assert headers["X-Twilio-CallSid"] == "CA0123"
                assert headers["X-Twilio-Param-shop"] == "Lyon"
                call = streams_of(server).get(event.data.call_id)
                assert call is not None and call.state == "pending"
                await sdk.realtime.calls.accept(event.data.call_id, type="realtime")
                assert call.state == "accepted" and call.runner is not None
            async with twilio_call(http, server, "MZ0006") as peer:
                event = await incoming(receiver, sdk)
                await sdk.realtime.calls.reject(event.data.call_id)
                await until(lambda: peer.ws.closed)
            assert len(streams_of(server)) == 0


async def incoming(
    receiver: WebhookReceiver, sdk: openai.AsyncOpenAI
) -> RealtimeCallIncomingWebhookEvent:
    """The next webhook, verified."""
    delivery = await asyncio.to_thread(receiver.next, 30)
    event = sdk.webhooks.unwrap(delivery.body, delivery.headers)
    assert isinstance(event, RealtimeCallIncomingWebhookEvent)
    return event


async def test_a_closed_socket_ends_the_call(served: Served) -> None:
    """Twilio's socket closing without ``stop`` ends the call and releases its session; the
    session was counted under the ``twilio`` label."""
    server = await served()
    async with aiohttp.ClientSession() as http:
        async with twilio_call(http, server) as peer:
            await answered_call(server)
            await until(lambda: server.app[STATE].admitted == 1)
            await peer.ws.close()
        await until(lambda: len(streams_of(server)) == 0)
        await until(lambda: server.app[STATE].admitted == 0)
        auth = {"Authorization": f"Bearer {API_KEY}"}
        async with http.get(server.url + "/metrics", headers=auth) as response:
            metrics = await response.text()
    assert 'hark_sessions_started_total{transport="twilio"} 1.0' in metrics


async def test_dtmf_reaches_the_session(served: Served) -> None:
    """A keypad press becomes ``input_audio_buffer.dtmf_event_received``."""
    server = await served()
    async with aiohttp.ClientSession() as http, on_the_phone(http, server) as (peer, events):
        await peer.send(
            {
                "event": "dtmf",
                "sequenceNumber": "5",
                "dtmf": {"track": "inbound_track", "digit": "7"},
            }
        )
        event = await next_event(events, "input_audio_buffer.dtmf_event_received")
        assert event["event"] == "7"


async def test_hangup_through_the_api_closes_the_stream(served: Served) -> None:
    """``/hangup`` ends the call and closes Twilio's socket; an answered call is not
    accepted again."""
    server = await served()
    async with aiohttp.ClientSession() as http, twilio_call(http, server) as peer:
        call_id = await answered_call(server)
        status, body = await call_action(http, server, call_id, "accept", {"type": "realtime"})
        assert (status, body["error"]["code"]) == (409, "invalid_call_state")
        assert (await call_action(http, server, call_id, "hangup"))[0] == 200
        await until(lambda: peer.ws.closed)
        assert len(streams_of(server)) == 0


# ---------------------------------------------------------------------- transfers


@dataclasses.dataclass
class TwilioApi:
    """Twilio's REST API as documented, for the Call resource's update: it records what it
    is asked, checks the account's basic authentication, and answers ``answer`` (status,
    body) to a call it knows, Twilio's 404 error to any other."""

    url: str
    requests: list[tuple[str, str | None, dict[str, str]]]
    answer: tuple[int, dict[str, Any]]


@pytest.fixture
async def twilio_api() -> AsyncIterator[TwilioApi]:
    """A Twilio REST API on a free local port."""
    api = TwilioApi("", [], (200, {"sid": "CA0123", "status": "in-progress"}))

    async def update_call(request: web.Request) -> web.Response:
        form = await request.post()
        fields = {name: str(value) for name, value in form.items()}
        api.requests.append((request.path, request.headers.get("Authorization"), fields))
        account, call = request.match_info["account"], request.match_info["call"]
        if request.headers.get("Authorization") != basic_auth(account):
            return twilio_error(401, 20003, "Authenticate")
        if call != "CA0123":
            return twilio_error(404, 20404, "The requested resource was not found")
        status, body = api.answer
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_post("/2010-04-01/Accounts/{account}/Calls/{call}.json", update_call)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    api.url = str(server.make_url("")).rstrip("/")
    try:
        yield api
    finally:
        await server.close()


def basic_auth(account_sid: str) -> str:
    """The ``Authorization`` header Twilio expects of the account: its SID and auth token."""
    return "Basic " + base64.b64encode(f"{account_sid}:{AUTH_TOKEN}".encode()).decode()


def twilio_error(status: int, code: int, message: str) -> web.Response:
    """An error of Twilio's 2010 API, in its JSON shape."""
    body = {
        "code": code,
        "message": message,
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": status,
    }
    return web.json_response(body, status=status)


async def test_refer_redirects_the_call_to_a_dial_through_twilio(
    served: Served, twilio_api: TwilioApi, caplog: pytest.LogCaptureFixture
) -> None:
    """``/refer`` updates the Call resource with a ``<Dial>`` of the target, signed in with
    the account SID and auth token: a ``tel:`` URI as a ``<Number>``, a ``sip:`` one as a
    ``<Sip>`` (escaped); the auth token is in no log."""
    caplog.set_level("DEBUG")
    server = await served(twilio_api_url=twilio_api.url)
    async with aiohttp.ClientSession() as http, twilio_call(http, server):
        call_id = await answered_call(server)
        refer = {"target_uri": "tel:+1-415-555-0123"}
        assert await call_action(http, server, call_id, "refer", refer) == (200, {})
        refer = {"target_uri": "sip:agent@example.com?X-Team=a&b"}
        assert await call_action(http, server, call_id, "refer", refer) == (200, {})
    path = "/2010-04-01/Accounts/AC0123/Calls/CA0123.json"
    auth = basic_auth("AC0123")
    assert twilio_api.requests == [
        (path, auth, {"Twiml": "<Response><Dial><Number>+14155550123</Number></Dial></Response>"}),
        (
            path,
            auth,
            {
                "Twiml": "<Response><Dial><Sip>sip:agent@example.com?X-Team=a&amp;b</Sip></Dial>"
                "</Response>"
            },
        ),
    ]
    assert AUTH_TOKEN not in caplog.text
    assert auth.split()[1] not in caplog.text


async def test_a_transfer_twilio_refuses_is_a_502_with_its_message(
    served: Served, twilio_api: TwilioApi
) -> None:
    """Twilio's error comes back as 502 ``refer_failed`` with Twilio's message; so does an
    API that cannot be reached; the call goes on."""
    twilio_api.answer = (400, {"code": 21220, "message": "Call is not in-progress."})
    server = await served(twilio_api_url=twilio_api.url)
    async with aiohttp.ClientSession() as http, twilio_call(http, server):
        call_id = await answered_call(server)
        refer = {"target_uri": "tel:+14155550123"}
        status, body = await call_action(http, server, call_id, "refer", refer)
        assert (status, body["error"]["code"]) == (502, "refer_failed")
        assert "Call is not in-progress. (error 21220)" in body["error"]["message"]
        streams_of(server).account.api_url = "http://127.0.0.1:9"
        status, body = await call_action(http, server, call_id, "refer", refer)
        assert (status, body["error"]["code"]) == (502, "refer_failed")
        assert "could not be reached" in body["error"]["message"]
        assert streams_of(server).get(call_id) is not None


async def test_a_stream_without_its_account_cannot_be_referred(
    served: Served, twilio_api: TwilioApi
) -> None:
    """A stream whose ``start`` has no ``accountSid`` cannot be redirected: 400, and Twilio
    is not asked."""
    server = await served(twilio_api_url=twilio_api.url)
    async with aiohttp.ClientSession() as http, twilio_call(http, server, account_sid=""):
        call_id = await answered_call(server)
        refer = {"target_uri": "tel:+14155550123"}
        status, body = await call_action(http, server, call_id, "refer", refer)
        assert (status, body["error"]["code"]) == (400, "invalid_call_type")
        assert "accountSid" in body["error"]["message"]
    assert twilio_api.requests == []


async def test_a_ringing_call_cannot_be_referred(served: Served, twilio_api: TwilioApi) -> None:
    """Before it is accepted, a call rings and cannot be transferred (409)."""
    with webhook_receiver() as receiver:
        server = await served(
            twilio_api_url=twilio_api.url, sip_webhook_url=receiver.url, sip_webhook_secret=SECRET
        )
        async with aiohttp.ClientSession() as http, twilio_call(http, server):
            await until(lambda: len(streams_of(server)) == 1)
            (call,) = streams_of(server)
            refer = {"target_uri": "tel:+14155550123"}
            status, body = await call_action(http, server, call.id, "refer", refer)
            assert (status, body["error"]["code"]) == (409, "invalid_call_state")
    assert twilio_api.requests == []


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("{not json", aiohttp.WSCloseCode.INVALID_TEXT),
        ('["an", "array"]', aiohttp.WSCloseCode.INVALID_TEXT),
        (json.dumps({"event": "media", "media": {"payload": "!!not base64!!"}}), 1007),
        (json.dumps({"event": "media", "media": {"payload": "A" * 70_000}}), 1009),
    ],
)
async def test_broken_messages_close_the_stream_not_the_server(
    served: Served, message: str, code: int
) -> None:
    """Bad JSON, a bad payload or a message over the size limit close that stream, with the
    code that says why; the server takes the next stream as before."""
    server = await served()
    async with aiohttp.ClientSession() as http:
        async with twilio_call(http, server, "MZ0003") as peer:
            await answered_call(server)
            await peer.ws.send_str(message)
            await until(lambda: peer.ws.closed)
            assert peer.ws.close_code == code
        await until(lambda: len(streams_of(server)) == 0)
        async with twilio_call(http, server, "MZ0004"):
            await answered_call(server)


async def test_a_stream_must_start(served: Served) -> None:
    """A stream whose first messages are not ``connected`` and ``start`` is closed."""
    server = await served()
    url = stream_url(server)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url, headers={SIGNATURE_HEADER: signature(AUTH_TOKEN, url)}) as ws,
    ):
        await ws.send_str(json.dumps({"event": "media", "media": {"payload": ""}}))
        message = await ws.receive(timeout=30)
        assert message.type == aiohttp.WSMsgType.CLOSE
        assert ws.close_code == aiohttp.WSCloseCode.INVALID_TEXT
    assert len(streams_of(server)) == 0


# ---------------------------------------------------------------------- audio (real pace)


@pytest.mark.realtime
async def test_a_question_gets_a_spoken_reply_played_out_by_marks(served: Served) -> None:
    """The caller's question gets the reply as media with marks; the response counts as
    played out (``output_audio_buffer.stopped``) once the peer has played it all."""
    server = await served()
    async with aiohttp.ClientSession() as http, on_the_phone(http, server) as (peer, events):
        speaking = asyncio.create_task(peer.say(await speech(QUESTION, RATE)))
        try:
            done = await next_event(events, "response.done")
            assert done["response"]["status"] == "completed"
            await next_event(events, "output_audio_buffer.stopped")
        finally:
            speaking.cancel()
        # Stopped only once the audio had played: all of it, marks and all.
        assert peer.received_samples > 0
        assert peer.played_ms * RATE // 1000 >= peer.received_samples - FRAME
        assert peer.cleared == 0
        assert peer.marks_sent > 0


@pytest.mark.realtime
async def test_barge_in_clears_and_truncates_to_what_was_heard(served: Served) -> None:
    """Speaking over a long reply: the server sends ``clear``, and the item is truncated to
    what the marks say was heard: no more than the peer had played, less than was sent.
    Without echo cancellation: the fake voice is a pure tone, whose echo path AEC3 cannot
    tell from anything else, so it would suppress the caller along with it (the barge-in
    over a real voice's echo is ``test_a_real_barge_in_over_the_echo_still_cuts_the_reply``)."""
    server = await served(FakeLlm(LONG_REPLY), echo_cancellation="off")
    async with aiohttp.ClientSession() as http, on_the_phone(http, server) as (peer, events):
        speaking = asyncio.create_task(peer.say(await speech(QUESTION, RATE)))
        try:
            await next_event(events, "output_audio_buffer.started")
            await until(lambda: peer.played_ms >= 1000)
            speaking.cancel()
            speaking = asyncio.create_task(peer.say(spoken(QUESTION, RATE)))
            truncated = await next_event(events, "conversation.item.truncated")
            await next_event(events, "output_audio_buffer.cleared")
        finally:
            speaking.cancel()
        assert peer.cleared >= 1
        heard = truncated["audio_end_ms"]
        assert 0 < heard <= peer.heard_at_clear[0]
        assert heard * RATE // 1000 < peer.received_samples


# ---------------------------------------------------------------------- echo (real pace)


@pytest.mark.parametrize(("setting", "cancels"), [("sip", True), ("on", True), ("off", False)])
def test_twilio_calls_cancel_echo_as_phone_calls_do(setting: str, cancels: bool) -> None:
    """``--echo-cancellation``: Twilio calls are phone calls, and cancel their echo as SIP
    calls do, with ``sip`` (the default) and ``on``."""
    settings = twilio_settings(rtc_port=0, echo_cancellation=setting)
    app = create_app(settings, engines_sharing_turn(settings))
    (streams,) = [r for r in app[CALL_REGISTRIES] if isinstance(r, TwilioStreams)]
    assert streams.echo_cancellation is cancels


class SpeakerphonePeer(TwilioPeer):
    """Twilio's side of a stream whose caller is on a speakerphone, on one clock: every 20 ms
    it plays the next frame of reply it holds, through ``room`` (``hark.bench.echo.Room``:
    later, quieter, with a room's tail), and sends the microphone's frame: what the caller
    says (``play``, as ``reply_trial``'s microphone) and the echo."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, stream_sid: str, room: Room) -> None:
        self.room = room
        self._voice: deque[npt.NDArray[np.int16]] = deque()
        # When the first voiced sample of what the caller said left (monotonic seconds).
        self.onset_at: float | None = None
        super().__init__(ws, stream_sid)

    @property
    def mic(self) -> SpeakerphonePeer:
        """The caller's microphone: the peer itself."""
        return self

    def play(self, response_id: str, item_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        """The caller says ``pcm`` (at ``rate``) from the next frame on."""
        said = resample(pcm, rate, RATE)
        self._voice.extend(said[k : k + FRAME] for k in range(0, len(said) - FRAME + 1, FRAME))

    def finish(self, response_id: str) -> None:
        """Nothing follows what the caller says."""

    async def _play(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for tick in itertools.count():
            await asyncio.sleep(max(0.0, start + tick * 0.02 - loop.time()))
            position = tick * FRAME
            # Marks after the frame played last: its audio has been heard.
            while self._buffer and self._buffer[0][0] == "mark":
                await self._echo(self._buffer.popleft()[1])
            if self._buffer:
                frame = self._buffer.popleft()[1]
                self.played.append(frame)
                self.room.heard(frame, position)
            own = self._voice.popleft() if self._voice else np.zeros(FRAME, np.int16)
            if self.onset_at is None and int(np.max(np.abs(own))) > 1000:
                self.onset_at = time.monotonic()
            mixed = own + self.room.echo(position, FRAME)
            pcm = np.clip(np.rint(mixed), -32768, 32767).astype(np.int16)
            media = {"track": "inbound", "payload": base64.b64encode(ulaw_encode(pcm)).decode()}
            await self.send({"event": "media", "media": media})


class SpeakerphoneLine:
    """``reply_trial``'s line over a Twilio call: the speakerphone's microphone, and the
    call's events on its sideband (``run``), each stamped with its arrival."""

    def __init__(self, peer: SpeakerphonePeer, sideband: aiohttp.ClientWebSocketResponse) -> None:
        self.peer = peer
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue(4096)
        self._sideband = sideband
        self._outbox: asyncio.Queue[str] = asyncio.Queue(64)

    @property
    def mic(self) -> SpeakerphonePeer:
        """The caller's microphone."""
        return self.peer

    def send(self, event: dict[str, Any]) -> None:
        """A client event, sent on the sideband by ``run``."""
        self._outbox.put_nowait(json.dumps(event))

    async def run(self) -> None:
        """Send the client events and take in the server's until the sideband closes."""
        sender = asyncio.create_task(self._send_all())
        try:
            async for message in self._sideband:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                self.events.put_nowait({**json.loads(message.data), "_received": time.monotonic()})
        finally:
            sender.cancel()

    async def _send_all(self) -> None:
        while True:
            await self._sideband.send_str(await self._outbox.get())


@contextlib.asynccontextmanager
async def on_a_speakerphone(
    served: Served, *, echo_cancellation: str
) -> AsyncIterator[SpeakerphoneLine]:
    """A Twilio call to a server with Piper's voice (``echo_cancellation`` as set), from a
    speakerphone whose reply comes back ``ECHO_DELAY_MS`` later and ``ECHO_GAIN_DB``
    quieter, with ``hark bench echo``'s session."""
    server = await served(tts="piper", echo_cancellation=echo_cancellation)
    room = Room(ECHO_DELAY_MS, ECHO_GAIN_DB, RATE)
    async with (
        aiohttp.ClientSession() as http,
        twilio_call(http, server, peer_of=lambda ws, sid: SpeakerphonePeer(ws, sid, room)) as peer,
    ):
        call_id = await answered_call(server)
        async with sideband(http, server, call_id) as events:
            await next_event(events, "session.created")
            await events.send_str(json.dumps({"type": "session.update", "session": SESSION}))
            await next_event(events, "session.updated")
            assert isinstance(peer, SpeakerphonePeer)
            line = SpeakerphoneLine(peer, events)
            running = asyncio.create_task(line.run())
            try:
                yield line
            finally:
                running.cancel()


ECHO_DELAY_MS = 150
ECHO_GAIN_DB = -6.0


@pytest.mark.slow
@pytest.mark.realtime
async def test_an_echoed_reply_does_not_cut_itself(served: Served) -> None:
    """With echo cancellation (the default for phone calls), the reply heard again through
    the caller's room plays out whole, after the first reply (AEC3 finds the echo path
    during its first second or so of echo: docs/echo.md, Limits)."""
    async with on_a_speakerphone(served, echo_cancellation="sip") as line:
        await reply_trial(line, None, line.peer.room)
        for _ in range(2):
            trial = await reply_trial(line, None, line.peer.room)
            assert trial.status == "completed"
            assert not trial.cut
            assert not trial.self_interrupted


@pytest.mark.slow
@pytest.mark.realtime
async def test_a_real_barge_in_over_the_echo_still_cuts_the_reply(served: Served) -> None:
    """A caller who says "wait, stop" over the reply's echo is heard, and the reply is cut."""
    async with on_a_speakerphone(served, echo_cancellation="sip") as line:
        await reply_trial(line, None, line.peer.room)
        trial = await reply_trial(line, spoken(BARGE_IN, SPEECH_RATE), line.peer.room)
        assert not trial.self_interrupted
        assert trial.detected_ms is not None
        assert trial.cut


@pytest.mark.slow
@pytest.mark.realtime
async def test_without_echo_cancellation_the_echo_cuts_the_reply(served: Served) -> None:
    """``--echo-cancellation off``: the echo is taken for the caller and cuts the reply (so
    the first test can fail)."""
    async with on_a_speakerphone(served, echo_cancellation="off") as line:
        trial = await reply_trial(line, None, line.peer.room)
        assert trial.self_interrupted
        assert trial.cut


# ---------------------------------------------------------------------- the embedded models


@pytest.mark.slow
@pytest.mark.realtime
async def test_the_embedded_models_answer_a_caller_and_yield_to_a_barge_in(
    served: Served,
) -> None:
    """A spoken question gets a spoken answer that Whisper hears as the reply's transcript;
    then a caller who speaks over a long answer gets a ``clear`` and the item truncated to
    what had been heard."""
    server = await served(engines="embedded")
    async with aiohttp.ClientSession() as http, on_the_phone(http, server) as (peer, events):
        session = {
            "type": "realtime",
            "audio": {"input": {"transcription": {"model": "whisper-1"}}},
        }
        await events.send_str(json.dumps({"type": "session.update", "session": session}))
        await next_event(events, "session.updated")
        speaking = asyncio.create_task(peer.say(await speech(QUESTION, RATE)))
        try:
            transcript = await next_event(events, "response.output_audio_transcript.done")
            await next_event(events, "output_audio_buffer.stopped")
        finally:
            speaking.cancel()
        reply = np.concatenate(peer.played)
        recognised = await transcribe(reply, RATE)
        expected = set(words(transcript["transcript"]))
        assert len(set(words(recognised)) & expected) >= max(1, len(expected) // 2), (
            recognised,
            transcript["transcript"],
        )

        long_answers = "Answer every question at length, in at least six full sentences."
        update = {"type": "realtime", "instructions": long_answers}
        await events.send_str(json.dumps({"type": "session.update", "session": update}))
        await next_event(events, "session.updated")
        played_before = peer.played_ms
        speaking = asyncio.create_task(peer.say(await speech(LONG_QUESTION, RATE)))
        try:
            await next_event(events, "output_audio_buffer.started")
            await until(lambda: peer.played_ms >= played_before + 1500)
            speaking.cancel()
            speaking = asyncio.create_task(peer.say(await speech(INTERRUPTION, RATE)))
            truncated = await next_event(events, "conversation.item.truncated")
        finally:
            speaking.cancel()
        assert peer.cleared >= 1
        assert 0 < truncated["audio_end_ms"] <= peer.heard_at_clear[-1] - played_before

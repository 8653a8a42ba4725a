"""SIP call control the way OpenAI does it, against a real ``hark serve --engines fake``: a
caller's INVITE raises a signed ``realtime.call.incoming`` webhook, and the official SDK's
``client.realtime.calls.accept/reject/refer/hangup`` drive the call, which the caller (the
benches' SIP caller over loopback UDP) sees as SIP: 200 OK with SDP, 603/486, REFER, BYE."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import secrets
import signal
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.webhooks import RealtimeCallIncomingWebhookEvent

from hark.bench.sip import SipCaller, SipMessage
from hark.protocol import server_events as se
from hark.session.core import Session
from tests.server.webhook_receiver import WebhookReceiver, webhook_receiver
from tests.servers import HarkProcess

API_KEY = "sk-test-sip-0123456789abcdef"
SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
ACCEPT_TIMEOUT_S = 6
# A PCMU payload of silence is all 0xFF (the G.711 µ-law code of zero).
_PCMU_SILENCE = 0xFF


@dataclass
class PhoneServer:
    """A running server, where its SIP listens, and the backend's webhook endpoint."""

    url: str
    sip: tuple[str, int]
    receiver: WebhookReceiver
    log: Path


def sip_port(log: Path) -> int:
    """The SIP port the server logged (it was started with ``--sip-port 0``)."""
    found = re.search(r"SIP listening on \S+ port (\d+)", log.read_text())
    assert found is not None, log.read_text()[-2000:]
    return int(found.group(1))


@pytest.fixture(scope="module")
def phone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PhoneServer]:
    """One server for the module, raising webhooks to a receiver of the test's own."""
    with webhook_receiver() as receiver:
        log = tmp_path_factory.mktemp("sip") / "hark.log"
        args = ["--engines", "fake", "--rtp-ports", "0", "--sip-webhook-url", receiver.url]
        args += ["--sip-accept-timeout", str(ACCEPT_TIMEOUT_S)]
        env = {"HARK_API_KEYS": API_KEY, "HARK_SIP_WEBHOOK_SECRET": SECRET}
        with HarkProcess(args, log, env=env) as server:
            yield PhoneServer(server.url, ("127.0.0.1", sip_port(log)), receiver, log)


@pytest.fixture
async def client(phone_server: PhoneServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official SDK, pointed at the server."""
    sdk = openai.AsyncOpenAI(
        api_key=API_KEY, base_url=phone_server.url + "/v1", webhook_secret=SECRET, max_retries=0
    )
    async with sdk:
        yield sdk


@pytest.fixture
async def caller(phone_server: PhoneServer) -> AsyncIterator[SipCaller]:
    """A phone calling the server."""
    async with SipCaller(phone_server.sip) as phone:
        yield phone


async def incoming(
    server: PhoneServer, client: openai.AsyncOpenAI, phone: SipCaller
) -> RealtimeCallIncomingWebhookEvent:
    """The verified webhook of ``phone``'s call (those of other calls are passed over)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        delivery = await asyncio.to_thread(server.receiver.next, deadline - time.monotonic())
        event = client.webhooks.unwrap(delivery.body, delivery.headers)
        assert isinstance(event, RealtimeCallIncomingWebhookEvent)
        headers = {h.name.lower(): h.value for h in event.data.sip_headers}
        if headers.get("call-id") == phone.call_id:
            return event
    raise AssertionError("no webhook for the call")


@contextlib.asynccontextmanager
async def sideband(
    server: PhoneServer, call_id: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A sideband WebSocket attached to the call."""
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            f"{server.url.replace('http', 'ws')}/v1/realtime?call_id={call_id}",
            headers={"Authorization": f"Bearer {API_KEY}"},
        ) as ws,
    ):
        yield ws


async def next_event(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    """The next server event of type ``kind`` on the sideband."""
    while True:
        message = await asyncio.wait_for(ws.receive(), 30)
        assert message.type is aiohttp.WSMsgType.TEXT, message
        event: dict[str, Any] = json.loads(message.data)
        if event["type"] == kind:
            return event


async def answered(server: PhoneServer, client: openai.AsyncOpenAI, phone: SipCaller) -> str:
    """Place a call and accept it with the SDK; the call id."""
    final = asyncio.create_task(phone.call())
    event = await incoming(server, client, phone)
    await client.realtime.calls.accept(event.data.call_id, type="realtime")
    assert (await final).status == 200
    # Its microphone starts, as a phone's does: the server sends RTP only to where the
    # caller's comes from, once it has come.
    phone.tick(time.monotonic())
    return event.data.call_id


async def test_the_webhook_is_signed_and_accept_answers_with_sdp(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    final = asyncio.create_task(
        caller.call((("X-Customer", "42"), ("Authorization", 'Digest username="alice"')))
    )
    event = await incoming(phone_server, client, caller)
    assert event.type == "realtime.call.incoming" and event.object == "event"
    assert event.id.startswith("evt_") and event.data.call_id.startswith("rtc_")
    assert abs(event.created_at - time.time()) < 300
    names = [h.name.lower() for h in event.data.sip_headers]
    assert ("x-customer", "42") in [(h.name.lower(), h.value) for h in event.data.sip_headers]
    assert "authorization" not in names
    assert names.index("via") < names.index("x-customer")

    await client.realtime.calls.accept(
        event.data.call_id, type="realtime", instructions="Greet the caller."
    )
    answer = await final
    assert caller.provisional[-1] == 180
    assert answer.status == 200 and answer.header("content-type") == "application/sdp"
    assert "m=audio " in caller.answer_sdp and "PCMU/8000" in caller.answer_sdp
    assert caller.server_rtp is not None and caller.server_rtp[1] > 0
    # Accepted once is accepted: a second accept is a conflict, not a second session.
    with pytest.raises(openai.ConflictError):
        await client.realtime.calls.accept(event.data.call_id, type="realtime")
    await client.realtime.calls.hangup(event.data.call_id)
    assert (await caller.request("BYE")).method == "BYE"


async def test_a_greeting_asked_for_at_accept_is_heard_from_its_start(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    call_id = await answered(phone_server, client, caller)
    async with sideband(phone_server, call_id) as ws:
        # Events made before the sideband attached wait for it.
        created = await next_event(ws, "session.created")
        assert created["session"]["type"] == "realtime"
        await ws.send_str(json.dumps({"type": "response.create"}))
        started = await next_event(ws, "output_audio_buffer.started")
        assert started["response_id"].startswith("resp_")
        # The reply's audio reaches the phone: RTP payloads that are not silence.
        for _ in range(500):
            packet = await caller.next_rtp()
            if any(byte != _PCMU_SILENCE for byte in packet.payload):
                break
        else:
            raise AssertionError("the phone heard nothing but silence")
        await next_event(ws, "output_audio_buffer.stopped")
    await client.realtime.calls.hangup(call_id)
    await caller.request("BYE")


async def test_the_media_waits_for_the_ack_and_then_starts_with_the_greeting(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    final = asyncio.create_task(caller.call(ack=False))
    event = await incoming(phone_server, client, caller)
    await client.realtime.calls.accept(event.data.call_id, type="realtime")
    assert (await final).status == 200
    async with sideband(phone_server, event.data.call_id) as ws:
        await ws.send_str(json.dumps({"type": "response.create"}))
        # The whole greeting is made, but the phone has not taken the answer yet: nothing
        # may have been sent to it (it would drop it), nor counted as heard.
        done = await next_event(ws, "response.done")
        assert done["response"]["status"] == "completed"
        assert caller.received == []
        caller.send_ack()
        caller.tick(time.monotonic())
        started = await next_event(ws, "output_audio_buffer.started")
        assert started["response_id"] == done["response"]["id"]
        # The first packet the phone gets is the greeting's first 20 ms.
        first = await caller.next_rtp()
        assert any(byte != _PCMU_SILENCE for byte in first.payload)
    await client.realtime.calls.hangup(event.data.call_id)
    await caller.request("BYE")


async def test_keypad_presses_reach_the_sideband_as_dtmf_events(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    call_id = await answered(phone_server, client, caller)
    async with sideband(phone_server, call_id) as ws:
        await next_event(ws, "session.created")
        # The media starts at the ACK; the first RTP from the server says it listens.
        await caller.next_rtp()
        before = int(time.time())
        caller.send_dtmf("7")
        event = await next_event(ws, "input_audio_buffer.dtmf_event_received")
        assert event["event"] == "7"
        assert before <= event["received_at"] <= int(time.time())
        await caller.in_dialog(
            "INFO", b"Signal=#\r\nDuration=160\r\n", (("Content-Type", "application/dtmf-relay"),)
        )
        event = await next_event(ws, "input_audio_buffer.dtmf_event_received")
        assert event["event"] == "#"
    await client.realtime.calls.hangup(call_id)
    await caller.request("BYE")


@pytest.mark.parametrize(("status", "expected"), [(None, 603), (486, 486)])
async def test_reject_answers_the_invite_with_the_status(
    phone_server: PhoneServer,
    client: openai.AsyncOpenAI,
    caller: SipCaller,
    status: int | None,
    expected: int,
) -> None:
    final = asyncio.create_task(caller.call())
    event = await incoming(phone_server, client, caller)
    if status is None:
        await client.realtime.calls.reject(event.data.call_id)
    else:
        await client.realtime.calls.reject(event.data.call_id, status_code=status)
    assert (await final).status == expected
    # The call is gone.
    with pytest.raises(openai.NotFoundError):
        await client.realtime.calls.hangup(event.data.call_id)


async def test_reject_refuses_a_status_that_is_not_a_sip_error(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    final = asyncio.create_task(caller.call())
    event = await incoming(phone_server, client, caller)
    with pytest.raises(openai.BadRequestError):
        await client.realtime.calls.reject(event.data.call_id, status_code=200)
    # A ringing call cannot be transferred.
    with pytest.raises(openai.ConflictError):
        await client.realtime.calls.refer(event.data.call_id, target_uri="tel:+14155550123")
    await client.realtime.calls.reject(event.data.call_id)
    assert (await final).status == 603


async def test_refer_sends_a_refer_and_reports_the_transfer(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    call_id = await answered(phone_server, client, caller)
    with pytest.raises(openai.BadRequestError):
        await client.realtime.calls.refer(call_id, target_uri="http://example.com/")
    with pytest.raises(openai.BadRequestError):
        await client.realtime.calls.refer(call_id, target_uri="sip:a@b>\r\nX-Evil: 1")
    transfer = asyncio.create_task(
        client.realtime.calls.refer(call_id, target_uri="tel:+14155550123")
    )
    refer: SipMessage = await caller.request("REFER")
    assert "tel:+14155550123" in refer.header("refer-to")
    assert refer.header("referred-by")
    await caller.notify_transfer("SIP/2.0 200 OK")
    await asyncio.wait_for(transfer, 30)
    # The transferred phone hangs up its leg to hark.
    await caller.in_dialog("BYE")


async def test_a_call_not_accepted_in_time_is_rejected(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    ringing = asyncio.create_task(caller.call(limit_s=ACCEPT_TIMEOUT_S + 30))
    event = await incoming(phone_server, client, caller)
    final = await ringing
    assert 400 <= final.status < 700
    with pytest.raises(openai.NotFoundError):
        await client.realtime.calls.accept(event.data.call_id, type="realtime")


async def test_bye_from_the_phone_ends_the_call(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    call_id = await answered(phone_server, client, caller)
    assert (await caller.in_dialog("BYE")).status == 200
    try:
        async with asyncio.timeout(30):
            while True:
                try:
                    await client.realtime.calls.hangup(call_id)
                except openai.NotFoundError:
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError("the call outlived the phone's BYE") from None


@pytest.mark.parametrize("action", ["accept", "reject", "refer", "hangup"])
async def test_an_unknown_call_is_not_found(client: openai.AsyncOpenAI, action: str) -> None:
    calls = client.realtime.calls
    with pytest.raises(openai.NotFoundError):
        if action == "accept":
            await calls.accept("rtc_nosuchcall", type="realtime")
        elif action == "reject":
            await calls.reject("rtc_nosuchcall")
        elif action == "refer":
            await calls.refer("rtc_nosuchcall", target_uri="sip:agent@example.com")
        else:
            await calls.hangup("rtc_nosuchcall")


async def test_without_a_webhook_a_call_is_answered_at_once(tmp_path: Path) -> None:
    log = tmp_path / "hark.log"
    session = json.dumps({"instructions": "You answer the phone."})
    with HarkProcess(["--engines", "fake", "--rtp-ports", "0", "--sip-session", session], log):
        async with SipCaller(("127.0.0.1", sip_port(log))) as phone:
            assert (await phone.call()).status == 200
            assert "PCMU/8000" in phone.answer_sdp
            phone.tick(time.monotonic())
            await phone.next_rtp()
            assert (await phone.in_dialog("BYE")).status == 200


def test_a_sip_port_in_use_leaves_the_server_up_and_readyz_says_so(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        log = tmp_path / "hark.log"
        with (
            HarkProcess(["--engines", "fake", "--sip-port", str(port)], log) as server,
            urllib.request.urlopen(f"{server.url}/readyz", timeout=5) as response,
        ):
            body = json.loads(response.read())
    assert body["status"] == "ready"
    assert str(port) in body["unavailable"]["sip"]


def test_a_keypad_press_becomes_one_server_event() -> None:
    session = Session(model="gpt-realtime", vad_chunk_ms=32, asr_rate=16000, created_at=100.0)
    session.start()
    session.drain()
    session.receive_dtmf("9", now=123.75)
    outputs = session.drain()
    assert len(outputs) == 1
    event = outputs[0]
    assert isinstance(event, se.InputAudioBufferDtmfEventReceived)
    assert (event.event, event.received_at) == ("9", 123)
    wire = json.loads(se.encode_event(event))
    assert wire["type"] == "input_audio_buffer.dtmf_event_received"


async def test_an_ephemeral_key_cannot_answer_a_call(
    phone_server: PhoneServer, client: openai.AsyncOpenAI, caller: SipCaller
) -> None:
    secret = await client.realtime.client_secrets.create(session={"type": "realtime"})
    ephemeral = openai.AsyncOpenAI(
        api_key=secret.value, base_url=phone_server.url + "/v1", max_retries=0
    )
    final = asyncio.create_task(caller.call())
    event = await incoming(phone_server, client, caller)
    async with ephemeral:
        with pytest.raises(openai.PermissionDeniedError):
            await ephemeral.realtime.calls.accept(event.data.call_id, type="realtime")
        with pytest.raises(openai.PermissionDeniedError):
            await ephemeral.realtime.calls.reject(event.data.call_id)
    await client.realtime.calls.reject(event.data.call_id)
    assert (await final).status == 603


async def test_accepted_calls_count_against_the_keys_session_limit(tmp_path: Path) -> None:
    with webhook_receiver() as receiver:
        log = tmp_path / "hark.log"
        args = ["--engines", "fake", "--rtp-ports", "0", "--sip-webhook-url", receiver.url]
        env = {"HARK_API_KEYS": API_KEY, "HARK_SIP_WEBHOOK_SECRET": SECRET}
        with HarkProcess([*args, "--key-max-sessions", "1"], log, env=env) as server:
            phones = PhoneServer(server.url, ("127.0.0.1", sip_port(log)), receiver, log)
            sdk = openai.AsyncOpenAI(
                api_key=API_KEY, base_url=server.url + "/v1", webhook_secret=SECRET, max_retries=0
            )
            async with sdk, SipCaller(phones.sip) as first, SipCaller(phones.sip) as second:
                first_id = await answered(phones, sdk, first)
                final = asyncio.create_task(second.call())
                event = await incoming(phones, sdk, second)
                with pytest.raises(openai.RateLimitError):
                    await sdk.realtime.calls.accept(event.data.call_id, type="realtime")
                await sdk.realtime.calls.hangup(first_id)
                await first.request("BYE")
                # The first call's end gave its session back: the second call is accepted
                # once it has (retried for up to 20 s, well inside the 30 s the phone rings).
                async with asyncio.timeout(20):
                    while True:
                        try:
                            await sdk.realtime.calls.accept(event.data.call_id, type="realtime")
                            break
                        except openai.RateLimitError:
                            await asyncio.sleep(0.05)
                assert (await final).status == 200
                await sdk.realtime.calls.hangup(event.data.call_id)


async def test_a_draining_server_ends_its_calls_with_bye(tmp_path: Path) -> None:
    log = tmp_path / "hark.log"
    args = ["--engines", "fake", "--rtp-ports", "0", "--drain-timeout", "1"]
    with HarkProcess(args, log) as server:
        async with SipCaller(("127.0.0.1", sip_port(log))) as phone:
            assert (await phone.call()).status == 200
            server.signal(signal.SIGTERM)
            assert (await phone.request("BYE")).method == "BYE"
        assert server.wait(30) == 0


async def test_a_webhook_still_being_retried_does_not_keep_the_phone_ringing(
    tmp_path: Path,
) -> None:
    log = tmp_path / "hark.log"
    timeout_s = 2
    # The receiver fails every attempt: the delivery's retries (0.5, 1, 2, 4, 8 s apart) last
    # well beyond the accept timeout.
    with webhook_receiver([500] * 6) as receiver:
        args = ["--engines", "fake", "--rtp-ports", "0", "--sip-webhook-url", receiver.url]
        args += ["--sip-accept-timeout", str(timeout_s)]
        env = {"HARK_API_KEYS": API_KEY, "HARK_SIP_WEBHOOK_SECRET": SECRET}
        with HarkProcess(args, log, env=env):
            async with SipCaller(("127.0.0.1", sip_port(log))) as phone:
                final = await phone.call(limit_s=60)
                attempts = len(receiver.received)
    assert final.status == 480
    # Rejected at the timeout, while the webhook was still being retried.
    assert 1 <= attempts < 6

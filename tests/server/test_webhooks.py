"""Webhooks: signed so that the official SDK's ``client.webhooks.unwrap`` verifies them,
delivered with retries and backoff, bounded, and never logging the secret."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import time

import openai
import pytest
from openai.types.webhooks import RealtimeCallIncomingWebhookEvent

from hark.config import ConfigError, load_settings
from hark.protocol.webhook_signing import WebhookSecretError, secret_key, signed_headers
from hark.server.webhooks import Delivery, WebhookSender, incoming_call_event
from tests.server.webhook_receiver import webhook_receiver

SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
HEADERS = [
    ("Via", "SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK1"),
    ("From", "<sip:alice@example.com>;tag=1"),
    ("To", "<sip:hark@example.com>"),
    ("Authorization", 'Digest username="alice", response="secret"'),
    ("X-Account", "42"),
    ("X-Account", "43"),
]


def sdk() -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-unused", webhook_secret=SECRET)


def test_the_sdk_unwraps_a_signed_incoming_call_event() -> None:
    event = incoming_call_event("evt_1", "rtc_abc", HEADERS, created_at=1_700_000_000)
    body = json.dumps(event).encode()
    headers = signed_headers(secret_key(SECRET), "evt_1", int(time.time()), body)
    unwrapped = sdk().webhooks.unwrap(body, headers)
    assert isinstance(unwrapped, RealtimeCallIncomingWebhookEvent)
    assert unwrapped.id == "evt_1"
    assert unwrapped.object == "event"
    assert unwrapped.data.call_id == "rtc_abc"
    assert [(h.name, h.value) for h in unwrapped.data.sip_headers] == [
        h for h in HEADERS if h[0] != "Authorization"
    ]
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk().webhooks.unwrap(body.replace(b"rtc_abc", b"rtc_abd"), headers)
    other = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk().webhooks.unwrap(body, headers, secret=other)


def test_a_whsec_secret_must_be_base64() -> None:
    with pytest.raises(WebhookSecretError):
        secret_key("whsec_not base64!")
    plain = "s" * 24  # the shortest taken
    assert secret_key(plain) == plain.encode()


@pytest.mark.parametrize(
    "secret", ["", "x", "k" * 23, "whsec_" + base64.b64encode(b"k" * 23).decode()]
)
def test_a_short_secret_is_refused(secret: str) -> None:
    with pytest.raises(WebhookSecretError, match="at least 24"):
        secret_key(secret)
    with pytest.raises(ConfigError, match="sip_webhook_secret"):
        load_settings({"sip_webhook_secret": secret})


async def test_a_failing_receiver_gets_the_event_again_with_backoff() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    results: list[Delivery] = []
    with webhook_receiver(statuses=[500, 503]) as receiver:
        sender = WebhookSender(
            receiver.url, SECRET, first_delay_s=0.25, sleep=sleep, on_result=results.append
        )
        try:
            event = incoming_call_event(sender.new_event_id(), "rtc_x", HEADERS, created_at=1)
            task = sender.send(event)
            assert task is not None
            delivery = await asyncio.wait_for(task, 30)
        finally:
            await sender.aclose()
    assert delivery.delivered and delivery.attempts == 3 and delivery.status == 200
    assert results == [delivery]
    assert waits == [0.25, 0.5]
    assert len(receiver.received) == 3
    # Every attempt carries the same id (the receiver's key for duplicates) and verifies.
    assert {r.headers["webhook-id"] for r in receiver.received} == {event["id"]}
    for received in receiver.received:
        unwrapped = sdk().webhooks.unwrap(received.body, received.headers)
        assert isinstance(unwrapped, RealtimeCallIncomingWebhookEvent)
        assert unwrapped.data.call_id == "rtc_x"


async def test_delivery_gives_up_after_max_attempts() -> None:
    async def sleep(seconds: float) -> None:
        return None

    with webhook_receiver(statuses=[500] * 10) as receiver:
        sender = WebhookSender(receiver.url, SECRET, max_attempts=4, sleep=sleep)
        try:
            task = sender.send(incoming_call_event("evt_2", "rtc_y", [], created_at=1))
            assert task is not None
            delivery = await asyncio.wait_for(task, 30)
        finally:
            await sender.aclose()
    assert delivery == Delivery("evt_2", False, 4, 500)
    assert len(receiver.received) == 4


async def test_an_unreachable_receiver_counts_as_a_failed_attempt() -> None:
    async def sleep(seconds: float) -> None:
        return None

    with webhook_receiver() as receiver:
        url = receiver.url
    # The receiver is gone: nothing listens on its port any more.
    sender = WebhookSender(url, SECRET, max_attempts=2, sleep=sleep)
    try:
        task = sender.send(incoming_call_event("evt_3", "rtc_z", [], created_at=1))
        assert task is not None
        delivery = await asyncio.wait_for(task, 30)
    finally:
        await sender.aclose()
    assert delivery == Delivery("evt_3", False, 2, None)


def test_the_backoff_doubles_up_to_its_ceiling() -> None:
    sender = WebhookSender("http://127.0.0.1:9/", SECRET, first_delay_s=1, max_delay_s=5)
    assert [sender.delay(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]


async def test_pending_deliveries_are_bounded() -> None:
    never = asyncio.Event()

    async def sleep(seconds: float) -> None:
        await never.wait()

    with webhook_receiver(statuses=[500] * 10) as receiver:
        sender = WebhookSender(receiver.url, SECRET, max_pending=2, sleep=sleep)
        try:
            first = sender.send(incoming_call_event("evt_a", "rtc_a", [], created_at=1))
            second = sender.send(incoming_call_event("evt_b", "rtc_b", [], created_at=1))
            third = sender.send(incoming_call_event("evt_c", "rtc_c", [], created_at=1))
            assert first is not None and second is not None
            assert third is None
            assert sender.pending == 2
        finally:
            await sender.aclose()
        assert sender.pending == 0


async def test_the_secret_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def sleep(seconds: float) -> None:
        return None

    caplog.set_level(logging.DEBUG)
    with webhook_receiver(statuses=[500]) as receiver:
        sender = WebhookSender(receiver.url, SECRET, sleep=sleep)
        try:
            task = sender.send(incoming_call_event("evt_4", "rtc_w", [], created_at=1))
            assert task is not None
            await asyncio.wait_for(task, 30)
        finally:
            await sender.aclose()
        logging.getLogger("test").info("sender: %r", sender)
    key = SECRET.removeprefix("whsec_")
    assert "evt_4" in caplog.text
    assert key not in caplog.text and SECRET not in caplog.text

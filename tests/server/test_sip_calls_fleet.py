"""SIP call control across a fleet: the phone calls one server, the backend's SDK talks to
another, and every request reaches the call's owner (two real servers, one real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from hark.bench.sip import SipCaller
from tests.redis_server import RedisServer
from tests.server.test_sip_calls import (
    API_KEY,
    SECRET,
    PhoneServer,
    incoming,
    sip_port,
)
from tests.server.webhook_receiver import webhook_receiver
from tests.servers import HarkProcess

pytestmark = pytest.mark.slow  # real processes and a real Redis


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, for this module's servers."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


async def test_the_sdk_controls_a_call_through_another_server(
    tmp_path: Path, redis: RedisServer
) -> None:
    env = {
        "HARK_API_KEYS": API_KEY,
        "HARK_SIP_WEBHOOK_SECRET": SECRET,
        "HARK_FLEET_SECRET": "fleet-secret-of-the-sip-fleet-tests-0123",
    }
    fleet = ["--engines", "fake", "--rtp-ports", "0", "--redis-url", redis.url]
    with (
        webhook_receiver() as receiver,
        HarkProcess([*fleet, "--sip-webhook-url", receiver.url], tmp_path / "a.log", env=env),
        HarkProcess(fleet, tmp_path / "b.log", env=env) as other,
    ):
        phones = PhoneServer(
            other.url, ("127.0.0.1", sip_port(tmp_path / "a.log")), receiver, tmp_path / "a.log"
        )
        sdk = openai.AsyncOpenAI(
            api_key=API_KEY, base_url=other.url + "/v1", webhook_secret=SECRET, max_retries=0
        )
        async with sdk, SipCaller(phones.sip) as phone, SipCaller(phones.sip) as declined:
            final = asyncio.create_task(phone.call())
            event = await incoming(phones, sdk, phone)
            await sdk.realtime.calls.accept(event.data.call_id, type="realtime")
            assert (await final).status == 200
            transfer = asyncio.create_task(
                sdk.realtime.calls.refer(event.data.call_id, target_uri="sip:agent@example.com")
            )
            refer = await phone.request("REFER")
            assert "sip:agent@example.com" in refer.header("refer-to")
            await phone.notify_transfer("SIP/2.0 200 OK")
            await asyncio.wait_for(transfer, 30)
            await sdk.realtime.calls.hangup(event.data.call_id)
            await phone.request("BYE")

            final = asyncio.create_task(declined.call())
            event = await incoming(phones, sdk, declined)
            await sdk.realtime.calls.reject(event.data.call_id, status_code=486)
            assert (await final).status == 486
            with pytest.raises(openai.NotFoundError):
                await sdk.realtime.calls.hangup(event.data.call_id)

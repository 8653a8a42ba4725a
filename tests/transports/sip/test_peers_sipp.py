"""SIPp, a real SIP peer, calling ``hark serve --engines fake`` over loopback UDP and TCP.

Each test places one call from a scenario in ``scenarios/``; with a webhook configured the
test plays the customer's backend with the official SDK (``client.webhooks.unwrap`` on the
receiver, ``client.realtime.calls.*`` against hark) and watches the call on the sideband
WebSocket. What the phone saw is SIPp's verdict (the scenario ran to its end) and its
message trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.transports.sip.conftest import (
    API_KEY,
    SippRun,
    SipServer,
    WebhookSipServer,
    run_sipp,
    sip_serve,
)

pytestmark = pytest.mark.realtime

# Bounds a hang, never speed.
LIVENESS_S = 30.0


class Sideband:
    """The call's sideband WebSocket (``/v1/realtime?call_id=``), every event kept."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    async def until(
        self, done: Callable[[list[dict[str, Any]]], bool], limit_s: float = LIVENESS_S
    ) -> list[dict[str, Any]]:
        """Read events until ``done(events so far)``; fails after ``limit_s``."""
        async with asyncio.timeout(limit_s):
            while not done(self.events):
                message = await self.ws.receive()
                if message.type != aiohttp.WSMsgType.TEXT:
                    raise AssertionError(f"sideband ended: {message!r}; events {self.types()}")
                self.events.append(json.loads(message.data))
        return self.events

    def types(self) -> list[str]:
        """The types of the events so far."""
        return [event["type"] for event in self.events]


@contextlib.asynccontextmanager
async def sideband(server: SipServer, call_id: str) -> AsyncIterator[Sideband]:
    """Attach to a call's sideband as the customer's backend would."""
    url = server.url.replace("http://", "ws://") + f"/v1/realtime?call_id={call_id}"
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url, headers={"Authorization": f"Bearer {API_KEY}"})
        try:
            yield Sideband(ws)
        finally:
            await ws.close()


def final_status(run: SippRun) -> int:
    """The status of the last final response the phone received to its INVITE."""
    statuses = [
        int(message.split(" ", 2)[1])
        for message in run.received()
        if message.startswith("SIP/2.0 ") and "INVITE" in _header(message, "CSeq")
    ]
    finals = [status for status in statuses if status >= 200]
    assert finals, run.describe()
    return finals[-1]


def _header(message: str, name: str) -> str:
    for line in message.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return ""


def has(kind: str, count: int = 1) -> Callable[[list[dict[str, Any]]], bool]:
    """A ``Sideband.until`` condition: ``count`` events of type ``kind`` have arrived."""
    return lambda events: sum(event["type"] == kind for event in events) >= count


# ---------------------------------------------------------------------- no webhook


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_options_is_answered(sip_server: SipServer, tmp_path: Path, transport: str) -> None:
    run = await run_sipp("options", sip_server.sip_port, tmp_path, transport=transport)
    assert run.ok, run.describe()
    assert run.received()[0].startswith("SIP/2.0 200"), run.describe()


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_a_call_without_a_webhook_is_answered_at_once(
    sip_server: SipServer, tmp_path: Path, transport: str
) -> None:
    # A PBX can dial hark with nothing else running: the caller speaks, then hangs up.
    run = await run_sipp("uac_rtp", sip_server.sip_port, tmp_path, transport=transport)
    assert run.ok, run.describe()
    answer = next(m for m in run.received() if m.startswith("SIP/2.0 200") and "m=audio" in m)
    assert "Content-Type: application/sdp" in answer
    # PCMU is the offer's first codec.
    assert "RTP/AVP 0" in answer, answer
    assert sip_server.alive()


async def test_hold_and_resume_by_re_invite(sip_server: SipServer, tmp_path: Path) -> None:
    run = await run_sipp("uac_hold", sip_server.sip_port, tmp_path)
    assert run.ok, run.describe()
    answers = [m for m in run.received() if m.startswith("SIP/2.0 200") and "m=audio" in m]
    assert len(answers) == 3, run.describe()
    # hark mirrors the caller's direction: sendonly (hold) → recvonly, then sendrecv again.
    assert "a=recvonly" in answers[1], answers[1]
    assert "a=recvonly" not in answers[2] and "a=sendonly" not in answers[2], answers[2]
    # Each new answer is a new version of hark's session description.
    versions = [int(_header_sdp(answer, "o").split()[2]) for answer in answers]
    assert versions[0] < versions[1] < versions[2], versions
    assert sip_server.alive()


def _header_sdp(message: str, kind: str) -> str:
    body = message.partition("\n\n")[2]
    return next(line[2:] for line in body.splitlines() if line.startswith(f"{kind}="))


async def test_an_answer_never_acknowledged_ends_with_bye(tmp_path: Path) -> None:
    # 64·T1 of retransmitted 200 OKs, then the server gives up and hangs up; T1 as a closed
    # network may set it, 50 ms, makes that 3.2 s rather than 32.
    with sip_serve(tmp_path / "hark.log", "--sip-t1-ms", "50") as server:
        run = await run_sipp("uac_never_ack", server.sip_port, tmp_path, timeout_s=60)
        assert run.ok, run.describe()
        oks = [m for m in run.received() if m.startswith("SIP/2.0 200") and "m=audio" in m]
        assert len(oks) >= 2, "the 200 OK was not retransmitted while no ACK came"
        assert any(m.startswith("BYE ") for m in run.received())
        assert server.alive()


# ---------------------------------------------------------------------- webhook and SDK


async def test_accepted_with_the_sdk_the_caller_is_heard_and_answered(
    webhook_sip_server: WebhookSipServer, tmp_path: Path
) -> None:
    server = webhook_sip_server.server
    phone = asyncio.create_task(run_sipp("uac_rtp", server.sip_port, tmp_path))
    event = await webhook_sip_server.incoming_call()
    call_id = event.data.call_id
    assert call_id.startswith("rtc_")
    await server.sdk().realtime.calls.accept(call_id, type="realtime", model="gpt-realtime")
    async with sideband(server, call_id) as events:
        # The spoken question is heard over RTP, and the reply is played back over RTP.
        await events.until(has("input_audio_buffer.speech_stopped"))
        await events.until(has("output_audio_buffer.started"))
    run = await phone
    assert run.ok, run.describe()
    # The webhook carried the INVITE's headers, the test's own one included.
    invite = run.sent()[0]
    headers = {h.name: h.value for h in event.data.sip_headers}
    assert headers.get("X-Hark-Test") == _header(invite, "X-Hark-Test")
    assert headers.get("Call-ID") == _header(invite, "Call-ID")


@pytest.mark.parametrize(("status_code", "expected"), [(None, 603), (486, 486)])
async def test_rejected_with_the_sdk_the_phone_gets_the_status(
    webhook_sip_server: WebhookSipServer,
    tmp_path: Path,
    status_code: int | None,
    expected: int,
) -> None:
    server = webhook_sip_server.server
    phone = asyncio.create_task(run_sipp("uac_rejected", server.sip_port, tmp_path))
    event = await webhook_sip_server.incoming_call()
    calls = server.sdk().realtime.calls
    if status_code is None:
        await calls.reject(event.data.call_id)
    else:
        await calls.reject(event.data.call_id, status_code=status_code)
    run = await phone
    assert run.ok, run.describe()
    assert final_status(run) == expected


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_hangup_with_the_sdk_sends_bye_to_the_phone(
    webhook_sip_server: WebhookSipServer, tmp_path: Path, transport: str
) -> None:
    server = webhook_sip_server.server
    phone = asyncio.create_task(
        run_sipp("uac_remote_bye", server.sip_port, tmp_path, transport=transport)
    )
    event = await webhook_sip_server.incoming_call()
    calls = server.sdk().realtime.calls
    await calls.accept(event.data.call_id, type="realtime", model="gpt-realtime")
    async with sideband(server, event.data.call_id) as events:
        await events.until(has("session.created"))
        await calls.hangup(event.data.call_id)
    run = await phone
    assert run.ok, run.describe()
    assert any(m.startswith("BYE ") for m in run.received())


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_refer_with_the_sdk_transfers_the_phone(
    webhook_sip_server: WebhookSipServer, tmp_path: Path, transport: str
) -> None:
    server = webhook_sip_server.server
    phone = asyncio.create_task(
        run_sipp("uac_refer", server.sip_port, tmp_path, transport=transport)
    )
    event = await webhook_sip_server.incoming_call()
    calls = server.sdk().realtime.calls
    await calls.accept(event.data.call_id, type="realtime", model="gpt-realtime")
    await calls.refer(event.data.call_id, target_uri="tel:+14155550123")
    run = await phone
    assert run.ok, run.describe()
    refer = next(m for m in run.received() if m.startswith("REFER "))
    assert "tel:+14155550123" in _header(refer, "Refer-To"), refer
    assert _header(refer, "Referred-By"), refer


async def test_a_call_cancelled_before_the_answer_cannot_be_accepted(
    webhook_sip_server: WebhookSipServer, tmp_path: Path
) -> None:
    server = webhook_sip_server.server
    phone = asyncio.create_task(run_sipp("uac_cancel", server.sip_port, tmp_path))
    event = await webhook_sip_server.incoming_call()
    run = await phone
    assert run.ok, run.describe()
    assert final_status(run) == 487
    with pytest.raises(openai.APIStatusError) as failure:
        await server.sdk().realtime.calls.accept(
            event.data.call_id, type="realtime", model="gpt-realtime"
        )
    assert failure.value.status_code in (404, 409)
    assert server.alive()


@pytest.mark.slow
async def test_a_call_nobody_accepts_is_rejected_in_time(
    webhook_sip_server: WebhookSipServer, tmp_path: Path
) -> None:
    server = webhook_sip_server.server
    phone = asyncio.create_task(run_sipp("uac_rejected", server.sip_port, tmp_path))
    await webhook_sip_server.incoming_call()
    run = await phone
    assert run.ok, run.describe()
    assert final_status(run) >= 400


@pytest.mark.parametrize(("scenario", "digits"), [("uac_info_dtmf", "7*"), ("uac_rfc4733", "15#")])
async def test_dtmf_reaches_the_session_once_per_key_and_never_as_speech(
    webhook_sip_server: WebhookSipServer, tmp_path: Path, scenario: str, digits: str
) -> None:
    server = webhook_sip_server.server
    phone = asyncio.create_task(run_sipp(scenario, server.sip_port, tmp_path))
    event = await webhook_sip_server.incoming_call()
    await server.sdk().realtime.calls.accept(
        event.data.call_id, type="realtime", model="gpt-realtime"
    )
    async with sideband(server, event.data.call_id) as events:
        await events.until(has("session.created"))
        run = await phone
        # The phone has hung up; whatever the keys caused has been sent by now or never.
        with contextlib.suppress(AssertionError, TimeoutError):
            await events.until(lambda _: False, limit_s=1.0)
    assert run.ok, run.describe()
    pressed = [e for e in events.events if e["type"] == "input_audio_buffer.dtmf_event_received"]
    assert "".join(e["event"] for e in pressed) == digits, events.types()
    assert all(isinstance(e["received_at"], int | float) for e in pressed)
    assert "input_audio_buffer.speech_started" not in events.types()

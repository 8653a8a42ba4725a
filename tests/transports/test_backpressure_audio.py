"""Audio that comes late or is dropped is counted where it happens, and the counts reach the
scrape (``hark_audio_chunks_late`` / ``hark_audio_chunks_dropped``): a WebRTC caller's
packets out of order or of another stream, a SIP phone's packets too late for the jitter
buffer, and a WebSocket client's audio past the input buffer's bound."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import pytest

from hark.audio.codecs.g711 import ulaw_encode
from hark.config import Settings
from hark.observability.metrics import Metrics
from hark.session.input_buffer import MAX_BUFFERED_S
from hark.transports.sip.media import RtpSession
from hark.transports.webrtc.input_audio import InputAudio
from tests.conftest import engines_sharing_turn
from tests.server.conftest import serving, wait_ready
from tests.transports.conftest import until
from tests.transports.sip.test_media import (  # noqa: F401 (fixtures)
    FRAME,
    SESSION_RATE,
    Phone,
    media,
    phones,
    tone,
)
from tests.transports.webrtc.test_input_audio import opus_packets

pytestmark = pytest.mark.realtime

HEADERS = {"Authorization": "Bearer any"}


def count(exposition: bytes | str, name: str, transport: str) -> float:
    """A counter's value for ``transport`` in a Prometheus exposition (0 when absent)."""
    text = exposition.decode() if isinstance(exposition, bytes) else exposition
    total = 0.0
    for labels, value in re.findall(rf"^{name}_total\{{(.*)\}} (\S+)$", text, re.MULTILINE):
        if f'transport="{transport}"' in labels.split(","):
            total += float(value)
    return total


def test_webrtc_packets_out_of_order_are_late_and_another_stream_is_dropped() -> None:
    metrics = Metrics()
    audio = InputAudio(lambda: 24000, lambda pcm: None, metrics.session("webrtc", "sess_a"))
    packets = opus_packets(0.4)
    for n in [0, 1, 2, 4, 3, 5, 5]:
        audio.packet(7, n, n * 960, packets[n])
    audio.packet(8, 6, 6 * 960, packets[6])
    audio.packet(7, 7, 7 * 960, b"\xff" * 3)
    exposition = metrics.exposition()
    # 3 after 4, and 5 twice: late; SSRC 8 and the packet that does not decode: dropped.
    assert count(exposition, "hark_audio_chunks_late", "webrtc") == 2
    assert count(exposition, "hark_audio_chunks_dropped", "webrtc") == 2


async def test_a_sip_packet_behind_the_jitter_buffer_counts_as_late(
    phones: Callable[[], asyncio.Future[Phone]],  # noqa: F811 (the fixture)
    media: RtpSession,  # noqa: F811 (the fixture)
) -> None:
    metrics = Metrics()
    phone = await phones()
    media.negotiate(phone.offer(), "127.0.0.1")
    heard: list[int] = []
    media.start(
        input_rate=lambda: SESSION_RATE,
        on_audio=lambda pcm: heard.append(len(pcm)),
        on_dtmf=lambda digit: None,
        listener=_Ignore(),
        metrics=metrics.session("sip", "sess_b"),
    )
    pcm = tone(8000, 0.6)
    frames = [ulaw_encode(pcm[n * FRAME : (n + 1) * FRAME]) for n in range(len(pcm) // FRAME)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    for n, frame in enumerate(frames):
        phone.send(media, frame, n * FRAME)
        await asyncio.sleep(start + (n + 1) * 0.02 - loop.time())
    # Once its audio has been played out, frame 20 comes again under a new sequence number
    # (a packet the network held back): too late for its place.
    await until(lambda: media.stats.packets_received == len(frames))
    await until(lambda: sum(heard) >= SESSION_RATE * 0.45)
    # A phone that a busy loop kept from sending on time may have had packets come late
    # already, and a stalled loop makes the buffer skip frames to catch up: what the one
    # packet adds is counted.
    jitter = media._jitter.stats
    late, overflow = jitter.late, jitter.overflow
    phone.send(media, frames[20], 20 * FRAME)
    await until(lambda: count(metrics.exposition(), "hark_audio_chunks_late", "sip") == late + 1)
    assert media.stats.late == late + 1
    # Late, not dropped: the buffer had room for it, and the dropped chunks counted are the
    # frames it skipped, if any.
    assert jitter.overflow == overflow
    dropped = count(metrics.exposition(), "hark_audio_chunks_dropped", "sip")
    assert dropped == jitter.overflow + jitter.dropped


class _Ignore:
    def playout_started(self, response_id: str) -> None:
        pass

    def playout_stopped(self, response_id: str) -> None:
        pass

    def playout_cleared(self, response_id: str, played_ms: int) -> None:
        pass


async def test_websocket_audio_past_the_buffer_bound_is_dropped_counted_and_told_once() -> None:
    # Two appends of three fifths of the bound each (under the 15 MiB an append may carry),
    # then one of a second: the second is cut, the third dropped whole.
    part = np.zeros(int(SESSION_RATE * MAX_BUFFERED_S * 0.6), np.int16)
    big = base64.b64encode(part.tobytes()).decode()
    small = base64.b64encode(np.zeros(SESSION_RATE, np.int16).tobytes()).decode()
    async with serving() as start, aiohttp.ClientSession() as http:
        server = await start(
            Settings(engines="fake"), engines_sharing_turn(Settings(engines="fake"))
        )
        await wait_ready(http, server)
        async with http.ws_connect(server.ws_url, headers=HEADERS, max_msg_size=0) as ws:
            assert (await ws.receive_json(timeout=30))["type"] == "session.created"
            await ws.send_json(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"turn_detection": None}}},
                }
            )
            assert (await ws.receive_json(timeout=30))["type"] == "session.updated"
            for audio in (big, big, small):
                await ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
            await ws.send_json({"type": "input_audio_buffer.commit"})
            events: list[dict[str, Any]] = []
            while not events or events[-1]["type"] != "input_audio_buffer.committed":
                events.append(await ws.receive_json(timeout=60))
        errors = [e["error"] for e in events if e["type"] == "error"]
        assert [e["code"] for e in errors] == ["input_audio_buffer_full"]
        assert f"{MAX_BUFFERED_S} seconds" in errors[0]["message"]
        async with http.get(server.url + "/metrics") as response:
            exposition = await response.text()
        assert count(exposition, "hark_audio_chunks_dropped", "websocket") == 2

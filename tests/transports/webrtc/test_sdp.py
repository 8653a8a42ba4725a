"""Offer checks before aiortc sees an offer."""

from __future__ import annotations

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from hark.tools.egress import EgressPolicy
from hark.transports.webrtc.candidates import CandidatePolicy
from hark.transports.webrtc.sdp import OfferError, check_offer

LOOPBACK = CandidatePolicy.serving_at("127.0.0.1")
# Every candidate address allowed: an offer comes back as it was, less end-of-candidates.
ANYWHERE = CandidatePolicy.serving_at("127.0.0.1", EgressPolicy.parse(["0.0.0.0/0", "::/0"]))


async def browser_like_offer(audio: bool = True, channel: bool = True) -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        if audio:
            pc.addTransceiver("audio")
        if channel:
            pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp
    finally:
        await pc.close()


async def test_a_real_offer_passes_with_its_media_kinds() -> None:
    offer = await browser_like_offer()
    text, kinds = check_offer(offer, ANYWHERE)
    assert kinds == ["audio", "application"]
    assert text == offer.replace("a=end-of-candidates\r\n", "")


async def test_a_data_channel_alone_is_enough() -> None:
    _, kinds = check_offer(await browser_like_offer(audio=False), LOOPBACK)
    assert kinds == ["application"]


def test_mdns_candidates_are_removed() -> None:
    srflx = "a=candidate:2 1 udp 1686052607 8.8.8.8 54321 typ srflx raddr 0.0.0.0 rport 0\r\n"
    sdp = (
        "v=0\r\na=candidate:1 1 udp 2122260223 1f4e0c1b-7e2c-4b1a.local 54321 typ host\r\n" + srflx
    )
    assert LOOPBACK.screen(sdp) == "v=0\r\n" + srflx


async def test_audio_without_opus_is_refused() -> None:
    offer = await browser_like_offer()
    lines = [line for line in offer.splitlines() if "opus" not in line.lower()]
    mline = next(i for i, line in enumerate(lines) if line.startswith("m=audio"))
    lines[mline] = lines[mline].replace(" 96 ", " ")
    with pytest.raises(OfferError, match="Opus"):
        check_offer("\r\n".join(lines) + "\r\n", LOOPBACK)


async def test_video_is_refused() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    pc.addTransceiver("video")
    await pc.setLocalDescription(await pc.createOffer())
    offer = pc.localDescription.sdp
    await pc.close()
    with pytest.raises(OfferError, match="video"):
        check_offer(offer, LOOPBACK)

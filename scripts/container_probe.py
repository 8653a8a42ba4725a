"""What scripts/container-test asks of the running image, from outside the container.

Run by that script (``.venv/bin/python scripts/container_probe.py --host … --sigterm …``)
against a container it started as the Helm chart starts a worker. In order: strangers are
refused (HTTP without a key or with a wrong one, a SIP INVITE and OPTIONS from a source no
trunk lists), a spoken turn over the WebSocket with the official ``openai`` SDK, a spoken
call over WebRTC with aiortc, then the drain: SIGTERM while a session is open turns
``/readyz`` red and refuses new sessions, the open one goes on, and the process exits once it
ends. Each step prints a line with what it saw; any failed check ends the run with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.conftest import (
    Server,
    events_until,
    speech,
    stream_realtime,
    transcribe,
    words,
)

from hark.bench.report import BenchError
from hark.bench.webrtc import AUDIBLE_RMS, CallClient
from hark.transports.webrtc.playout import PLAYOUT_RATE

QUESTION = "What is the capital of France?"
MODEL = "gpt-realtime"


def report(step: str, started: float, detail: str) -> None:
    print(
        f"container-probe: {step}: ok in {time.monotonic() - started:.1f} s; {detail}", flush=True
    )


async def wait_ready(http: aiohttp.ClientSession, base: str, limit_s: float) -> None:
    """Until ``/readyz`` says ready (the models are loaded) or ``limit_s`` runs out."""
    started = time.monotonic()
    status = "never answered"
    while time.monotonic() - started < limit_s:
        try:
            async with http.get(f"{base}/readyz") as r:
                status = (await r.json())["status"]
        except (aiohttp.ClientError, OSError, ValueError):
            pass
        assert status != "failed", "the models failed to load (see the container's log)"
        if status == "ready":
            report("ready", started, "/readyz 200 (models loaded, no network)")
            return
        await asyncio.sleep(1)
    raise AssertionError(f"/readyz never said ready: {status}")


async def http_strangers(http: aiohttp.ClientSession, base: str, key: str) -> None:
    """Every route that is not a probe needs a key: none or a wrong one gets 401."""
    started = time.monotonic()
    wrong = {"Authorization": f"Bearer sk-{secrets.token_hex(8)}"}
    for method, path in (
        ("GET", "/v1/models"),
        ("POST", "/v1/realtime/calls"),
        ("POST", "/v1/realtime/client_secrets"),
        ("GET", "/metrics"),
        ("GET", "/v1/realtime"),
    ):
        for headers in ({}, wrong):
            async with http.request(method, base + path, headers=headers) as r:
                who = "with a wrong key" if headers else "without a key"
                assert r.status == 401, f"{method} {path} {who}: {r.status}"
    async with http.get(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status == 200, f"/metrics with the key: {r.status}"
    report("HTTP strangers", started, "5 routes refused without a key and with a wrong one (401)")


def _sip_request(method: str, host: str, port: int, local: tuple[str, int]) -> bytes:
    tag, branch = secrets.token_hex(4), "z9hG4bK" + secrets.token_hex(6)
    body = ""
    if method == "INVITE":
        body = (
            f"v=0\r\no=- 1 1 IN IP4 {local[0]}\r\ns=-\r\nc=IN IP4 {local[0]}\r\nt=0 0\r\n"
            "m=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
        )
    lines = [
        f"{method} sip:+15550100@{host}:{port} SIP/2.0",
        f"Via: SIP/2.0/UDP {local[0]}:{local[1]};branch={branch};rport",
        "Max-Forwards: 70",
        f"From: <sip:stranger@{local[0]}>;tag={tag}",
        f"To: <sip:+15550100@{host}>",
        f"Call-ID: {secrets.token_hex(8)}@{local[0]}",
        f"CSeq: 1 {method}",
        f"Contact: <sip:stranger@{local[0]}:{local[1]}>",
        *(["Content-Type: application/sdp"] if body else []),
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


def sip_stranger(host: str, port: int) -> None:
    """An INVITE and an OPTIONS from a source no trunk lists get 403, with nothing before it
    (no 100 Trying, no ringing) and no Allow header."""
    started = time.monotonic()
    for method in ("INVITE", "OPTIONS"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))
            sock.settimeout(10)
            sock.send(_sip_request(method, host, port, sock.getsockname()))
            reply = sock.recv(65535).decode(errors="replace")
        status_line, _, rest = reply.partition("\r\n")
        assert status_line.startswith("SIP/2.0 403"), f"{method} from a stranger: {status_line!r}"
        headers = [h.partition(":")[0].strip().lower() for h in rest.split("\r\n")]
        assert "allow" not in headers, f"{method}: the refusal lists the methods"
    report("SIP stranger", started, "INVITE and OPTIONS from an unlisted source: 403 first")


async def websocket_turn(server: Server, key: str) -> None:
    """A spoken question over the WebSocket with the openai SDK gets a spoken answer."""
    started = time.monotonic()
    question = await speech(QUESTION)
    async with server.client(key).realtime.connect(model=MODEL) as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {
                        "transcription": {"model": "whisper-1", "language": "en"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                    }
                },
            }
        )
        assert (await conn.recv()).type == "session.updated"
        # The question, then two seconds of silence for the end of the turn to be heard.
        pcm = np.concatenate((question, np.zeros(48000, np.int16)))
        sender = asyncio.create_task(stream_realtime(conn.input_audio_buffer.append, pcm))
        try:
            events: list[Any] = [e async for e in events_until(conn, "response.done", 180)]
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    kinds = [e.type for e in events]
    (heard,) = [
        e for e in events if e.type == "conversation.item.input_audio_transcription.completed"
    ]
    assert {"capital", "france"} <= set(words(heard.transcript)), heard.transcript
    done = events[-1].response
    assert done.status == "completed", done
    audio = [e for e in events if e.type == "response.output_audio.delta"]
    assert audio, f"no audio in the reply: {sorted(set(kinds))}"
    (said,) = [e for e in events if e.type == "response.output_audio_transcript.done"]
    report(
        "WebSocket turn (openai SDK)",
        started,
        f"heard {heard.transcript!r}, said {said.transcript!r}",
    )


async def webrtc_call(
    http: aiohttp.ClientSession, base: str, key: str, media: str | None = None
) -> None:
    """A call over WebRTC (aiortc): the spoken question is heard, and the answer's audio is
    what its transcript says (Whisper on this side agrees with at least half its words).
    ``media`` (``IP:PORT``): the one candidate the answer must offer (a relay's)."""
    started = time.monotonic()
    client = CallClient(keep_audio=True)
    try:
        await client.connect(http, base, api_key=key)
        if media:
            host, port = media.rsplit(":", 1)
            candidates = [
                line.split()[4:6]
                for line in (client.answer or "").splitlines()
                if line.startswith("a=candidate:")
            ]
            assert candidates and all(c == [host, port] for c in candidates), candidates
        await client.next_event("session.created", limit_s=60)
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
        client.microphone.play("q", "", await speech(QUESTION), 24000)
        client.microphone.finish("q")
        heard = await client.next_event(
            "conversation.item.input_audio_transcription.completed", limit_s=120
        )
        said = await client.next_event("response.output_audio_transcript.done", limit_s=120)
        stopped = await client.next_event("output_audio_buffer.stopped", limit_s=120)
        # The track plays silence after a reply: once a second of it has come after the
        # stop, the reply's last frames are in.
        async with asyncio.timeout(60):
            # (A plain list that the track's task fills: nothing to wait on but time.)
            while sum(f.arrival > stopped["_received"] for f in client.frames) < 50:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        loud = [f for f in client.frames if f.rms > AUDIBLE_RMS]
        assert loud, "no audible frame came back"
        reply = client.audio(since=loud[0].arrival)
        recognised = await transcribe(reply, PLAYOUT_RATE)
    finally:
        await client.close()
    assert "france" in words(heard["transcript"]), heard
    expected = set(words(said["transcript"]))
    assert len(set(words(recognised)) & expected) >= max(1, len(expected) // 2), (
        recognised,
        said["transcript"],
    )
    report(
        "WebRTC call (aiortc)" + (f", media through {media}" if media else ""),
        started,
        f"heard {heard['transcript']!r}, said {said['transcript']!r}, Whisper hears {recognised!r}",
    )


async def relay_forwarded(http: aiohttp.ClientSession, metrics_url: str) -> None:
    """The relay's own count says it made a flow (a client's verified STUN request)."""
    started = time.monotonic()
    async with http.get(metrics_url) as r:
        assert r.status == 200, f"{metrics_url}: {r.status}"
        text = await r.text()
    flows = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hark_relay_flows_created")
    )
    assert flows >= 1, f"the relay made no flow:\n{text[:2000]}"
    report("relay", started, f"hark_relay_flows_created: {flows:g}")


async def drain(
    http: aiohttp.ClientSession, server: Server, base: str, key: str, sigterm: str
) -> None:
    """SIGTERM with a session open: /readyz 503 and /healthz 200, a new session refused, the
    open one answers a text turn; then it closes (the caller checks that the process exits on
    its own, before the drain timeout)."""
    started = time.monotonic()
    async with server.client(key).realtime.connect(model=MODEL) as conn:
        assert (await conn.recv()).type == "session.created"
        kill = await asyncio.create_subprocess_shell(sigterm)
        assert await kill.wait() == 0, f"{sigterm!r} failed"
        async with asyncio.timeout(30):
            while True:
                async with http.get(f"{base}/readyz") as r:
                    if r.status == 503:
                        break
                await asyncio.sleep(0.2)
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200, f"/healthz while draining: {r.status}"
        try:
            async with server.client(key).realtime.connect(model=MODEL) as other:
                first = await other.recv()
        except Exception as exc:  # the SDK lets websockets' refused upgrade through
            assert "503" in str(exc), f"a new session while draining: {exc!r}"
        else:
            raise AssertionError(f"a new session while draining got {first.type}")
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
            }
        )
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": QUESTION}],
            }
        )
        await conn.response.create()
        events: list[Any] = [e async for e in events_until(conn, "response.done", 120)]
        done = events[-1].response
        assert done.status == "completed", done
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    report(
        "drain",
        started,
        f"/readyz 503, /healthz 200, new session refused, open session answered {text!r}",
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sip-port", type=int, default=5060)
    parser.add_argument("--key", required=True)
    parser.add_argument("--sigterm", default="", help="a shell command that sends SIGTERM")
    parser.add_argument("--ready-limit", type=float, default=600)
    parser.add_argument(
        "--steps",
        default="http,sip,websocket,webrtc,drain",
        help="which probes, after the wait for /readyz (comma-separated)",
    )
    parser.add_argument("--relay", help="the relay's IP:PORT, which every call's media must use")
    parser.add_argument("--relay-metrics", help="the relay's /metrics URL")
    args = parser.parse_args()
    steps = set(args.steps.split(","))
    base = f"http://{args.host}:{args.port}"
    server = Server(args.host, args.port, Path("/dev/null"))
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base, args.ready_limit)
            if "http" in steps:
                await http_strangers(http, base, args.key)
            if "sip" in steps:
                sip_stranger(args.host, args.sip_port)
            if "websocket" in steps:
                await websocket_turn(server, args.key)
            if "webrtc" in steps:
                await webrtc_call(http, base, args.key, args.relay)
            if args.relay_metrics:
                await relay_forwarded(http, args.relay_metrics)
            if "drain" in steps:
                await drain(http, server, base, args.key, args.sigterm)
    except (AssertionError, TimeoutError, BenchError) as exc:
        print(f"container-probe: FAILED: {exc!r}", flush=True)
        return 1
    print(json.dumps({"probe": "passed"}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

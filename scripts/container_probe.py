"""What scripts/container-test asks of the running image, from outside the container.

Run by that script (``.venv/bin/python scripts/container_probe.py --host … --sigterm …``)
against a container it started as the Helm chart starts a worker. In order: strangers are
refused (HTTP without a key or with a wrong one, a SIP INVITE and OPTIONS from a source no
trunk lists), a spoken turn over the WebSocket with the official ``openai`` SDK, a spoken
call over WebRTC with aiortc, then the drain: SIGTERM while a session is open turns
``/readyz`` red and refuses new sessions, the open one goes on, and the process exits once it
ends. Each step prints a line with what it saw; any failed check ends the run with status 1.

Against the played chart (scripts/container-test kube) the strangers are those of a default
chart: its Redis without the password (``redis``), SIP on a worker pod that has it off
(``nosip``), and during the call through the relay, a forged hint, an expired one and stray
datagrams at the relay, and framed datagrams sent to the worker from an address that is not
a relay (``relay-strangers``). The Redis password and the fleet secret come in the
environment (``HARK_PROBE_REDIS_PASSWORD``, ``HARK_PROBE_FLEET_SECRET``), never on the command
line.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aioice import stun

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
from hark.edge import framing
from hark.edge.route_hint import HINT_TTL_S, Route, RouteSigner, RouteVerifier
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
    http: aiohttp.ClientSession,
    base: str,
    key: str,
    media: str | None = None,
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


def _exchange(sock: socket.socket, command: bytes) -> bytes:
    sock.sendall(command)
    return sock.recv(4096)


def redis_strangers(address: str, password: str) -> None:
    """The chart's Redis: a client without the password is refused every command (NOAUTH),
    one with a wrong password too; one with it is served."""
    started = time.monotonic()
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reply = _exchange(sock, b"PING\r\n")
        assert reply.startswith(b"-NOAUTH"), f"PING without the password: {reply!r}"
        reply = _exchange(sock, b"SCARD hark:workers\r\n")
        assert reply.startswith(b"-NOAUTH"), f"a read without the password: {reply!r}"
        wrong = secrets.token_hex(16).encode()
        reply = _exchange(sock, b"AUTH %s\r\n" % wrong)
        assert reply.startswith(b"-WRONGPASS"), f"a wrong password: {reply!r}"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reply = _exchange(sock, b"AUTH %s\r\nPING\r\n" % password.encode())
        if reply == b"+OK\r\n":
            reply += sock.recv(4096)
        assert reply == b"+OK\r\n+PONG\r\n", f"with the password: {reply!r}"
    report("Redis strangers", started, "NOAUTH without the password, WRONGPASS, PONG with it")


def sip_closed(host: str, port: int) -> None:
    """Nothing listens for SIP: an OPTIONS over UDP meets a closed port (the kernel's ICMP
    port unreachable, which a connected socket reads as refused), TCP is refused."""
    started = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        sock.settimeout(10)
        sock.send(_sip_request("OPTIONS", host, port, sock.getsockname()))
        try:
            reply = sock.recv(65535)
        except ConnectionRefusedError:
            pass
        except TimeoutError:
            raise AssertionError(f"UDP {port}: neither an answer nor a closed port") from None
        else:
            raise AssertionError(f"UDP {port} answered SIP: {reply[:80]!r}")
    try:
        socket.create_connection((host, port), timeout=10).close()
    except ConnectionRefusedError:
        pass
    else:
        raise AssertionError(f"TCP {port} accepted a connection")
    report("SIP off", started, f"UDP {port}: port unreachable; TCP {port}: refused")


_SAMPLE = re.compile(r"^(hark_relay_[a-z_]+(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)


async def relay_samples(http: aiohttp.ClientSession, metrics_url: str) -> dict[str, float]:
    """The relay's /metrics, by sample (``name{labels}``)."""
    async with http.get(metrics_url) as r:
        assert r.status == 200, f"{metrics_url}: {r.status}"
        text = await r.text()
    return {name: float(value) for name, value in _SAMPLE.findall(text)}


async def until_counted(
    http: aiohttp.ClientSession, metrics_url: str, sample: str, before: dict[str, float]
) -> None:
    """Until the relay's ``sample`` has moved past its value in ``before``."""
    try:
        async with asyncio.timeout(30):
            # (A counter in another process: nothing to wait on but its next reading.)
            while True:
                now = await relay_samples(http, metrics_url)
                if now.get(sample, 0) > before.get(sample, 0):
                    return
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"the relay never counted {sample}") from None


def _sdp_attribute(sdp: str, name: str) -> str:
    (value,) = {line.split(":", 1)[1] for line in sdp.splitlines() if line.startswith(f"a={name}:")}
    return value


def _binding_request(username: str, password: str) -> tuple[bytes, bytes]:
    """A binding request as an ICE agent's check (its bytes and transaction id)."""
    request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    request.attributes["USERNAME"] = username
    request.attributes["PRIORITY"] = 1
    request.attributes["ICE-CONTROLLING"] = secrets.randbits(64)
    request.add_message_integrity(password.encode())
    request.add_fingerprint()
    return bytes(request), request.transaction_id


async def _transact(
    sock: socket.socket, request: bytes, transaction: bytes, to: tuple[str, int]
) -> stun.Message:
    """The answer to a STUN request, sent again as STUN does (RFC 8489 section 6.2.1) until it
    comes: a worker behind a relay does not answer the first check of an address it has not
    yet heard through the relay."""
    sock.settimeout(0.5)
    for _ in range(20):
        sock.sendto(request, to)
        try:
            while True:
                # (The worker's own check of the new address may come first.)
                reply = stun.parse_message(await asyncio.to_thread(sock.recv, 2048))
                if reply.transaction_id == transaction:
                    return reply
        except TimeoutError:
            continue
    raise AssertionError("the call's own check through the relay got no answer")


async def relay_strangers(
    http: aiohttp.ClientSession,
    base: str,
    key: str,
    *,
    here: str,
    relay: str,
    metrics_url: str,
    worker_media: str,
    fleet_secret: str,
) -> None:
    """With a call's answer in hand (a call of its own, closed after; the legitimate call
    comes after these and must work): a hint with a bad MAC, an expired hint (signed with the
    fleet secret, but old) and stray datagrams are dropped and counted by the relay, and the
    stranger that sent them has no flow after them (its later datagrams are dropped as of no
    flow). A framed binding request sent to the worker's media port from this host, which is
    no relay, gets nothing back, while the same check through the relay is answered."""
    started = time.monotonic()
    client = CallClient()
    try:
        await client.connect(http, base, api_key=key)
        # Set up (ICE, DTLS, the data channel) before it is used and closed.
        await client.next_event("session.created", limit_s=60)
        await _relay_strangers(
            http,
            client,
            here=here,
            relay=relay,
            metrics_url=metrics_url,
            worker_media=worker_media,
            fleet_secret=fleet_secret,
        )
    finally:
        await client.close()
    report(
        "relay strangers",
        started,
        "bad_hint, expired_hint and unknown_flow counted, no flow for the stranger; the "
        "worker answered the check through the relay and nothing framed from elsewhere",
    )


async def _relay_strangers(
    http: aiohttp.ClientSession,
    client: CallClient,
    *,
    here: str,
    relay: str,
    metrics_url: str,
    worker_media: str,
    fleet_secret: str,
) -> None:
    relay_host, relay_port = relay.rsplit(":", 1)
    to_relay = (relay_host, int(relay_port))
    worker_host, worker_port = worker_media.rsplit(":", 1)
    answer, offer = client.answer or "", client.pc.localDescription.sdp
    server_ufrag, server_pwd = (
        _sdp_attribute(answer, "ice-ufrag"),
        _sdp_attribute(answer, "ice-pwd"),
    )
    client_ufrag = _sdp_attribute(offer, "ice-ufrag")
    route = RouteVerifier(fleet_secret).verify(server_ufrag)
    assert isinstance(route, Route), f"the answer's ufrag is no hint of this fleet: {route}"
    token = bytearray(base64.b64decode(server_ufrag))
    token[-1] ^= 0x01
    forged = base64.b64encode(token).decode()
    old = RouteSigner(fleet_secret, route.worker_id, clock=lambda: time.time() - 2 * HINT_TTL_S)
    expired = old.ufrag()
    dropped = 'hark_relay_dropped_total{reason="%s"}'
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        stranger.bind((here, 0))
        for ufrag, reason in ((forged, "bad_hint"), (expired, "expired_hint")):
            before = await relay_samples(http, metrics_url)
            stranger.sendto(_binding_request(f"{ufrag}:{client_ufrag}", server_pwd)[0], to_relay)
            await until_counted(http, metrics_url, dropped % reason, before)
        # Stray datagrams (RTP's first byte, DTLS's): the stranger has no flow to send them on.
        for stray in (b"\x80\x00" + secrets.token_bytes(30), b"\x17" + secrets.token_bytes(30)):
            before = await relay_samples(http, metrics_url)
            stranger.sendto(stray, to_relay)
            await until_counted(http, metrics_url, dropped % "unknown_flow", before)
    # The worker: the call's own check, framed as the relay frames it, from this host.
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as checker,
    ):
        stranger.bind((here, 0))
        checker.bind((here, 0))
        request, _ = _binding_request(f"{server_ufrag}:{client_ufrag}", server_pwd)
        header = framing.encode_header(("198.51.100.7", 40000))
        # Sent again as a STUN client would: a worker that took framed datagrams from
        # anyone would answer the copies after the first (see ``_transact``).
        for _ in range(3):
            stranger.sendto(header + request, (worker_host, int(worker_port)))
        # The same check through the relay, sent after it: once its answer is back, the
        # worker has read the stranger's datagram (sent first, on the shorter path).
        request, transaction = _binding_request(f"{server_ufrag}:{client_ufrag}", server_pwd)
        reply = await _transact(checker, request, transaction, to_relay)
        assert reply.message_class == stun.Class.RESPONSE, f"the call's own check: {reply}"
        stranger.setblocking(False)
        try:
            got = stranger.recv(2048)
        except BlockingIOError:
            pass
        else:
            raise AssertionError(f"the worker answered a framed datagram from no relay: {got!r}")


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
    parser.add_argument("--redis", help="the chart's Redis, IP:PORT (step redis)")
    parser.add_argument("--here", help="this host's address on the pods' network")
    parser.add_argument(
        "--worker-media", help="the worker pod's media port, IP:PORT (step relay-strangers)"
    )
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
            if "nosip" in steps:
                sip_closed(args.host, args.sip_port)
            if "redis" in steps:
                redis_strangers(args.redis, os.environ["HARK_PROBE_REDIS_PASSWORD"])
            if "websocket" in steps:
                await websocket_turn(server, args.key)
            if "relay-strangers" in steps:
                await relay_strangers(
                    http,
                    base,
                    args.key,
                    here=args.here,
                    relay=args.relay,
                    metrics_url=args.relay_metrics,
                    worker_media=args.worker_media,
                    fleet_secret=os.environ["HARK_PROBE_FLEET_SECRET"],
                )
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

"""A phone call to hark's SIP, from outside, as scripts/container-test places it.

Run by that script against the SIP pod of the played chart (``.venv/bin/python
scripts/sip_call_probe.py --host … --caller … --stranger …``): an INVITE from an address no
trunk lists is refused before it rings, then a call from the trunk's address is answered, the
caller asks a spoken question over G.711 RTP and Whisper hears a spoken answer to it in
what comes back. Each step prints a line with what it saw; any failed check ends the run with
status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.conftest import speech, transcribe, words

from hark.audio.codecs.g711 import ulaw_decode
from hark.bench.report import BenchError
from hark.bench.sip import SipCaller

QUESTION = "What is the capital of France?"
RATE = 8000
# How long the answer may go quiet before it counts as over.
ANSWER_OVER_S = 3.0
# The words of an answer to QUESTION, and how many times it may be asked.
SUBJECT = {"capital", "france", "paris"}
TRIES = 3


def answer(caller: SipCaller) -> npt.NDArray[np.int16]:
    """What the caller received, in sequence order (a 16-bit sequence that starts anywhere),
    as 8 kHz samples."""
    if not caller.received:
        return np.zeros(0, np.int16)
    first = caller.received[0].sequence
    ordered = sorted(caller.received, key=lambda packet: (packet.sequence - first) % 65536)
    return np.concatenate([ulaw_decode(packet.payload) for packet in ordered])


async def wait_ready(url: str, limit_s: float) -> None:
    """Until ``url`` (the SIP pod's ``/readyz``) answers 200: its models are loaded."""
    started = time.monotonic()
    status = "never answered"
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - started < limit_s:
            try:
                async with http.get(url) as response:
                    status = str(response.status)
                    if response.status == 200:
                        report("ready", started, f"{url} 200")
                        return
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(1)
    raise AssertionError(f"{url} never said ready: {status}")


def report(step: str, started: float, detail: str) -> None:
    print(f"sip-call-probe: {step}: ok in {time.monotonic() - started:.1f} s; {detail}", flush=True)


async def stranger_refused(server: tuple[str, int], host: str, limit_s: float) -> None:
    """An INVITE from an address no trunk lists gets 403, and nothing else."""
    started = time.monotonic()
    caller = SipCaller(server, host=host)
    await caller.open()
    try:
        await caller.invite(limit_s)
    except BenchError as exc:
        assert " 403 " in str(exc), f"the stranger's INVITE: {exc}"
    else:
        with contextlib.suppress(Exception):
            await caller.bye()
        raise AssertionError(f"a call from {host}, which no trunk lists, was answered")
    finally:
        caller.close()
    report("stranger", started, f"an INVITE from {host} refused (403)")


async def spoken_call(server: tuple[str, int], host: str, limit_s: float) -> None:
    """From the trunk's address: answered, a spoken question, an answer Whisper hears.

    There is no sideband here to say what the server said, so the answer is checked for a
    word of the question's subject (the capital, France, Paris: the embedded LLM does not
    always name the city). On a loaded host the reply's speech can come with gaps that
    Whisper tiny mishears at 8 kHz, so the question is asked up to ``TRIES`` times in the
    call, each try reported; a call that never answers, or whose answers never carry the
    subject, fails."""
    started = time.monotonic()
    caller = SipCaller(server, host=host)
    await caller.open()

    async def microphone() -> None:
        loop = asyncio.get_running_loop()
        while True:
            caller.tick(loop.time())
            await asyncio.sleep(0.02)

    ticking: asyncio.Task[None] | None = None
    heard: list[str] = []
    try:
        setup = await caller.invite(limit_s)
        ticking = asyncio.create_task(microphone())
        await asyncio.sleep(1.0)
        question = await speech(QUESTION, RATE)
        for _ in range(TRIES):
            text = await _ask(caller, question, limit_s)
            heard.append(text.strip())
            if SUBJECT & set(words(text)):
                break
            print(f"sip-call-probe: the phone heard {text.strip()!r}; asking again", flush=True)
        await caller.bye()
    finally:
        if ticking is not None:
            ticking.cancel()
            await asyncio.gather(ticking, return_exceptions=True)
        caller.close()
    assert SUBJECT & set(words(heard[-1])), f"the phone heard {heard!r}"
    report(
        "call",
        started,
        f"answered in {setup * 1000:.0f} ms; the phone heard {heard[-1]!r}"
        + (f" (try {len(heard)} of {TRIES})" if len(heard) > 1 else ""),
    )


async def _ask(caller: SipCaller, question: npt.NDArray[np.int16], limit_s: float) -> str:
    """Say the question; what Whisper hears in the whole answer."""
    caller.received.clear()
    caller.audio_event.clear()
    caller.say(question)
    async with asyncio.timeout(limit_s):
        await caller.audio_event.wait()
    # The whole answer: until it has been quiet for a while.
    async with asyncio.timeout(limit_s):
        while True:
            caller.audio_event.clear()
            try:
                async with asyncio.timeout(ANSWER_OVER_S):
                    await caller.audio_event.wait()
            except TimeoutError:
                break
    return await transcribe(answer(caller), RATE)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True, help="hark's SIP address")
    parser.add_argument("--port", type=int, default=5060)
    parser.add_argument("--caller", required=True, help="an address of the trunk, here")
    parser.add_argument("--stranger", help="an address of this machine no trunk lists")
    parser.add_argument("--ready", help="wait until this URL answers 200 before calling")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds each step may take")
    args = parser.parse_args()
    server = (args.host, args.port)
    try:
        if args.ready:
            await wait_ready(args.ready, 300.0)
        if args.stranger:
            await stranger_refused(server, args.stranger, args.limit)
        await spoken_call(server, args.caller, args.limit)
    except (AssertionError, BenchError, TimeoutError, OSError) as exc:
        print(f"sip-call-probe: FAILED: {type(exc).__name__}: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

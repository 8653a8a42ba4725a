"""Where a loaded server's CPU goes on WebRTC calls: py-spy's samples sorted into a call's parts.

``record`` samples a local server with py-spy (``--native``, so that time in libopus, libsrtp
and uvloop is seen under the Python code that called it) and reads the CPU time of each of
its threads from ``/proc`` before and after. ``attribute`` turns that into milliseconds of
CPU per call-second for each part (Opus encode and decode, SRTP, RTP packets, the event
loop, the VAD, …):

* The main thread's CPU time is split by its busy samples. A sample is idle when its
  innermost frames wait (a lock, a condition, the GIL, epoll); a busy sample belongs to the
  first part whose pattern matches, scanning the stack as a whole for the parts that share
  native code (libopus serves encode and decode alike), then frame by frame from the leaf.
* Other threads are taken from ``/proc`` alone: py-spy sees them waiting on the GIL far
  more often than they do. The busiest is the VAD's batch thread; the rest (aiortc's Opus
  decoder thread per call, libuv's and the executors' threads) are one row.

Blocking py-spy stops the server up to a few hundred times a second: the audio's lateness
while it runs means nothing, only the CPU does.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hark.bench.report import BenchError

VAD = "VAD"
OTHER_THREADS = "threads but the VAD's (aiortc's Opus decoder threads, libuv, executors)"
UNATTRIBUTED = "other (interpreter, garbage collection, unattributed native code)"
# Innermost frames of a thread that waits rather than runs.
_WAIT = re.compile(
    r"acquire_lock|pthread_cond_timedwait|pthread_cond_wait|take_gil|epoll_pwait|epoll_wait"
    r"|sem_wait|sem_clockwait"
)
_WAIT_DEPTH = 3
# The main thread: the interpreter's entry, or hark's event loop.
_MAIN = re.compile(r"Py_BytesMain|pymain_run|run_event_loop|<module> \(hark")
_MAIN_DEPTH = 12
# Parts recognised anywhere in a stack, before the leaf-first rules.
_STACK_PARTS = (
    (
        "Opus decode (and the hand-off to aiortc's decoder threads)",
        r"decoder_worker|OpusDecoder|opus_decode|_decoder_for"
        r"|rtcrtpreceiver\.py:\d+\);Queue\.put \(queue\.py",
    ),
    (
        "Opus encode",
        r"OpusEncoder|opus_encode|_opus_encoder|encoded_silence",
    ),
)
# Parts recognised by the innermost frame that matches, in this order for each frame.
_FRAME_PARTS = (
    ("Opus encode", r"libopus|^_frame \(hark/transports/webrtc/playout"),
    ("SRTP", r"srtp"),
    ("resampling", r"resample|soxr|ResampleStream"),
    (VAD, r"hark/engines/vad/|silero"),
    ("data channel / SCTP", r"rtcsctptransport|rtcdatachannel|sideband"),
    ("DTLS", r"OpenSSL|SSL\.py|_rust\.abi3|libcrypto"),
    ("jitter buffer", r"jitterbuffer"),
    ("RTCP", r"_run_rtcp|_send_rtcp|_handle_rtcp|[Rr]tcp"),
    (
        "RTP packets (aiortc's sender and receiver, or hark's own audio path)",
        r"aiortc/rtp\.py|rtcrtpreceiver|rtcrtpsender|rtcdtlstransport|aiortc/codecs"
        r"|webrtc/rtp_audio\.py|hark/transports/rtp\.py",
    ),
    ("input audio (frames to the session's input)", r"webrtc/input_audio\.py"),
    ("playout pacing", r"hark/transports/playout\.py|webrtc/playout\.py|transports/ticker\.py"),
    (
        "ICE and UDP socket I/O",
        r"aioice|udp_mux|webrtc/ice\.py|sendmsg|recvmsg|uv__udp|sendto|recvfrom",
    ),
    (
        "session core, runner, engines",
        r"hark/session/|hark/protocol/|hark/engines/|hark/transports/",
    ),
    (
        "server (HTTP, metrics, cluster)",
        r"hark/server/|hark/cluster/|hark/observability/|aiohttp|yarl|multidict",
    ),
    (
        "event loop (wake-ups, timers, tasks, futures)",
        r"uvloop|loop\.c|uv_run|uv__|asyncio|_asynciomodule|task_step|Handle__run",
    ),
)
_STACK_RULES = tuple((name, re.compile(pattern)) for name, pattern in _STACK_PARTS)
_FRAME_RULES = tuple((name, re.compile(pattern)) for name, pattern in _FRAME_PARTS)


@dataclass
class ServerProfile:
    """py-spy's samples of a server and the CPU time its threads used meanwhile."""

    # "frame;frame;…" (root first, as py-spy's raw format writes it) → samples.
    stacks: Mapping[str, int]
    # CPU seconds of the main thread and of each other thread over the sampling.
    main_cpu_s: float
    thread_cpu_s: list[float]
    elapsed_s: float

    @property
    def cores(self) -> float:
        """The server's CPU use over the sampling, in cores."""
        return (self.main_cpu_s + sum(self.thread_cpu_s)) / self.elapsed_s


def part_of(frames: list[str]) -> str | None:
    """The part a stack's CPU belongs to (root first); None when the thread was waiting."""
    if any(_WAIT.search(frame) for frame in frames[-_WAIT_DEPTH:]):
        return None
    stack = ";".join(frames)
    for name, pattern in _STACK_RULES:
        if pattern.search(stack):
            return name
    for frame in reversed(frames):
        for name, pattern in _FRAME_RULES:
            if pattern.search(frame):
                return name
    return UNATTRIBUTED


def attribute(profile: ServerProfile, calls: int) -> dict[str, float]:
    """Milliseconds of CPU per call-second of each part, most first."""
    counts: collections.Counter[str] = collections.Counter()
    for stack, samples in profile.stacks.items():
        frames = stack.split(";")
        if not any(_MAIN.search(frame) for frame in frames[:_MAIN_DEPTH]):
            continue
        part = part_of(frames)
        if part is not None:
            counts[part] += samples
    scale = 1000 / calls / profile.elapsed_s
    busy = sum(counts.values())
    parts = {part: profile.main_cpu_s * scale * n / busy for part, n in counts.items()}
    others = sorted(profile.thread_cpu_s, reverse=True)
    if others:
        parts[VAD] = parts.get(VAD, 0.0) + others[0] * scale
        parts[OTHER_THREADS] = sum(others[1:]) * scale
    return dict(sorted(parts.items(), key=lambda item: -item[1]))


def scaled(parts: Mapping[str, float], factor: float) -> dict[str, float]:
    """``parts`` with every figure multiplied by ``factor``: the same shares of another total."""
    return {part: ms * factor for part, ms in parts.items()}


def format_table(parts: Mapping[str, float]) -> str:
    """A Markdown table of the parts: share of the CPU, ms per call-second."""
    total = sum(parts.values())
    lines = ["| part | share of CPU | ms CPU per call-second |", "|---|---|---|"]
    lines += [f"| {part} | {ms / total:.1%} | {ms:.1f} |" for part, ms in parts.items()]
    return "\n".join(lines)


def read_raw(lines: Iterable[str]) -> dict[str, int]:
    """py-spy's ``--format raw`` output: one ``stack count`` per line."""
    stacks: dict[str, int] = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] += int(count)
    return stacks


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU time (user + system) of each thread of a local process, from ``/proc``."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended meanwhile
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def py_spy_command() -> list[str]:
    """How to run py-spy here: on the PATH, else through ``uvx``; ``BenchError`` if neither."""
    if path := shutil.which("py-spy"):
        return [path]
    if path := shutil.which("uvx"):
        return [path, "py-spy"]
    raise BenchError("--profile needs py-spy (pip install py-spy) or uv's uvx")


async def record(pid: int, seconds: float, *, rate: int = 50) -> ServerProfile:
    """Sample the local process ``pid`` for ``seconds`` with py-spy (which needs the right
    to trace it: root, or ``ptrace_scope`` 0)."""
    with tempfile.TemporaryDirectory(prefix="hark-profile-") as directory:
        output = Path(directory) / "profile.raw"
        before = thread_cpu_seconds(pid)
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *py_spy_command(),
            *("record", "--pid", str(pid), "--duration", str(max(1, round(seconds)))),
            *("--rate", str(rate), "--format", "raw", "--native", "--output", str(output)),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, errors = await process.communicate()
        after = thread_cpu_seconds(pid)
        elapsed = time.monotonic() - started
        if process.returncode != 0 or not output.exists():
            raise BenchError(f"py-spy failed: {errors.decode(errors='replace')[-500:]}")
        stacks = read_raw(output.read_text().splitlines())
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    main = used.pop(pid, 0.0)
    return ServerProfile(stacks, main, list(used.values()), elapsed)

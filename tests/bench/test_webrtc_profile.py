"""The server profile of ``hark bench webrtc --profile``: py-spy's stacks sorted into parts."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from hark.bench.report import BenchError
from hark.bench.webrtc_profile import (
    OTHER_THREADS,
    UNATTRIBUTED,
    VAD,
    ServerProfile,
    attribute,
    format_table,
    part_of,
    py_spy_command,
    read_raw,
    record,
    scaled,
    thread_cpu_seconds,
)

pytestmark = pytest.mark.realtime

MAIN = ";".join(
    (
        "0x7f01 (libc.so.6)",
        "Py_BytesMain (libpython3.11.so.1.0)",
        "run_event_loop (hark/eventloop.py:27)",
    )
)
THREAD = "0x7f02 (libc.so.6);Thread._bootstrap (threading.py:1002)"


def on_main(*frames: str) -> str:
    return ";".join((MAIN, *frames))


ENCODE = on_main(
    "PlayoutTrack.next_payload (hark/transports/webrtc/playout.py:124)",
    "OpusEncoder.encode (hark/audio/codecs/opus.py:112)",
    "0x7f9 (libopus.so.0)",
)
DECODE = on_main(
    "InputAudio.packet (hark/transports/webrtc/input_audio.py:97)",
    "OpusDecoder.decode (hark/audio/codecs/opus.py:131)",
    "0x7f9 (libopus.so.0)",
)
SRTP = on_main(
    "AudioSender._send (hark/transports/webrtc/rtp_audio.py:167)",
    "Session.protect (pylibsrtp/__init__.py:236)",
    "srtp_protect (pylibsrtp/_binding.abi3.so)",
)
RTP = on_main("AudioSender._send (hark/transports/webrtc/rtp_audio.py:164)")
PACK = on_main(
    "AudioSender._send (hark/transports/webrtc/rtp_audio.py:164)",
    "pack_rtp (hark/transports/rtp.py:84)",
)
IDLE = on_main("uv_run (core.c:452)", "uv__io_poll (linux.c:1370)", "epoll_pwait (libc.so.6)")
HANDOFF = on_main(
    "RTCRtpReceiver._handle_rtp_packet (aiortc/rtcrtpreceiver.py:567)",
    "Queue.put (queue.py:152)",
    "Condition.notify (threading.py:382)",
    "sem_post (libc.so.6)",
)


def frames(stack: str) -> list[str]:
    return stack.split(";")


def test_each_stack_goes_to_its_part() -> None:
    assert part_of(frames(ENCODE)) == "Opus encode"
    # libopus under the decoder is decoding, whatever its leaf says.
    assert str(part_of(frames(DECODE))).startswith("Opus decode")
    assert str(part_of(frames(HANDOFF))).startswith("Opus decode")
    assert part_of(frames(SRTP)) == "SRTP"
    assert str(part_of(frames(RTP))).startswith("RTP packets")
    # The packing shared with SIP is RTP too, not the call layer around it.
    assert str(part_of(frames(PACK))).startswith("RTP packets")
    assert part_of(frames(on_main("memcpy (libc.so.6)"))) == UNATTRIBUTED
    # A thread waiting in epoll (or on a lock, or the GIL) uses no CPU.
    assert part_of(frames(IDLE)) is None
    assert (
        part_of(frames(f"{THREAD};Condition.wait (threading.py:327);take_gil (ceval_gil.h)"))
        is None
    )


def test_the_cpu_is_split_by_busy_samples_of_the_main_thread_and_by_thread() -> None:
    profile = ServerProfile(
        stacks={ENCODE: 3, SRTP: 1, IDLE: 50, f"{THREAD};sgemm (libopenblas.so)": 40},
        main_cpu_s=0.8,
        thread_cpu_s=[0.1, 0.4, 0.1],
        elapsed_s=2.0,
    )
    parts = attribute(profile, calls=4)
    # ms per call-second: CPU seconds × 1000 / 4 calls / 2 s.
    assert parts == pytest.approx(
        {"Opus encode": 75.0, VAD: 50.0, "SRTP": 25.0, OTHER_THREADS: 25.0}
    )
    assert next(iter(parts)) == "Opus encode"
    assert sum(parts.values()) == pytest.approx(profile.cores * 1000 / 4)
    table = format_table(parts).splitlines()
    assert table[2] == "| Opus encode | 42.9% | 75.0 |"
    assert len(table) == 2 + 4
    # The same shares of a CPU measured elsewhere (without py-spy stopping the server).
    assert scaled(parts, 2.0) == pytest.approx({part: ms * 2 for part, ms in parts.items()})


def test_py_spy_raw_lines_are_read_with_spaces_in_frame_names() -> None:
    lines = [
        "a (x.py:1);Call.on.<locals>.<lambda> (hark/call.py:9) 7\n",
        "a (x.py:1);b (y.py:2) 2\n",
        "a (x.py:1);b (y.py:2) 1\n",
        "\n",
    ]
    assert read_raw(lines) == {
        "a (x.py:1);Call.on.<locals>.<lambda> (hark/call.py:9)": 7,
        "a (x.py:1);b (y.py:2)": 3,
    }


def test_thread_cpu_comes_from_proc() -> None:
    before = thread_cpu_seconds(os.getpid())
    assert os.getpid() in before, "the main thread's id is the process's"
    # /proc counts in scheduler ticks: work until one is counted (a busy machine may take
    # several rounds), within a bound that a reading stuck at one value does not pass.
    for _ in range(200):
        sum(i * i for i in range(300_000))
        after = thread_cpu_seconds(os.getpid())
        if after[os.getpid()] > before[os.getpid()]:
            break
    assert after[os.getpid()] > before[os.getpid()]


@pytest.mark.slow
async def test_a_busy_process_is_sampled_with_py_spy() -> None:
    try:
        py_spy_command()
    except BenchError:
        # CI installs uv (scripts/test), so uvx is there: a missing sampler fails there.
        if os.environ.get("CI"):
            raise
        pytest.skip("neither py-spy nor uvx is installed")
    spin = "import time\nwhile True:\n    sum(i * i for i in range(10000))\n    time.sleep(0)\n"
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", spin)
    try:
        profile = await record(process.pid, 1.0)
    finally:
        process.kill()
        await process.wait()
    assert profile.main_cpu_s > 0 and profile.elapsed_s > 0
    assert any("<genexpr>" in stack for stack in profile.stacks)

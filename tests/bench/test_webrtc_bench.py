"""``hark bench webrtc`` against a real server on the fake engines."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import socket
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from av import AudioFrame

from hark.bench import webrtc as webrtc_bench
from hark.bench.spoken_questions import QUESTIONS, RATE
from hark.bench.webrtc import (
    FRAME_SAMPLES,
    OPUS_RATE,
    Arrival,
    CallerAudio,
    CallerGroup,
    CapacityStep,
    ClientFigures,
    GroupWindow,
    PacketMicrophone,
    WebRtcBenchConfig,
    WebRtcReport,
    audible_share,
    caller_audio,
    format_summary,
    frame_to_mono,
    lateness_ms,
    measure_capacity,
    measure_setup,
    merge_windows,
    opus_packets,
    opus_silence,
    run_webrtc_bench,
    window_of,
)
from hark.cli import build_parser
from hark.config import Settings
from hark.server.app import create_app, make_runner
from tests.conftest import engines_sharing_turn
from tests.speech import spoken

pytestmark = pytest.mark.realtime

# Bounds a hang, never speed.
LIVENESS_S = 30


def webrtc_config(url: str, *options: str) -> WebRtcBenchConfig:
    """The bench's config as ``hark bench webrtc --url URL OPTIONS`` makes it."""
    parsed = build_parser().parse_args(["bench", "webrtc", "--url", url, *options])
    return WebRtcBenchConfig.from_options(vars(parsed))


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    settings = Settings(engines="fake", rtc_port=0)
    engines = engines_sharing_turn(settings)
    runner = make_runner(create_app(settings, engines))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(LIVENESS_S):
            while True:
                async with http.get(url + "/readyz") as response:
                    if response.status == 200:
                        break
                await asyncio.sleep(0.05)
    yield url
    await runner.cleanup()
    await engines.aclose()


async def test_setup_is_timed_step_by_step(server_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        result = await measure_setup(http, server_url, "any-key")
    assert result.error is None
    assert result.answer_ms is not None and result.first_audio_ms is not None
    assert result.channel_open_ms is not None and result.session_created_ms is not None
    assert 0 < result.answer_ms <= result.channel_open_ms <= result.first_audio_ms


async def test_an_unreachable_server_is_a_failure_not_a_crash() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    async with aiohttp.ClientSession() as http:
        result = await measure_setup(http, f"http://127.0.0.1:{closed_port}", "k")
    assert result.error is not None
    assert result.answer_ms is None


@pytest.fixture
def prompt(recorded_questions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The callers' question from the committed recording, never from Piper.
    monkeypatch.setenv("XDG_CACHE_HOME", str(recorded_questions.parent.parent))


def _arrivals(times_ms: list[float], timestamps: list[int]) -> list[Arrival]:
    return [Arrival(t / 1000, ts, b"x") for t, ts in zip(times_ms, timestamps, strict=True)]


def test_lateness_is_arrival_behind_the_schedule_of_the_rtp_timestamps() -> None:
    # 20 ms packets; the third comes 30 ms late, the fourth 5 ms late; the clock starts
    # anywhere and the timestamps wrap past 2**32 in the middle.
    start = 2**32 - 2 * FRAME_SAMPLES
    timestamps = [(start + i * FRAME_SAMPLES) % 2**32 for i in range(5)]
    times = [1000.0, 1020.0, 1070.0, 1065.0, 1080.0]
    assert lateness_ms(_arrivals(times, timestamps)) == pytest.approx([0, 0, 30, 5, 0])
    # On time is the earliest packet relative to its timestamp, wherever it is.
    times = [1003.0, 1020.0, 1040.0, 1060.0, 1080.0]
    assert lateness_ms(_arrivals(times, timestamps)) == pytest.approx([3, 0, 0, 0, 0])
    assert lateness_ms([]) == []


def test_a_window_is_computed_from_the_packets_that_arrived() -> None:
    silence = opus_silence()
    tone = (8000 * np.sin(np.arange(20 * FRAME_SAMPLES) * 2 * np.pi * 440 / OPUS_RATE)).astype(
        np.int16
    )
    speech = opus_packets(tone)
    call_a = [
        Arrival(10 + i * 0.02 + (0.04 if i == 7 else 0), i * FRAME_SAMPLES, payload)
        for i, payload in enumerate(speech[:10] + [silence] * 10)
    ]
    call_b = [Arrival(50 + i * 0.02, 7 + i * FRAME_SAMPLES, silence) for i in range(4)]
    client = ClientFigures(2, 1.0, 2.0, 3.0, 0.1)
    window = window_of([call_a, call_b], client, sample=0)
    assert window.frames == 24
    assert window.lateness_ms == pytest.approx([*lateness_ms(call_a), 0, 0, 0, 0])
    assert max(window.lateness_ms) == pytest.approx(40)
    assert sorted(window.gaps_ms)[-2:] == pytest.approx([20, 60])
    # The sampled call is decoded: half of its frames carry the tone (the encoder's
    # look-ahead and the decoder's ramp-up may move a frame across the line).
    assert 0.4 <= window.audible_share <= 0.6
    assert window_of([call_a, call_b], client, sample=1).audible_share == 0.0
    assert audible_share([]) != audible_share([])  # NaN: nothing to decide from


def test_the_step_merges_every_client_process() -> None:
    def window(lateness: list[float], calls: int, share: float) -> GroupWindow:
        client = ClientFigures(calls, 0.5 * calls, 1.0, 1.5, 0.2)
        return GroupWindow(lateness, [20.0] * len(lateness), len(lateness), share, client)

    first = window([0.0] * 98 + [50.0], 3, 0.5)
    second = window([1.0], 2, math.nan)
    step = merge_windows([first, second], failures=0, server_cpu=0.5)
    assert step.calls == 5 and step.frames == 100
    assert step.p50_lateness_ms == 0.0 and step.max_lateness_ms == 50.0
    assert step.p99_lateness_ms == pytest.approx(1.0 + 0.01 * 49)
    assert step.audible_share == 0.5
    assert step.server_ms_per_call_second == pytest.approx(100.0)
    assert [c.calls for c in step.clients] == [3, 2]


def test_the_summary_says_when_the_bench_was_late_too() -> None:
    def step(calls: int, server_p99: float, client_p99: float) -> CapacityStep:
        client = ClientFigures(calls, 1.0, client_p99, client_p99, 0.2)
        return CapacityStep(calls, 50, 1.0, server_p99, server_p99, 20.0, 0, clients=[client])

    report = WebRtcReport(
        url="http://h", capacity=[step(4, 9.0, 1.0), step(8, 30.0, 25.0)], capacity_calls=4
    )
    lines = format_summary(report).splitlines()
    assert lines[-2].startswith("  at 4 calls") and "late too" not in lines[-2]
    assert lines[-1].startswith("  at 8 calls") and lines[-1].endswith("not the server's alone)")


async def test_the_microphone_sends_the_prompt_then_silence_on_its_grid() -> None:
    audio = CallerAudio((b"p0", b"p1", b"p2"), b"s")
    lateness: deque[float] = deque(maxlen=100)
    microphone = PacketMicrophone(audio, period=5, phase=3, lateness=lateness)
    packets = [await microphone.recv() for _ in range(8)]
    assert [bytes(p) for p in packets] == [b"s", b"s", b"p0", b"p1", b"p2", b"s", b"s", b"p0"]
    assert [p.pts for p in packets] == [i * FRAME_SAMPLES for i in range(8)]
    assert len(lateness) == 8 and min(lateness) >= 0


async def test_the_callers_prompt_is_the_question_encoded_once(prompt: None) -> None:
    audio = await caller_audio()
    voiced_s = len(spoken(QUESTIONS[4], RATE)) / RATE
    # One 20 ms packet per frame of the voiced question (it is cut at its last voiced
    # sample), a packet of silence that decodes as silence.
    assert 0 < len(audio.prompt) * 0.02 <= voiced_s + 0.1
    assert audible_share(list(audio.prompt)) > 0.5
    assert audible_share([audio.silence] * 3) == 0.0


async def test_cheap_calls_log_what_the_server_sends(server_url: str, prompt: None) -> None:
    group = CallerGroup(server_url, "any-key", await caller_audio(), keep=1000)
    await group.start()
    try:
        assert await group.add(2, 0) == 0
        group.open_window()
        # Until every call has had some of the server's packets (50 a second), however long
        # a busy machine takes to send them.
        async with asyncio.timeout(LIVENESS_S):
            while True:
                if all(len(call.arrivals) >= 10 for call in group.calls):
                    break
                await asyncio.sleep(0.05)
        # Nothing awaits between the copy and the window: both see the same packets.
        seen = [list(call.arrivals) for call in group.calls]
        window = group.close_window()
    finally:
        await group.close()
    assert all(seen), "a call received nothing"
    assert window.frames == sum(len(arrivals) for arrivals in seen)
    assert window.lateness_ms == [ms for arrivals in seen for ms in lateness_ms(arrivals)]
    for arrivals in seen:
        steps = {(b.timestamp - a.timestamp) % 2**32 for a, b in itertools.pairwise(arrivals)}
        # The server's 20 ms Opus packets, each once, in order (a stalled tick skips ahead).
        assert steps and all(s % FRAME_SAMPLES == 0 and s > 0 for s in steps)
    assert window.client.calls == 2 and window.client.loop_lag_p99_ms >= 0
    assert window.client.send_lateness_p99_ms >= 0


@pytest.mark.slow
async def test_capacity_with_client_processes(server_url: str, prompt: None) -> None:
    config = webrtc_config(
        server_url,
        *("--api-key", "any-key", "--capacity", "--step", "3", "--max-calls", "3"),
        *("--hold", "5", "--threshold-ms", "1000", "--client-processes", "2"),
    )
    steps, carried = await measure_capacity(config, progress=False)
    (step,) = steps
    assert step.calls == 3 and step.setup_failures == 0 and carried == 3
    assert sorted(c.calls for c in step.clients) == [1, 2]
    assert step.frames > 0 and step.p99_lateness_ms >= step.p50_lateness_ms >= 0
    # The sampled call was decoded (a share, not NaN). Whether its window caught a reply
    # depends on how fast the server answered: a figure, which
    # test_a_window_is_computed_from_the_packets_that_arrived checks on fixed packets.
    assert 0 <= step.audible_share <= 1
    report = WebRtcReport(url=server_url, capacity=steps, capacity_calls=carried)
    summary = format_summary(report)
    assert "capacity: 3 simultaneous calls" in summary
    assert "at 3 calls the bench's own lateness (worst of 2 client processes)" in summary
    data = report.to_json()["capacity"]["steps"][0]
    assert len(data["clients"]) == 2 and data["server_ms_per_call_second"] is None
    json.dumps(data)


async def test_report_and_json(server_url: str, tmp_path: Path) -> None:
    report = await run_webrtc_bench(webrtc_config(server_url, "--api-key", "k", "--calls", "2"))
    summary = format_summary(report)
    assert "POST → data channel open" in summary and "2 calls, 0 failed" in summary
    data = report.to_json()
    assert data["setup"]["calls"] == 2 and data["setup"]["failures"] == 0
    assert data["setup"]["percentiles"]["first_audio_ms"]["count"] == 2
    json.dumps(data)


def test_the_command_line_reaches_the_bench() -> None:
    args = build_parser().parse_args(
        [
            *("bench", "webrtc", "--url", "http://127.0.0.1:1", "--calls", "3", "--capacity"),
            *("--client-processes", "4"),
        ]
    )
    assert args.calls == 3 and args.capacity and args.threshold_ms == 20.0
    assert args.client_processes == 4 and args.profile is None


def test_a_profile_needs_the_servers_pid(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(
        ["bench", "webrtc", "--url", "http://127.0.0.1:1", "--capacity", "--profile", "20"]
    )
    assert args.profile == 20.0
    assert args.handler(vars(args)) == 2
    assert "--profile needs --server-pid" in capsys.readouterr().err
    assert args.handler is webrtc_bench.command


def frame(samples: np.ndarray, layout: str, fmt: str = "s16", rate: int = 48000) -> AudioFrame:
    made = AudioFrame.from_ndarray(samples, format=fmt, layout=layout)
    made.sample_rate = rate
    return made


@pytest.mark.parametrize(
    ("samples", "layout", "fmt"),
    [
        (np.array([[100, 300, -100, -300]], np.int16), "stereo", "s16"),
        (np.array([[100, -100], [300, -300]], np.int16), "stereo", "s16p"),
        (np.array([[200, -200]], np.int16), "mono", "s16"),
        (np.array([[200 / 32768, -200 / 32768]], np.float32), "mono", "flt"),
    ],
)
def test_channels_are_averaged(samples: np.ndarray, layout: str, fmt: str) -> None:
    assert frame_to_mono(frame(samples, layout, fmt)).tolist() == [200, -200]

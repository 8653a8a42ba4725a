"""`hark bench latency`: the statistics, the spoken questions, and runs against real servers."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import WSMsgType, web

from hark.bench.latency import (
    TIMINGS_EVENT,
    LatencyBenchConfig,
    LatencyReport,
    Summary,
    TurnResult,
    format_summary,
    run_latency_bench,
    write_chart,
)
from hark.bench.spoken_questions import QUESTIONS, RATE, last_voiced_sample, spoken_questions
from hark.observability.turn_timing import STAGES
from tests.servers import hark_serve

pytestmark = pytest.mark.realtime

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- statistics --------------------------------------------------------------------------


def test_summary() -> None:
    assert Summary.of([]) is None
    summary = Summary.of([100.0, 200.0, 300.0, 400.0])
    assert summary == Summary(n=4, p50=250.0, p95=385.0, p99=397.0, mean=250.0, min=100, max=400)


# --- the last voiced sample ------------------------------------------------------------------


def test_last_voiced_sample_ends_with_the_loud_part() -> None:
    rng = np.random.default_rng(1)
    pcm = np.zeros(RATE, np.int16)
    voice = np.arange(6000, 14000)
    pcm[voice] = (8000 * np.sin(voice * 0.1)).astype(np.int16)
    # A hiss 60 dB below the voice after it is not speech.
    pcm[14000:20000] = rng.normal(0, 5, 6000).astype(np.int16)
    last = last_voiced_sample(pcm, RATE)
    frame = RATE // 100
    assert 13999 <= last < 14000 + frame
    # A quieter tail within the floor still counts.
    pcm[14000:16000] = (400 * np.sin(np.arange(2000) * 0.3)).astype(np.int16)
    assert 15999 <= last_voiced_sample(pcm, RATE) < 16000 + frame


def test_last_voiced_sample_of_silence_and_of_a_loud_end() -> None:
    assert last_voiced_sample(np.zeros(4800, np.int16), RATE) == -1
    assert last_voiced_sample(np.zeros(0, np.int16), RATE) == -1
    # Speech to the very end, with a length that is not a whole number of frames.
    pcm = (3000 * np.sin(np.arange(4805) * 0.2)).astype(np.int16)
    assert last_voiced_sample(pcm, RATE) == 4804


@pytest.fixture
def question_cache(recorded_questions: Path) -> Path:
    """The benchmark questions, recorded (no Piper)."""
    return recorded_questions


@pytest.mark.slow
def test_spoken_questions_are_synthesised_once_with_their_last_voiced_sample(
    tmp_path: Path,
) -> None:
    # This test is of the synthesis itself, so it runs Piper.
    question_cache = tmp_path / "hark" / "bench"
    asyncio.run(spoken_questions(QUESTIONS[:4], cache_dir=question_cache))
    cached = sorted(question_cache.glob("*.wav"))
    assert len(cached) == 4
    stamps = [path.stat().st_mtime_ns for path in cached]
    questions = asyncio.run(spoken_questions(QUESTIONS[:4], cache_dir=question_cache))
    # Read back, not synthesised again.
    assert [path.stat().st_mtime_ns for path in cached] == stamps
    for question in questions:
        assert 0.6 < question.duration_s < 4
        # The voice ends near the end of Piper's audio, never at its start.
        assert len(question.pcm) * 0.6 < question.last_voiced < len(question.pcm)
        tail = question.pcm[question.last_voiced + RATE // 100 :].astype(np.float64)
        assert tail.size == 0 or np.sqrt(np.mean(tail**2)) < 100


# --- summary and chart -----------------------------------------------------------------------


def _report(server_timings: bool) -> LatencyReport:
    turns = []
    for i in range(20):
        stages = {stage: 40.0 * (n + 1) + i for n, stage in enumerate(STAGES)}
        turns.append(
            TurnResult(
                client=i % 2,
                turn=i // 2,
                question=QUESTIONS[i % len(QUESTIONS)],
                status="completed",
                response_id=f"resp_{i}",
                v2v_ms=700.0 + 10 * i,
                e2a_ms=200.0 + 10 * i if server_timings else None,
                e2a_client_ms=205.0 + 10 * i,
                stages_ms=stages if server_timings else {},
                reply_audio_ms=1500.0,
                responses=1,
            )
        )
    turns.append(TurnResult(client=0, turn=10, question=QUESTIONS[0], status="cancelled"))
    config = LatencyBenchConfig(url="ws://127.0.0.1:1", turns=11, concurrency=2)
    return LatencyReport(config, server_timings, turns, started_at=0.0, duration_s=60.0)


def test_summary_excludes_failures_and_uses_the_server_e2a() -> None:
    summary = _report(server_timings=True).summary()
    assert (summary["turns"], summary["answered"], summary["failed"]) == (21, 20, 1)
    assert summary["failures"] == {"cancelled": 1}
    assert summary["e2a_source"] == "server"
    assert summary["e2a_ms"]["p50"] == 295.0
    assert summary["e2a_client_ms"]["p50"] == 300.0
    assert summary["v2v_ms"]["n"] == 20
    assert summary["stages_ms"]["transcript"]["p50"] == 49.5
    table = format_summary(_report(server_timings=True))
    assert "E2A (server)" in table and "first_audio_sent" in table and "cancelled 1" in table


def test_summary_falls_back_to_the_client_e2a() -> None:
    report = _report(server_timings=False)
    summary = report.summary()
    assert summary["e2a_source"] == "client"
    assert summary["e2a_ms"]["p50"] == 300.0
    assert all(stats is None for stats in summary["stages_ms"].values())
    assert "no stage breakdown" in format_summary(report)


def test_replies_cut_short_count_and_replies_without_audio_do_not() -> None:
    heard = TurnResult(client=0, turn=0, question="?", status="incomplete", v2v_ms=900.0)
    assert heard.ok
    assert not TurnResult(client=0, turn=0, question="?", status="no_audio").ok
    assert not TurnResult(client=0, turn=0, question="?", status="failed", v2v_ms=900.0).ok


def test_json_has_parameters_host_and_raw_turns() -> None:
    result = json.loads(json.dumps(_report(server_timings=True).to_json()))
    assert result["parameters"]["concurrency"] == 2
    assert "api_key" not in json.dumps(result)
    assert len(result["turns"]) == 21
    assert result["turns"][0]["stages_ms"]["transcript"] == 40.0
    assert result["summary"]["statuses"] == {"completed": 20, "cancelled": 1}


@pytest.mark.parametrize("server_timings", [True, False])
def test_chart(tmp_path: Path, server_timings: bool) -> None:
    path = tmp_path / "charts" / "latency.png"
    write_chart(_report(server_timings), path)
    assert path.read_bytes()[:8] == PNG_MAGIC


# --- against a scripted server without turn timings ----------------------------------------


class ScriptedServer:
    """A Realtime server that refuses ``include`` and answers each turn as told.

    A turn ends after 500 ms of silent chunks; the reply is 200 ms of audio, or nothing
    with the status ``cancelled`` when ``reply_status`` says so.
    """

    def __init__(self, reply_status: str) -> None:
        self.reply_status = reply_status
        self.session_updates: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "session.created", "session": {}})
        voiced, silent, responses = False, 0, 0
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                continue
            event = json.loads(message.data)
            if event["type"] == "session.update":
                self.session_updates.append(event["session"])
                if "include" in event["session"]:
                    error = {"type": "invalid_request_error", "param": "session.include"}
                    error["message"] = "Invalid value for 'include'."
                    await ws.send_json({"type": "error", "error": error})
                else:
                    await ws.send_json({"type": "session.updated", "session": {}})
            elif event["type"] == "input_audio_buffer.append":
                loud = np.abs(np.frombuffer(base64.b64decode(event["audio"]), "<i2")).max() > 300
                if loud and not voiced:
                    await ws.send_json({"type": "input_audio_buffer.speech_started"})
                voiced, silent = voiced or loud, 0 if loud else silent + 1
                if voiced and silent == 25:
                    voiced, responses = False, responses + 1
                    await self._reply(ws, f"resp_{responses}")
        return ws

    async def _reply(self, ws: web.WebSocketResponse, response_id: str) -> None:
        await ws.send_json({"type": "input_audio_buffer.speech_stopped"})
        await ws.send_json({"type": "response.created", "response": {"id": response_id}})
        if self.reply_status == "completed":
            audio = base64.b64encode(bytes(2 * RATE // 5)).decode()
            await ws.send_json(
                {"type": "response.output_audio.delta", "response_id": response_id, "delta": audio}
            )
        await ws.send_json(
            {"type": "response.done", "response": {"id": response_id, "status": self.reply_status}}
        )


@pytest.fixture
async def scripted(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ScriptedServer, str]]:
    script = ScriptedServer(request.param)
    app = web.Application()
    app.router.add_get("/v1/realtime", script.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield script, f"ws://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.slow
@pytest.mark.parametrize("scripted", ["completed"], indirect=True)
async def test_without_turn_timings_e2a_comes_from_the_client(
    scripted: tuple[ScriptedServer, str], question_cache: Path
) -> None:
    script, url = scripted
    config = LatencyBenchConfig(url=url, turns=2, think_s=(0.1, 0.2), cache_dir=question_cache)
    report = await run_latency_bench(config)
    # Asked with the include, then again without it.
    assert [TIMINGS_EVENT in s.get("include", []) for s in script.session_updates] == [True, False]
    assert not report.server_timings
    assert [t.status for t in report.turns] == ["completed", "completed"]
    for turn in report.turns:
        assert turn.e2a_ms is None and turn.stages_ms == {}
        assert turn.e2a_client_ms is not None and turn.e2a_client_ms >= 0
        # The script waits 25 chunks of silence (500 ms) after the last loud chunk.
        assert turn.v2v_ms is not None and turn.v2v_ms > 400
        assert turn.reply_audio_ms == 200.0
    assert report.summary()["e2a_ms"]["n"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("scripted", ["cancelled"], indirect=True)
async def test_cancelled_replies_are_failures(
    scripted: tuple[ScriptedServer, str], question_cache: Path
) -> None:
    _, url = scripted
    config = LatencyBenchConfig(url=url, turns=2, think_s=(0.1, 0.2), cache_dir=question_cache)
    report = await run_latency_bench(config)
    assert [t.status for t in report.turns] == ["cancelled", "cancelled"]
    summary = report.summary()
    assert (summary["answered"], summary["failures"]) == (0, {"cancelled": 2})
    assert summary["v2v_ms"] is None


# --- against `hark serve --engines fake` ---------------------------------------------------


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`hark serve --engines fake` (instant engines, real VAD), ready to take sessions."""
    log = tmp_path_factory.mktemp("bench-server") / "server.log"
    with hark_serve(["--engines", "fake"], log, without=("HARK_API_KEYS",), ready_s=120) as port:
        yield f"ws://127.0.0.1:{port}"


@pytest.mark.slow
def test_command_against_hark_serve(fake_server: str, question_cache: Path, tmp_path: Path) -> None:
    json_path, chart_path = tmp_path / "latency.json", tmp_path / "latency.png"
    env = {**os.environ, "XDG_CACHE_HOME": str(question_cache.parent.parent)}
    command = [sys.executable, "-m", "hark.cli", "bench", "latency", "--url", fake_server]
    command += ["--turns", "2", "--concurrency", "2", "--silence-ms", "400"]
    command += ["--json", str(json_path), "--chart", str(chart_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "V2V (client)" in done.stdout and "E2A (server)" in done.stdout

    result = json.loads(json_path.read_text())
    assert result["benchmark"] == "latency"
    parameters = result["parameters"]
    assert parameters["turn_detection"] == {"type": "server_vad", "silence_duration_ms": 400}
    assert (parameters["concurrency"], parameters["turns_per_client"]) == (2, 2)
    assert parameters["server_timings"] is True
    turns = result["turns"]
    assert sorted((t["client"], t["turn"]) for t in turns) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for turn in turns:
        assert turn["status"] == "completed", turn
        assert turn["responses"] == 1
        # V2V waits out the end-of-turn silence, give or take a VAD chunk and an audio frame.
        assert turn["v2v_ms"] >= 400 - 100
        assert 0 <= turn["e2a_ms"] <= turn["v2v_ms"]
        assert 0 <= turn["e2a_client_ms"] <= turn["v2v_ms"]
        assert set(turn["stages_ms"]) == set(STAGES)
        assert turn["reply_audio_ms"] > 0
    summary = result["summary"]
    assert (summary["turns"], summary["answered"], summary["e2a_source"]) == (4, 4, "server")
    assert summary["v2v_ms"]["n"] == 4
    assert set(summary["v2v_ms"]) == {"n", "p50", "p95", "p99", "mean", "min", "max"}
    assert summary["stages_ms"]["first_audio_sent"]["n"] == 4
    assert chart_path.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
async def test_semantic_vad_against_hark_serve(fake_server: str, question_cache: Path) -> None:
    config = LatencyBenchConfig(
        url=fake_server, turns=1, vad="semantic", think_s=(0.1, 0.2), cache_dir=question_cache
    )
    report = await run_latency_bench(config)
    (turn,) = report.turns
    assert turn.status == "completed" and report.server_timings
    assert turn.v2v_ms is not None and turn.e2a_ms is not None and turn.e2a_ms >= 0
    assert report.to_json()["parameters"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "auto",
    }

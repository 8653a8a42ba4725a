"""``hark serve``: start-up refusals, a real process, graceful SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator

import aiohttp
import pytest

from hark.cli import build_parser, main

SECRET = "sk-cli-test-9f8e7d6c5b4a"
# Bounds a hang, never a speed: a starved machine (load average 10-13) took over 60 s to
# print a line while the server started.
LIVENESS_S = 240.0


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No HARK_* variables from the caller; the root logger restored after main() set it up."""
    for name in list(os.environ):
        if name.startswith("HARK_"):
            monkeypatch.delenv(name)
    handlers, level = logging.root.handlers[:], logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


def test_refuses_to_listen_beyond_loopback_without_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--engines", "fake"]) == 2
    assert "HARK_API_KEYS" in capsys.readouterr().err


def test_invalid_settings_exit_with_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--llm-url", "http://127.0.0.1:1/v1"]) == 2
    assert "llm_model" in capsys.readouterr().err


def test_an_unknown_engine_is_refused_with_the_known_names(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--tts", "espeak"])
    assert exited.value.code == 2
    refused = capsys.readouterr().err
    assert "espeak" in refused and all(name in refused for name in ("fake", "openai", "piper"))
    # From the environment, the settings refuse it the same way.
    monkeypatch.setenv("HARK_ASR", "vosk")
    assert main(["serve", "--engines", "fake"]) == 2
    assert "asr must be one of fake, openai, whisper, not 'vosk'" in capsys.readouterr().err


def test_a_remote_engine_without_its_url_exits_with_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--engines", "fake", "--tts", "openai"]) == 2
    assert "tts_url" in capsys.readouterr().err


def test_a_subcommand_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([])
    assert exited.value.code == 2
    args = build_parser().parse_args(["serve", "--port", "0", "--llm-model", "x"])
    assert (args.port, args.llm_model, args.host) == (0, "x", None)


async def test_serves_until_sigterm_without_logging_keys() -> None:
    env = {**os.environ, "HARK_API_KEYS": f"sk-other,{SECRET}", "HARK_ENGINES": "fake"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hark.cli",
        "serve",
        "--port",
        "0",
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    logged: list[str] = []
    try:
        url = None
        while url is None:
            line = await asyncio.wait_for(process.stderr.readline(), timeout=LIVENESS_S)
            assert line, "hark exited before listening:\n" + "".join(logged)
            logged.append(line.decode())
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", logged[-1])
            url = match.group(1) if match else None

        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/healthz") as response:
                assert response.status == 200
            headers = {"Authorization": f"Bearer {SECRET}"}
            async with http.get(url + "/v1/models", headers=headers) as response:
                assert response.status == 200
            deadline = asyncio.get_running_loop().time() + LIVENESS_S
            while True:
                async with http.get(url + "/readyz") as response:
                    if response.status == 200 or asyncio.get_running_loop().time() > deadline:
                        break
                await asyncio.sleep(0.05)
            assert response.status == 200

        process.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(process.stderr.read(), timeout=LIVENESS_S)
        logged.append(rest.decode())
        assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    output = "".join(logged)
    assert "shutting down" in output
    # Once warm, the process froze its start-up heap out of garbage collection.
    settled = re.search(r"heap settled: (\d+) objects frozen", output)
    assert settled is not None and int(settled.group(1)) > 10_000
    assert SECRET not in output and SECRET[:10] not in output

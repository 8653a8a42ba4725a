"""Real SIP peers against a real ``hark serve``: SIPp scenarios (``scenarios/``) and the
servers they call, with or without a webhook receiver behind them.

SIPp runs one call per scenario (``-m 1``) and exits 0 when the call went exactly as the
scenario says, 1 otherwise; its message trace is kept so that a test can also check what the
peer saw (a status code, a header).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from openai.types.webhooks import RealtimeCallIncomingWebhookEvent

from tests.server.webhook_receiver import WebhookReceiver, webhook_receiver
from tests.servers import HarkProcess

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
# "What is the capital of France?" (tests/data/speech) as raw μ-law at 8 kHz, with 0.2 s of
# silence before and 1 s after, so that the server's VAD hears the turn end: made with
# `sox IN.wav -t raw -e mu-law -r 8000 -c 1 question.ulaw pad 0.2 1.0`.
QUESTION = SCENARIOS / "question.ulaw"
SECRET = "whsec_" + base64.b64encode(b"hark sip peers test webhook key!").decode()
API_KEY = "local"
# Bounds a hang, never speed.
LIVENESS_S = 60.0


def free_sip_port() -> int:
    """A port free for both UDP and TCP on loopback (SIP listens on both)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no port free for both UDP and TCP")


def free_media_port() -> int:
    """An even UDP port ``p`` with ``p + 2`` free too: SIPp binds both (audio and video)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 60000, 2)
        with contextlib.ExitStack() as stack:
            try:
                for candidate in (port, port + 1, port + 2, port + 3):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                    sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return port
    raise RuntimeError("no free even UDP port pair")


@dataclass
class SippRun:
    """How one SIPp call went."""

    returncode: int
    messages: str
    errors: str
    screen: str

    @property
    def ok(self) -> bool:
        """The call followed the scenario to its end."""
        return self.returncode == 0

    def received(self) -> list[str]:
        """Every message SIPp received, in order, as text."""
        return self._messages(" message received ")

    def sent(self) -> list[str]:
        """Every message SIPp sent, in order, as text."""
        return self._messages(" message sent ")

    def _messages(self, marker: str) -> list[str]:
        # SIPp's trace: a dashed line with a time, "UDP message received [N] bytes :", a
        # blank line, then the message.
        found = []
        for block in self.messages.split("\n-----------------------------------------------"):
            header, _, text = block.partition("\n\n")
            if marker in header:
                found.append(text.strip("\n"))
        return found

    def describe(self) -> str:
        """Everything a failing assertion should show."""
        return (
            f"sipp exited {self.returncode}\n--- errors\n{self.errors[-3000:]}\n"
            f"--- messages\n{self.messages[-6000:]}\n--- screen\n{self.screen[-2000:]}"
        )


def sipp_command(
    scenario: str,
    sip_port: int,
    workdir: Path,
    *,
    transport: str,
    timeout_s: float,
    service: str,
    local_ip: str = "127.0.0.1",
    extra: tuple[str, ...] = (),
) -> tuple[list[str], Path, Path]:
    """SIPp's command line for one call, and where its message and error logs will be;
    SIPp signals and streams from ``local_ip`` (any 127/8 address)."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(QUESTION, workdir / QUESTION.name)
    name = f"{scenario}-{transport}-{random.randrange(1 << 30)}"
    messages = workdir / f"{name}.messages.log"
    errors = workdir / f"{name}.errors.log"
    command = [
        "sipp",
        "-sf",
        str(SCENARIOS / f"{scenario}.xml"),
        f"127.0.0.1:{sip_port}",
        "-s",
        service,
        "-t",
        transport,
        "-m",
        "1",
        "-l",
        "1",
        "-i",
        local_ip,
        "-p",
        str(free_sip_port()),
        "-mi",
        local_ip,
        "-mp",
        str(free_media_port()),
        "-nostdin",
        "-trace_msg",
        "-message_file",
        str(messages),
        "-trace_err",
        "-error_file",
        str(errors),
        "-timeout",
        f"{int(timeout_s)}s",
        "-timeout_error",
        *extra,
    ]
    return command, messages, errors


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


async def run_sipp(
    scenario: str,
    sip_port: int,
    workdir: Path,
    *,
    transport: str = "u1",
    timeout_s: float = LIVENESS_S,
    service: str = "hark",
    local_ip: str = "127.0.0.1",
    extra: tuple[str, ...] = (),
) -> SippRun:
    """Place one call with ``scenarios/<scenario>.xml`` at hark's SIP port on loopback.

    ``transport`` is SIPp's ``-t``: ``u1`` (UDP) or ``t1`` (TCP). SIPp runs in ``workdir``
    (with a copy of ``question.ulaw``, which ``uac_rtp.xml`` streams) and leaves its logs
    there; it calls from ``local_ip``, with ``extra`` options (``-au``/``-ap``: digest
    credentials).
    """
    command, messages, errors = sipp_command(
        scenario,
        sip_port,
        workdir,
        transport=transport,
        timeout_s=timeout_s,
        service=service,
        local_ip=local_ip,
        extra=extra,
    )
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=workdir,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(timeout_s + 30):
            screen, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return SippRun(
        process.returncode, _read(messages), _read(errors), screen.decode(errors="replace")
    )


@dataclass
class SipServer:
    """A running ``hark serve`` with SIP on ``sip_port`` (UDP and TCP, loopback)."""

    process: HarkProcess
    sip_port: int

    @property
    def url(self) -> str:
        """The HTTP root."""
        return self.process.url

    def sdk(self) -> openai.AsyncOpenAI:
        """The official SDK, pointed at this server and holding the webhook secret."""
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, webhook_secret=SECRET)

    def log(self) -> str:
        """What the server has written so far."""
        return self.process.log.read_text(errors="replace")

    def alive(self) -> bool:
        """The process runs and ``/readyz`` answers 200."""
        assert self.process.proc is not None
        return self.process.proc.poll() is None and self.process.readyz() == 200


def sip_server_args(sip_port: int, *extra: str, fake_engines: bool = True) -> list[str]:
    """``hark serve`` options for a SIP server on loopback, on the fake engines unless told
    otherwise (then the embedded models)."""
    return [
        *(["--engines", "fake"] if fake_engines else []),
        "--sip-host",
        "127.0.0.1",
        "--sip-port",
        str(sip_port),
        "--sip-advertise-ip",
        "127.0.0.1",
        "--rtp-ports",
        "0",
        # Calls still up when a test ends (a fuzzed INVITE answered at once) are hung up
        # within a second of the stop rather than waited for.
        "--drain-timeout",
        "1",
        # The tests place many calls (and fuzz) from one address; the per-source rate limit
        # has tests of its own. Callers on loopback need no trunk: SIP listens on loopback.
        "--sip-invite-rate",
        "1000",
        *extra,
    ]


@contextlib.contextmanager
def sip_serve(log: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[SipServer]:
    """A ``hark serve --engines fake`` with SIP on a free port, stopped afterwards."""
    sip_port = free_sip_port()
    with HarkProcess(sip_server_args(sip_port, *extra), log, env=env) as process:
        yield SipServer(process, sip_port)


@pytest.fixture
def sip_server(tmp_path: Path) -> Iterator[SipServer]:
    """A SIP server without a webhook: it answers every call at once."""
    with sip_serve(tmp_path / "hark.log") as server:
        yield server


@dataclass
class WebhookSipServer:
    """A SIP server that raises each call as a signed webhook to ``receiver``."""

    server: SipServer
    receiver: WebhookReceiver

    async def incoming_call(self, timeout_s: float = 30.0) -> RealtimeCallIncomingWebhookEvent:
        """The next ``realtime.call.incoming`` event, verified by the SDK's ``unwrap``."""
        delivery = await asyncio.to_thread(self.receiver.next, timeout_s)
        event = self.server.sdk().webhooks.unwrap(delivery.body, delivery.headers)
        assert isinstance(event, RealtimeCallIncomingWebhookEvent), event
        return event


@pytest.fixture
def webhook_sip_server(tmp_path: Path) -> Iterator[WebhookSipServer]:
    """A SIP server that asks a webhook receiver about every call; calls not accepted within
    5 s are rejected."""
    with (
        webhook_receiver() as receiver,
        sip_serve(
            tmp_path / "hark.log",
            "--sip-webhook-url",
            receiver.url,
            "--sip-accept-timeout",
            "5",
            env={"HARK_SIP_WEBHOOK_SECRET": SECRET},
        ) as server,
    ):
        yield WebhookSipServer(server, receiver)

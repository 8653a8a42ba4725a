"""``hark serve``: the options of the Realtime API server and the loop that runs it.

Only what reading the options needs is imported at the top: ``hark serve --help`` and the
``hark`` command's parser load this module, the server itself is imported when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from hark import __version__
from hark.cli import configure_logging
from hark.config import ENGINE_SETS, LOG_LEVELS, ConfigError, Settings, load_settings
from hark.engines.registry import (
    ENGINE_TABLES,
    PRESETS,
    EngineUnavailableError,
    build_engines,
    engine_names,
)

if TYPE_CHECKING:
    from aiohttp import web

logger = logging.getLogger("hark")

EXIT_USAGE = 2
DESCRIPTION = (
    "Run the server. Every option also reads HARK_<OPTION> from the environment (e.g. "
    "HARK_LLM_URL) and <option> from the --config file; API keys come from HARK_API_KEYS "
    "(comma-separated) or api_keys in the file. An entry metrics:KEY makes KEY a metrics key, "
    "which reads /metrics and nothing else."
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """The options of ``hark serve``."""
    # One paragraph, wrapped to the terminal (the module's docstring is for the code's
    # readers).
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.HelpFormatter
    # default=None everywhere: an option the user did not give must not hide the
    # environment or the file.
    parser.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port to bind (default 8000)")
    presets = "; ".join(
        f"{preset}: " + ", ".join(f"{kind} {name}" for kind, name in kinds.items())
        for preset, kinds in PRESETS.items()
    )
    parser.add_argument(
        "--engines",
        choices=ENGINE_SETS,
        default=None,
        help="the preset for each engine not named by --vad/--asr/--llm/--tts (default "
        f"embedded). {presets}",
    )
    for kind, table in ENGINE_TABLES.items():
        url_note = f"; openai when --{kind}-url is given" if kind != "vad" else ""
        parser.add_argument(
            f"--{kind}",
            choices=sorted(table),
            default=None,
            help=f"the {kind.upper()} engine (default: the --engines preset's{url_note})",
        )
    parser.add_argument(
        "--llm-url",
        default=None,
        metavar="URL[,URL...]",
        help="OpenAI-compatible LLM endpoints; with several, a response fails over between them",
    )
    parser.add_argument(
        "--llm-model", default=None, metavar="NAME", help="LLM name (required with --llm-url)"
    )
    parser.add_argument("--llm-api-key", default=None, metavar="KEY", help="key for --llm-url")
    parser.add_argument(
        "--llm-model-path", default=None, metavar="PATH", help="a GGUF file for llama.cpp"
    )
    parser.add_argument(
        "--llm-context-tokens",
        type=int,
        default=None,
        metavar="N",
        help="the --llm-url model's context size, for truncation (default: vLLM's max_model_len)",
    )
    parser.add_argument(
        "--asr-model",
        default=None,
        metavar="PATH|NAME",
        help="whisper: a faster-whisper model path; openai: the model's name (default whisper-1)",
    )
    parser.add_argument(
        "--asr-device", default=None, metavar="DEVICE", help="ASR device (default cpu)"
    )
    parser.add_argument(
        "--asr-url",
        default=None,
        metavar="URL",
        help="an OpenAI audio API for --asr openai (POST URL/audio/transcriptions)",
    )
    parser.add_argument("--asr-api-key", default=None, metavar="KEY", help="key for --asr-url")
    parser.add_argument(
        "--tts-model",
        default=None,
        metavar="PATH|NAME",
        help=(
            "piper: a voice's .onnx path; hibari: a voice on this machine (default heart);"
            " openai: the model's name (default tts-1)"
        ),
    )
    parser.add_argument(
        "--tts-url",
        default=None,
        metavar="URL",
        help="an OpenAI audio API for --tts openai (POST URL/audio/speech)",
    )
    parser.add_argument("--tts-api-key", default=None, metavar="KEY", help="key for --tts-url")
    for option, what, default in (
        ("--llm-first-token-timeout", "for the LLM's first token", 30),
        ("--llm-token-timeout", "between two of the LLM's tokens", 15),
        ("--tts-clause-timeout", "to speak one clause", 30),
        ("--asr-timeout", "for one transcription", 60),
    ):
        parser.add_argument(
            option,
            type=float,
            default=None,
            metavar="SECONDS",
            help=f"how long to wait {what} before that response or transcription fails "
            f"(default {default})",
        )
    parser.add_argument(
        "--config", dest="config_file", default=None, metavar="FILE", help="a TOML file"
    )
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default=None, help="log level (default info)"
    )
    parser.add_argument(
        "--rtc-port",
        type=int,
        default=None,
        metavar="PORT",
        help="the one UDP port all WebRTC calls share (default 8443; 0: any free port)",
    )
    parser.add_argument(
        "--rtc-advertise-ip",
        default=None,
        metavar="IP",
        help="address WebRTC clients reach the UDP port at (default: the bound host)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="server processes sharing the port, e.g. one per core (default 1)",
    )
    parser.add_argument(
        "--vad-rate",
        type=int,
        choices=(16000, 8000),
        default=None,
        help="the rate the VAD model hears; 8000 costs about a quarter less (default 16000)",
    )
    parser.add_argument(
        "--echo-cancellation",
        choices=("on", "sip", "off"),
        default=None,
        help="take the reply's echo out of callers' audio before the VAD hears it, so that a "
        "speakerphone does not interrupt the reply: sip (phone calls; the default), on (WebRTC "
        "calls too, whose browsers cancel their own echo; about as much CPU again per call "
        "while the reply plays) or off",
    )
    parser.add_argument(
        "--otel-endpoint",
        default=None,
        metavar="URL",
        help="send a trace per turn to this OTLP/HTTP collector (default: no traces)",
    )
    parser.add_argument(
        "--demo",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the browser demo at / (default: only on loopback without API keys). "
        "The demo hands a 60-second key to anyone who can load the page: with --demo on a "
        "reachable address, anyone who reaches the server can use it",
    )
    parser.add_argument(
        "--egress-allow",
        default=None,
        metavar="CIDR|HOST[,...]",
        help="networks and host names (*.domain for all under it) a client may point the "
        "server at though they are not public, e.g. an MCP server_url on 10.0.0.0/8; the "
        "networks also open ICE checks to a WebRTC offer's candidates there (default: "
        "public addresses only, and candidates on the server's own kind of network)",
    )
    parser.add_argument(
        "--voice-map",
        default=None,
        metavar="ID=VOICE[,...]",
        help="which installed voice speaks for a voice the TTS lacks, e.g. an OpenAI custom "
        "voice id: voice_68ad2a=en_US-joe-medium (default: the engine's default voice)",
    )
    parser.add_argument(
        "--prompts",
        default=None,
        metavar="DIR",
        help="stored prompts a session may name as prompt {id, version, variables}: "
        "DIR/<id>.json or .txt, or DIR/<id>/<version>.json or .txt (default: none)",
    )
    parser.add_argument(
        "--allowed-hosts",
        default=None,
        metavar="HOST[,...]",
        help="without API keys, Host names answered besides loopback ones (default: none)",
    )
    parser.add_argument(
        "--allowed-origins",
        default=None,
        metavar="ORIGIN[,...]",
        help="without API keys, page origins answered besides the server's own (default: none)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        metavar="N",
        help="sessions and calls one worker runs at once; more get 503 (default 1000)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="open HTTP connections per worker; more are closed at once (default 4096)",
    )
    parser.add_argument(
        "--http-idle-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="an HTTP connection idle this long, or this slow to send a request's headers, is "
        "closed (default 75)",
    )
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help="Redis shared by every worker of every host: redis://host:6379/0, rediss:// for "
        "TLS, or redis+sentinel://host:26379,host2:26379/mymaster behind Sentinel (prefer "
        "HARK_REDIS_URL when it holds a password). Default: an embedded store shared by the "
        "--workers of this machine",
    )
    fleet.add_argument(
        "--redis-password",
        default=None,
        metavar="PASSWORD",
        help="Redis's password, for a --redis-url that holds none (prefer "
        "HARK_REDIS_PASSWORD: arguments are visible)",
    )
    fleet.add_argument(
        "--advertise-url",
        default=None,
        metavar="URL",
        help="how other workers reach this one (default http://<host>:<port>)",
    )
    fleet.add_argument(
        "--hop-tls-cert",
        default=None,
        metavar="PEM",
        help="TLS between workers: this worker's certificate chain, signed by --hop-tls-ca; "
        "hops then come to a TLS listener and are forwarded over TLS only",
    )
    fleet.add_argument("--hop-tls-key", default=None, metavar="PEM", help="its private key")
    fleet.add_argument(
        "--hop-tls-ca",
        default=None,
        metavar="PEM",
        help="the fleet's CA: workers' hop certificates must be signed by it (both ways)",
    )
    fleet.add_argument(
        "--hop-port",
        type=int,
        default=None,
        metavar="PORT",
        help="the TLS hop listener's port (default 0: any free port, advertised in the "
        "registry; with --workers, worker i takes PORT + i)",
    )
    fleet.add_argument("--zone", default=None, metavar="NAME", help="this worker's zone")
    fleet.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="on SIGTERM, how long running sessions may go on before they are ended (default 60)",
    )
    fleet.add_argument(
        "--key-max-sessions",
        type=int,
        default=None,
        metavar="N",
        help="open sessions and calls per API key across the fleet (default: no limit)",
    )
    fleet.add_argument(
        "--key-requests-per-minute",
        type=int,
        default=None,
        metavar="N",
        help="sessions, calls and client secrets per API key and minute (default: no limit)",
    )
    fleet.add_argument(
        "--key-tokens-per-minute",
        type=int,
        default=None,
        metavar="N",
        help="response tokens per API key and minute across the fleet (default: no limit)",
    )
    fleet.add_argument(
        "--relay-address",
        default=None,
        metavar="IP:PORT",
        help="behind hark relay: its public address, which the answers' candidates carry",
    )
    fleet.add_argument(
        "--fleet-secret",
        default=None,
        metavar="SECRET",
        help="the fleet's secret, the same on every worker and relay: it signs routing hints "
        "and the records in Redis; needed with --redis-url (prefer HARK_FLEET_SECRET: "
        "arguments are visible)",
    )
    sip = parser.add_argument_group("SIP (phones)")
    sip.add_argument(
        "--sip",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="answer SIP calls (default: on; --no-sip turns the SIP service off)",
    )
    sip.add_argument(
        "--sip-host", default=None, metavar="HOST", help="address SIP binds (default: --host)"
    )
    sip.add_argument(
        "--sip-port",
        type=int,
        default=None,
        metavar="PORT",
        help="the SIP port, UDP and TCP (default 5060; 0: any free port). A port in use "
        "leaves the server up without SIP, and /readyz says so",
    )
    sip.add_argument(
        "--sip-advertise-ip",
        default=None,
        metavar="IP",
        help="address phones reach SIP and RTP at, put in Contact and SDP (default: the bound "
        "host)",
    )
    sip.add_argument(
        "--sip-tls-port",
        type=int,
        default=None,
        metavar="PORT",
        help="SIP over TLS on this port (needs --sip-tls-cert and --sip-tls-key)",
    )
    sip.add_argument("--sip-tls-cert", default=None, metavar="PEM", help="certificate chain")
    sip.add_argument("--sip-tls-key", default=None, metavar="PEM", help="its private key")
    sip.add_argument(
        "--sip-tls-client-ca",
        default=None,
        metavar="PEM",
        help="mutual TLS: SIP over TLS only from peers with a certificate this CA signed "
        "(default: any peer)",
    )
    sip.add_argument(
        "--rtp-ports",
        default=None,
        metavar="FIRST-LAST",
        help="each call has its own RTP port, taken from this range (default 10000-20000; "
        "0: any free port)",
    )
    sip.add_argument(
        "--sip-webhook-url",
        default=None,
        metavar="URL",
        help="where each call raises a signed realtime.call.incoming webhook; the backend "
        "answers with /v1/realtime/calls/{id}/accept or /reject (default: none, every call is "
        "answered at once with --sip-session)",
    )
    sip.add_argument(
        "--sip-webhook-secret",
        default=None,
        metavar="whsec_…",
        help="the webhooks' signing secret (prefer HARK_SIP_WEBHOOK_SECRET: arguments are visible)",
    )
    sip.add_argument(
        "--sip-accept-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a call neither accepted nor rejected this long after it rang is rejected "
        "(default 30)",
    )
    sip.add_argument(
        "--sip-t1-ms",
        type=float,
        default=None,
        metavar="MS",
        help="SIP's T1, the round-trip estimate that retransmissions and timeouts (64·T1) "
        "scale with; smaller only on a closed network (default 500)",
    )
    sip.add_argument(
        "--sip-session",
        default=None,
        metavar="JSON",
        help="the session config of calls answered without a webhook (default: the server's "
        "default session)",
    )
    sip.add_argument(
        "--sip-trunks",
        default=None,
        metavar="JSON",
        help="who may call: a JSON list of inbound trunks, each with name, addresses (CIDRs), "
        "username and password (digest), numbers, trusted, and for SIP over TLS the client "
        "certificate its calls must come with: tls_client_ca (PEM path), tls_client_names, "
        "tls_client_fingerprints (SHA-256); see docs/sip.md; e.g. "
        '\'[{"name": "pbx", "addresses": ["203.0.113.0/24"]}]\' (default: none, every caller; '
        "allowed only on a loopback --sip-host or with --sip-webhook-url). Prefer "
        "HARK_SIP_TRUNKS or [[sip_trunks]] in the --config file: arguments are visible",
    )
    sip.add_argument(
        "--sip-invite-rate",
        type=float,
        default=None,
        metavar="PER_SECOND",
        help="new INVITEs (and other out-of-dialog requests) a second from one address, "
        "bursts of twice that; more get 503 (default 10)",
    )
    sip.add_argument(
        "--sip-max-calls",
        type=int,
        default=None,
        metavar="N",
        help="SIP calls ringing or answered at once; more get 503 (default 500)",
    )
    sip.add_argument(
        "--sip-rtp-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="hang up an answered call after this long without RTP from the caller (default 60)",
    )


def command(options: dict[str, object]) -> int:
    """Run ``hark serve`` (with ``--workers``, its processes) until SIGINT or SIGTERM; the
    exit status."""
    try:
        settings = load_settings(options, env=os.environ)
    except ConfigError as exc:
        print(f"hark: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.log_level)
    if settings.workers > 1:
        from hark.server.workers import run_workers

        return run_workers(settings)
    from hark.eventloop import run_event_loop

    try:
        return run_event_loop(serve(settings))
    except KeyboardInterrupt:
        # Ctrl-C before the signal handlers were installed.
        return 130


async def serve(settings: Settings, sock: socket.socket | None = None) -> int:
    """Run the server until SIGINT or SIGTERM; returns the exit status.

    ``sock`` is a listening socket to serve on instead of binding ``settings.host:port``
    (a worker of ``--workers`` gets the one its parent bound).
    """
    stop = asyncio.Event()
    drain = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigterm() -> None:
        # The first SIGTERM drains (Kubernetes, `--workers`' parent); a second stops at once.
        if drain.is_set():
            stop.set()
        drain.set()

    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await _serve_until(stop, settings, sock, drain=drain)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _serve_until(
    stop: asyncio.Event,
    settings: Settings,
    sock: socket.socket | None = None,
    *,
    drain: asyncio.Event | None = None,
) -> int:
    from aiohttp import web

    from hark.cluster.hop_tls import HopTlsError
    from hark.observability.tracing import TracingUnavailableError
    from hark.server.app import (
        create_app,
        drain_app,
        make_runner,
        set_advertised_port,
        set_hop_port,
        webrtc_startup_error,
    )
    from hark.server.auth import InsecureBindError
    from hark.server.state import HOP_TLS, NODE

    try:
        chosen = ", ".join(f"{kind}: {name}" for kind, name in engine_names(settings).items())
        engines = build_engines(settings)
    except EngineUnavailableError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    try:
        try:
            app = create_app(settings, engines)
        except (InsecureBindError, TracingUnavailableError, HopTlsError) as exc:
            logger.error("%s", exc)
            return EXIT_USAGE
        runner = make_runner(app)
        await runner.setup()
        try:
            rtc_error = webrtc_startup_error(app)
            if rtc_error is not None:
                logger.error("%s (set --rtc-port)", rtc_error)
                return 1
            site: web.BaseSite = (
                web.TCPSite(runner, settings.host, settings.port)
                if sock is None
                else web.SockSite(runner, sock)
            )
            hop_tls = app.get(HOP_TLS)
            try:
                await site.start()
                if sock is None:
                    set_advertised_port(app, runner.addresses[0][1])
                elif hop_tls is None:
                    # The workers of `--workers` share the public port, so other workers
                    # reach each one on a port of its own.
                    await web.TCPSite(runner, settings.host, 0).start()
                    set_advertised_port(app, runner.addresses[-1][1])
            except OSError as exc:
                logger.error("cannot listen on %s port %d: %s", settings.host, settings.port, exc)
                return 1
            public = list(runner.addresses)
            if hop_tls is not None:
                # Other workers reach this one on its TLS hop listener alone.
                hop_site = web.TCPSite(
                    runner, settings.host, settings.hop_port, ssl_context=hop_tls.server
                )
                try:
                    await hop_site.start()
                except OSError as exc:
                    logger.error(
                        "cannot listen for worker hops on %s port %d: %s",
                        settings.host,
                        settings.hop_port,
                        exc,
                    )
                    return 1
                set_hop_port(app, runner.addresses[-1][1])
                logger.info("worker hops over TLS at %s", app[NODE].url)
            settled = asyncio.create_task(_settle_heap_when_warm(app), name="hark-settle-heap")
            for host, port, *_ in public:
                logger.info(
                    "hark %s listening on http://%s:%d (%s; model %s)",
                    __version__,
                    f"[{host}]" if ":" in host else host,
                    port,
                    chosen,
                    settings.llm_model_name,
                )
            await _wait_for_stop(stop, drain)
            if drain is not None and drain.is_set() and not stop.is_set():
                logger.info("draining (up to %.0f s)", settings.drain_timeout)
                draining = asyncio.create_task(drain_app(app, settings.drain_timeout))
                await _wait_for_stop(stop, draining)
                if not draining.done():
                    draining.cancel()
            logger.info("shutting down")
            settled.cancel()
            return 0
        finally:
            await runner.cleanup()
    finally:
        await engines.aclose()


async def _wait_for_stop(
    stop: asyncio.Event, other: asyncio.Event | asyncio.Task[None] | None
) -> None:
    """Until ``stop`` is set or ``other`` (an event set, a task done) happens."""
    waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
    if isinstance(other, asyncio.Event):
        waits.append(asyncio.ensure_future(other.wait()))
    elif other is not None:
        waits.append(other)
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            if wait is not other:
                wait.cancel()


async def _settle_heap_when_warm(app: web.Application) -> None:
    from hark.eventloop import settle_heap
    from hark.server.app import STATE

    warmup = app[STATE].warmup
    if warmup is not None:
        await asyncio.wait([warmup])
    settle_heap()

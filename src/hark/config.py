"""Server settings: command line, ``HARK_*`` environment variables, a TOML file, defaults.

Precedence, highest first: command line > environment > configuration file > defaults.
Every option has the same name everywhere: ``--llm-url`` on the command line, ``HARK_LLM_URL``
in the environment, ``llm_url`` in the file.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from hark.transports.sip.trunk import InboundTrunk

EngineSet = Literal["embedded", "fake"]

ENGINE_SETS: tuple[EngineSet, ...] = ("embedded", "fake")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_EMBEDDED_LLM_MODEL = "smollm2-135m"
ENV_PREFIX = "HARK_"
# The shapes of ``redis_url`` (``hark.cluster.redis_url`` reads them whole).
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
CONFIG_ENV_VAR = "HARK_CONFIG"
# The options that limit how long an engine stage may wait (seconds).
STAGE_TIMEOUT_OPTIONS = (
    "llm_first_token_timeout",
    "llm_token_timeout",
    "tts_clause_timeout",
    "asr_timeout",
)


class ConfigError(ValueError):
    """The settings are invalid; the message says which option and why."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``hark serve`` needs to know. Secrets are left out of ``repr``."""

    host: str = "127.0.0.1"
    port: int = 8000
    # The preset that fills in each engine not named below (``--vad``, ``--asr``…).
    engines: EngineSet = "embedded"
    # An engine by name from the registry's table of its kind (None: the preset's; for the
    # LLM, ASR and TTS, ``openai`` when their URL is given).
    vad: str | None = None
    asr: str | None = None
    llm: str | None = None
    tts: str | None = None
    # OpenAI-compatible endpoints; several: one engine fails over between them.
    llm_url: tuple[str, ...] = ()
    # None means "the embedded default" for embedded engines; a remote LLM needs a name.
    llm_model: str | None = None
    llm_api_key: str | None = field(default=None, repr=False)
    llm_model_path: str | None = None
    # The remote LLM's context in tokens (None: what the backend says, see openai_compatible).
    llm_context_tokens: int | None = None
    # Whisper: a faster-whisper model path; openai: the remote model's name.
    asr_model: str | None = None
    asr_device: str = "cpu"
    # An OpenAI audio API (``{url}/audio/transcriptions``, ``{url}/audio/speech``).
    asr_url: str | None = None
    asr_api_key: str | None = field(default=None, repr=False)
    # Piper: a voice's .onnx path; openai: the remote model's name.
    tts_model: str | None = None
    # Which installed voice speaks for a voice a client names that the TTS lacks (an OpenAI
    # custom voice id above all): (id, voice) pairs (``hark.engines.tts.voice_map``).
    voice_map: tuple[tuple[str, str], ...] = ()
    tts_url: str | None = None
    tts_api_key: str | None = field(default=None, repr=False)
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    log_level: str = "info"
    config_file: Path | None = None
    # WebRTC: the one UDP port all calls share (0: any free port) and the address put in
    # the ICE candidates (None: the bound host).
    rtc_port: int = 8443
    rtc_advertise_ip: str | None = None
    # Server processes sharing the listening port (each with its own engines and sessions).
    workers: int = 1
    # The rate the VAD model hears: 16000, or 8000 for about half its CPU per session.
    vad_rate: int = 16000
    # Which calls take the reply's echo out of the caller's audio before the VAD hears it
    # (``hark.transports.echo``): "sip" (phones, whose lines and speakerphones bring it back),
    # "on" (WebRTC calls too: a browser cancels its own echo, other peers may not; it costs a
    # call about as much CPU again while the reply plays) or "off". WebSocket sessions have
    # none (the client plays).
    echo_cancellation: Literal["on", "sip", "off"] = "sip"
    # An OTLP/HTTP collector that gets a trace per turn (None: no traces).
    otel_endpoint: str | None = None
    # The browser demo at / (it hands short-lived keys to whoever loads it). None: on only
    # for a loopback server without API keys.
    demo: bool | None = None
    # The fleet. ``redis_url``: the cluster store shared by every worker of every host (None:
    # an embedded store shared by the ``--workers`` of this machine, in ``run_dir``). Kept out
    # of repr: a Redis URL may carry a password.
    redis_url: str | None = field(default=None, repr=False)
    # Redis's password, for a URL that holds none (``HARK_REDIS_PASSWORD``, from a secret
    # store, needs no URL encoding).
    redis_password: str | None = field(default=None, repr=False)
    # How other workers reach this one over HTTP (None: http://<host>:<port>).
    advertise_url: str | None = None
    # TLS on the hop between workers (``hark.cluster.hop_tls``): this worker's certificate
    # chain and key and the fleet's CA (PEM files, all three or none). With them the worker
    # takes hops on a TLS listener on ``hop_port`` (0: any free port; the registry carries
    # it) and forwards only over TLS.
    hop_tls_cert: str | None = None
    hop_tls_key: str | None = None
    hop_tls_ca: str | None = None
    hop_port: int = 0
    # This worker's zone: placement prefers workers of the caller's worker's zone.
    zone: str = ""
    # On SIGTERM: how long running sessions may go on before they are ended.
    drain_timeout: float = 60.0
    # Where the embedded cluster store lives (None: a fresh private directory). The parent of
    # ``--workers`` sets it so that its workers share one store.
    run_dir: str | None = None
    # Per-key limits counted across the fleet (None: no limit): open sessions and calls,
    # API requests (sessions, calls, client secrets) and response tokens per minute.
    key_max_sessions: int | None = None
    key_requests_per_minute: int | None = None
    key_tokens_per_minute: int | None = None
    # Behind ``hark relay``: its public ``IP:PORT`` (put in the answers' candidates). The
    # fleet secret signs the routing hints and seals the records in Redis (needed with
    # ``redis_url``; the same on every worker and relay; kept out of repr).
    relay_address: str | None = None
    fleet_secret: str | None = field(default=None, repr=False)
    # SIP (phones): the user agent server, off with ``sip = false``. ``sip_host`` None: the
    # HTTP ``host``; ``sip_port`` serves UDP and TCP (0: any free port), ``sip_tls_port``
    # TLS with ``sip_tls_cert``/``sip_tls_key``; ``sip_advertise_ip`` goes in Contact and
    # SDP (None: the bound host). Each call has its own RTP port from ``rtp_ports`` (first,
    # last; None: any free port).
    sip: bool = True
    sip_host: str | None = None
    sip_port: int = 5060
    sip_advertise_ip: str | None = None
    sip_tls_port: int | None = None
    sip_tls_cert: str | None = None
    sip_tls_key: str | None = None
    # A CA bundle (PEM): TLS peers must present a certificate it signed (None: any peer).
    sip_tls_client_ca: str | None = None
    rtp_ports: tuple[int, int] | None = (10000, 20000)
    # Where ``realtime.call.incoming`` goes, signed with the secret (kept out of repr).
    # Without a URL every call is answered at once with ``sip_session`` (a JSON session
    # config; None: the server's default session).
    sip_webhook_url: str | None = field(default=None, repr=False)
    sip_webhook_secret: str | None = field(default=None, repr=False)
    # A call not accepted (or rejected) this many seconds after its INVITE is rejected.
    sip_accept_timeout: float = 30.0
    sip_session: str | None = None
    # SIP's T1 (RFC 3261 §17.1.1.1), the round-trip estimate all transaction timers scale
    # with; smaller only on a closed network.
    sip_t1_ms: float = 500.0
    # Who may call (``hark.transports.sip.trunk``): a list of tables (``[[sip_trunks]]`` in
    # the file) or that list in JSON; none: every caller, which the settings allow only on
    # a loopback SIP address or behind a webhook. Passwords: kept out of repr.
    sip_trunks: tuple[InboundTrunk, ...] = field(default=(), repr=False)
    # New INVITEs a second per source address (bursts of twice that); beyond: 503.
    sip_invite_rate: float = 10.0
    # Calls ringing or answered at once on this worker; beyond: 503.
    sip_max_calls: int = 500
    # Seconds without RTP from the caller after which an answered call is hung up.
    sip_rtp_timeout: float = 60.0
    # Seconds an engine stage may wait before that response or transcription fails as
    # stalled (``hark.engines.stage_timeouts``): the LLM's first token and each gap between
    # tokens, one clause of speech, one transcription.
    llm_first_token_timeout: float = 30.0
    llm_token_timeout: float = 15.0
    tts_clause_timeout: float = 30.0
    asr_timeout: float = 60.0
    # Where a client may point the server beyond the public internet (``hark.tools.egress``):
    # networks (CIDRs, addresses) and host names (``*.`` for a domain) an MCP ``server_url``
    # may reach though they are loopback, private or link-local; the networks also admit a
    # WebRTC offer's candidates there to the server's ICE checks.
    egress_allow: tuple[str, ...] = ()
    # A server without API keys answers only requests for a loopback ``Host`` from pages of
    # its own origin (or none); these open it to more Host names and page origins.
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    # Abuse limits of one worker: sessions and calls at once (WebSocket, WebRTC, SIP), open
    # HTTP connections, and how long a connection may sit idle, or take to send a request's
    # headers, before it is closed (seconds).
    max_sessions: int = 1000
    max_connections: int = 4096
    http_idle_timeout: float = 75.0
    # The stored prompts a session's ``prompt {id, version, variables}`` names
    # (``hark.protocol.prompts``): a directory read when the server starts (None: none).
    prompts: str | None = None

    @property
    def llm_model_name(self) -> str:
        """The LLM's name as clients see it (``/v1/models``)."""
        return self.llm_model or DEFAULT_EMBEDDED_LLM_MODEL


_DEFAULTS = Settings()
_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
# Lists of names: comma-separated in the environment and on the command line.
_LIST_OPTIONS = ("egress_allow", "allowed_hosts", "allowed_origins")
# The file cannot name another file, so config_file is not an option there.
_FILE_OPTIONS = frozenset(_FIELDS) - {"config_file"}


def load_settings(
    cli: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Merge the sources into validated settings.

    ``cli`` maps option names (``llm_url``) to values; ``None`` values mean "not given".
    ``env`` is the process environment (only ``HARK_*`` names are read); the configuration
    file is ``cli["config_file"]`` or ``$HARK_CONFIG``.
    """
    given = {k: v for k, v in (cli or {}).items() if v is not None}
    unknown = set(given) - set(_FIELDS)
    if unknown:
        raise ConfigError(f"unknown option(s): {', '.join(sorted(unknown))}")
    from_env = _from_env(env or {})

    config_file = given.get("config_file", from_env.get("config_file"))
    from_file = _from_file(Path(config_file)) if config_file is not None else {}

    merged: dict[str, Any] = {**from_file, **from_env, **given}
    if config_file is not None:
        merged["config_file"] = Path(config_file)
    return _validate(merged)


def env_var(option: str) -> str:
    """The environment variable of an option (``llm_url`` → ``HARK_LLM_URL``)."""
    return CONFIG_ENV_VAR if option == "config_file" else ENV_PREFIX + option.upper()


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in _FIELDS:
        raw = env.get(env_var(name))
        if raw is None or raw == "":
            continue
        if name in ("api_keys", "llm_url", *_LIST_OPTIONS):
            values[name] = tuple(k.strip() for k in raw.split(",") if k.strip())
        else:
            values[name] = raw
    return values


def _from_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - _FILE_OPTIONS
    if unknown:
        raise ConfigError(
            f"configuration file {path}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"known keys are {', '.join(sorted(_FILE_OPTIONS))}"
        )
    if "api_keys" in data:
        keys = data["api_keys"]
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ConfigError(f"configuration file {path}: api_keys must be a list of strings")
        data["api_keys"] = tuple(keys)
    return data


def _validate_port(values: dict[str, Any], name: str) -> None:
    port = values.get(name, getattr(_DEFAULTS, name))
    if isinstance(port, str):
        try:
            port = int(port)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, not {port!r}") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{name} must be an integer from 0 to 65535, not {port!r}")
    values[name] = port


def _validate(values: dict[str, Any]) -> Settings:
    _validate_port(values, "port")
    _validate_port(values, "rtc_port")
    _validate_port(values, "sip_port")

    for name in (
        "host",
        "engines",
        "llm_model",
        "llm_api_key",
        "llm_model_path",
        "vad",
        "asr",
        "llm",
        "tts",
        "asr_model",
        "asr_device",
        "asr_api_key",
        "tts_model",
        "tts_api_key",
        "log_level",
        "rtc_advertise_ip",
        "otel_endpoint",
        "redis_url",
        "redis_password",
        "advertise_url",
        "zone",
        "run_dir",
        "relay_address",
        "fleet_secret",
        "sip_host",
        "sip_advertise_ip",
        "sip_tls_cert",
        "sip_tls_key",
        "sip_webhook_url",
        "sip_webhook_secret",
        "sip_session",
        "prompts",
    ):
        if name in values and not isinstance(values[name], str):
            raise ConfigError(f"{name} must be a string")
    if values.get("rtc_advertise_ip") is not None:
        try:
            ipaddress.ip_address(values["rtc_advertise_ip"])
        except ValueError:
            raise ConfigError(
                f"rtc_advertise_ip must be an IP address, not {values['rtc_advertise_ip']!r}"
            ) from None

    if values.get("engines", _DEFAULTS.engines) not in ENGINE_SETS:
        raise ConfigError(f"engines must be one of {', '.join(ENGINE_SETS)}")
    values["log_level"] = str(values.get("log_level", _DEFAULTS.log_level)).lower()
    if values["log_level"] not in LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
    _validate_llm_url(values)
    if values.get("llm_url") and not values.get("llm_model"):
        raise ConfigError("llm_model is required with llm_url (the remote model's name)")
    for name in ("asr_url", "tts_url"):
        if values.get(name) is not None and not _is_http_url(values[name]):
            # Not echoed: the URL may carry credentials.
            raise ConfigError(f"{name} must be an http(s) URL")
    _validate_engine_names(values)
    _positive_number(values, "workers", int)
    _positive_number(values, "llm_context_tokens", int)
    for name in STAGE_TIMEOUT_OPTIONS:
        _positive_number(values, name, float)
    _validate_vad_rate(values)
    _validate_flag(values, "demo")
    _validate_echo(values)
    _validate_fleet(values)
    _validate_relay(values)
    _validate_sip(values)
    _validate_access_lists(values)
    _validate_prompts(values)
    _validate_voice_map(values)
    for name in ("max_sessions", "max_connections"):
        _positive_number(values, name, int)
    _positive_number(values, "http_idle_timeout", float)
    otel = values.get("otel_endpoint")
    if otel and urlsplit(otel).scheme not in ("http", "https"):
        raise ConfigError(f"otel_endpoint must be an http(s) URL, not {otel!r}")
    if any(not k for k in values.get("api_keys", ())):
        raise ConfigError("api_keys must not contain empty keys")
    return Settings(**values)


def _validate_engine_names(values: dict[str, Any]) -> None:
    """Each engine named must be in its kind's table; a URL goes with an engine that uses it."""
    from hark.engines.registry import ENGINE_TABLES, REMOTE_ENGINE

    for kind, table in ENGINE_TABLES.items():
        name = values.get(kind)
        if name is not None and name not in table:
            raise ConfigError(f"{kind} must be one of {', '.join(sorted(table))}, not {name!r}")
        url_option = f"{kind}_url"
        if url_option not in _FIELDS:
            continue
        has_url = bool(values.get(url_option))
        if name == REMOTE_ENGINE and not has_url:
            raise ConfigError(f"{kind} {REMOTE_ENGINE} needs {url_option} (the endpoint)")
        if name not in (None, REMOTE_ENGINE) and has_url:
            raise ConfigError(f"{url_option} is for the {REMOTE_ENGINE} {kind}, not {name!r}")


def _is_http_url(url: object) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0  # .port raises on a bad port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and port_ok


def _validate_llm_url(values: dict[str, Any]) -> None:
    """One URL or several (comma-separated, or a list in the file): a tuple of http(s) URLs."""
    urls = values.get("llm_url", ())
    if isinstance(urls, str):
        urls = tuple(u.strip() for u in urls.split(",") if u.strip())
    if not isinstance(urls, (tuple, list)) or not all(isinstance(u, str) for u in urls):
        raise ConfigError("llm_url must be a URL or a list of URLs")
    for number, url in enumerate(urls, 1):
        if not _is_http_url(url):
            # The URL may carry credentials: say which one, not what it says.
            raise ConfigError(f"llm_url must hold http(s) URLs; URL {number} is not one")
    if len(set(urls)) != len(urls):
        raise ConfigError("llm_url lists the same URL twice")
    values["llm_url"] = tuple(urls)


def _validate_vad_rate(values: dict[str, Any]) -> None:
    rate = values.get("vad_rate", _DEFAULTS.vad_rate)
    if isinstance(rate, str) and rate.strip().isdigit():
        rate = int(rate)
    if isinstance(rate, bool) or rate not in (16000, 8000):
        raise ConfigError(f"vad_rate must be 16000 or 8000, not {rate!r}")
    values["vad_rate"] = rate


_TRUE = ("1", "true", "yes", "on")
_ECHO_CHOICES = ("on", "sip", "off")
_FALSE = ("0", "false", "no", "off")


def _validate_echo(values: dict[str, Any]) -> None:
    value = values.get("echo_cancellation")
    if value is None:
        value = _DEFAULTS.echo_cancellation
    elif isinstance(value, bool):
        value = "on" if value else "off"
    elif isinstance(value, str) and value.strip().lower() in _ECHO_CHOICES:
        value = value.strip().lower()
    else:
        raise ConfigError(f"echo_cancellation must be one of on, sip or off, not {value!r}")
    values["echo_cancellation"] = value


def _validate_flag(values: dict[str, Any], name: str) -> None:
    value = values.get(name)
    if isinstance(value, str):
        if value.strip().lower() not in _TRUE + _FALSE:
            raise ConfigError(f"{name} must be true or false, not {value!r}")
        value = value.strip().lower() in _TRUE
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, not {value!r}")
    values[name] = value


def _positive_number(values: dict[str, Any], name: str, kind: type[int] | type[float]) -> None:
    value = values.get(name)
    if value is None:
        return
    if isinstance(value, str):
        try:
            value = kind(value)
        except ValueError:
            raise ConfigError(f"{name} must be a positive number, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, not {value!r}")
    if kind is int and value != int(value):
        raise ConfigError(f"{name} must be a whole number, not {value!r}")
    values[name] = kind(value)


def _validate_fleet(values: dict[str, Any]) -> None:
    redis_url = values.get("redis_url")
    if redis_url and urlsplit(redis_url).scheme not in REDIS_SCHEMES:
        # The URL may hold a password: name the option, not the value.
        raise ConfigError(
            "redis_url must be a redis://, rediss://, unix://, redis+sentinel:// or "
            "rediss+sentinel:// URL"
        )
    if values.get("redis_password"):
        if not redis_url:
            raise ConfigError("redis_password is the password of redis_url: set redis_url too")
        parts = urlsplit(redis_url)
        if parts.password or "password" in parse_qs(parts.query):
            raise ConfigError(
                "the Redis password is given twice, in redis_url and in redis_password "
                "(HARK_REDIS_PASSWORD): give it once"
            )
    if redis_url:
        # The whole URL (addresses, Sentinel's master, parameters) is read now, so that a
        # bad one stops the start with its reason and without its password; the files it
        # names are checked when the store is made, where they must be. Imported here: only
        # a fleet loads the cluster's modules.
        from hark.cluster.redis_url import parse_redis_url

        try:
            parse_redis_url(redis_url, check_files=False)
        except ValueError as exc:
            raise ConfigError(f"redis_url: {exc}") from None
    if redis_url and not values.get("fleet_secret"):
        # A record in Redis is believed only if it is signed with the fleet's secret: a
        # fleet without one would take whatever anyone who reaches Redis writes.
        raise ConfigError(
            "redis_url needs fleet_secret (HARK_FLEET_SECRET, the same on every worker and "
            "relay): the fleet's records in Redis are signed and encrypted with it"
        )
    advertise = values.get("advertise_url")
    if advertise:
        parts = urlsplit(advertise)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"advertise_url must be an http(s) URL, not {advertise!r}")
    _validate_port(values, "hop_port")
    hop_tls = ("hop_tls_cert", "hop_tls_key", "hop_tls_ca")
    for name in hop_tls:
        if values.get(name) is not None and not isinstance(values[name], str):
            raise ConfigError(f"{name} must be the path of a PEM file")
    given = [name for name in hop_tls if values.get(name)]
    if given and len(given) != len(hop_tls):
        raise ConfigError("hop_tls_cert, hop_tls_key and hop_tls_ca go together")
    _positive_number(values, "drain_timeout", float)
    for name in ("key_max_sessions", "key_requests_per_minute", "key_tokens_per_minute"):
        _positive_number(values, name, int)


def _validate_relay(values: dict[str, Any]) -> None:
    from hark.edge.route_hint import MIN_SECRET_BYTES

    relay, secret = values.get("relay_address"), values.get("fleet_secret")
    if secret is not None and len(secret.encode()) < MIN_SECRET_BYTES:
        # Never the secret itself in the message.
        raise ConfigError(f"fleet_secret must be at least {MIN_SECRET_BYTES} bytes long")
    if relay is None:
        return
    if secret is None:
        raise ConfigError("relay_address needs fleet_secret (the relay checks signed hints)")
    host, _, port = relay.rpartition(":")
    try:
        ipaddress.IPv4Address(host)
        valid = port.isdigit() and 0 < int(port) <= 65535
    except ValueError:
        valid = False
    if not valid:
        raise ConfigError(f"relay_address must be IPv4:PORT, not {relay!r}")


def _validate_sip(values: dict[str, Any]) -> None:
    from hark.server.webhooks import WebhookSecretError, secret_key

    _validate_flag(values, "sip")
    if values["sip"] is None:
        values["sip"] = _DEFAULTS.sip
    advertise = values.get("sip_advertise_ip")
    if advertise is not None:
        try:
            ipaddress.ip_address(advertise)
        except ValueError:
            raise ConfigError(
                f"sip_advertise_ip must be an IP address, not {advertise!r}"
            ) from None
    if values.get("sip_tls_port") is not None:
        _validate_port(values, "sip_tls_port")
        if not values.get("sip_tls_cert") or not values.get("sip_tls_key"):
            raise ConfigError("sip_tls_port needs sip_tls_cert and sip_tls_key")
    elif values.get("sip_tls_cert") or values.get("sip_tls_key"):
        raise ConfigError("sip_tls_cert and sip_tls_key go with sip_tls_port")
    client_ca = values.get("sip_tls_client_ca")
    if client_ca is not None and (not isinstance(client_ca, str) or not client_ca):
        raise ConfigError("sip_tls_client_ca must be the path of a PEM file")
    if client_ca is not None and values.get("sip_tls_port") is None:
        raise ConfigError("sip_tls_client_ca goes with sip_tls_port")
    _validate_rtp_ports(values)
    url, secret = values.get("sip_webhook_url"), values.get("sip_webhook_secret")
    if url is not None and not _is_http_url(url):
        # Not echoed: the URL may carry a token.
        raise ConfigError("sip_webhook_url must be an http(s) URL")
    if url is not None and not secret:
        raise ConfigError("sip_webhook_url needs sip_webhook_secret (webhooks are signed)")
    if secret is not None:
        try:
            secret_key(secret)
        except WebhookSecretError as exc:
            # The message names the option and the problem, never the secret.
            raise ConfigError(f"sip_webhook_secret: {exc}") from None
    _positive_number(values, "sip_accept_timeout", float)
    _positive_number(values, "sip_t1_ms", float)
    _positive_number(values, "sip_invite_rate", float)
    _positive_number(values, "sip_max_calls", int)
    _positive_number(values, "sip_rtp_timeout", float)
    _validate_sip_exposure(values)
    session = values.get("sip_session")
    if session is not None:
        try:
            parsed = json.loads(session)
        except ValueError:
            raise ConfigError("sip_session must be a JSON object (a session config)") from None
        if not isinstance(parsed, dict):
            raise ConfigError("sip_session must be a JSON object (a session config)")
        from hark.protocol.errors import ProtocolError
        from hark.protocol.session_config import parse_session_config

        try:
            parse_session_config(parsed)
        except ProtocolError as exc:
            raise ConfigError(f"sip_session: {exc.message}") from None


def _validate_prompts(values: dict[str, Any]) -> None:
    """The prompt store must load, and its tools and voices be ones a session takes."""
    directory = values.get("prompts")
    if directory is None:
        return
    from hark.protocol.prompts import PromptStore, PromptStoreError
    from hark.protocol.session_config import check_prompt_store

    try:
        check_prompt_store(PromptStore.load(directory))
    except PromptStoreError as exc:
        raise ConfigError(f"prompts: {exc}") from None


def _validate_voice_map(values: dict[str, Any]) -> None:
    """``ID=VOICE`` pairs (a string or, in the file, a table); the voices are checked against
    the TTS engine's when it is built."""
    raw = values.get("voice_map")
    if raw is None or isinstance(raw, tuple):
        return
    from hark.engines.tts.voice_map import VoiceMapError, parse_voice_map

    try:
        values["voice_map"] = parse_voice_map(raw)
    except VoiceMapError as exc:
        raise ConfigError(str(exc)) from None


def _validate_sip_exposure(values: dict[str, Any]) -> None:
    """Parse the trunks; refuse SIP off loopback that nothing stands in front of."""
    from hark.transports.sip.trunk import TrunkError, parse_trunks

    try:
        values["sip_trunks"] = parse_trunks(values.get("sip_trunks"))
    except TrunkError as exc:
        raise ConfigError(str(exc)) from None
    for trunk in values["sip_trunks"]:
        if not trunk.needs_certificate:
            continue
        if values.get("sip_tls_port") is None:
            raise ConfigError(
                f"sip trunk {trunk.name!r} asks for a TLS client certificate: it needs "
                "sip_tls_port (with sip_tls_cert and sip_tls_key)"
            )
        if not trunk.client_ca and not values.get("sip_tls_client_ca"):
            raise ConfigError(
                f"sip trunk {trunk.name!r}: tls_client_names and tls_client_fingerprints need "
                "a CA to verify the certificate first: tls_client_ca on the trunk (a "
                "self-signed certificate is its own CA) or sip_tls_client_ca"
            )
    host = values.get("host", _DEFAULTS.host)
    sip_host = values.get("sip_host") or host
    if not values["sip"] or is_loopback_host(sip_host) or values["sip_trunks"]:
        return
    if values.get("sip_webhook_url") or (not values.get("api_keys") and not is_loopback_host(host)):
        # A webhook decides every call; an HTTP API open beyond loopback is refused first.
        return
    # SIP has no API key: whoever reaches the port would talk to the LLM on our account.
    raise ConfigError(
        f"refusing SIP on {sip_host!r} with neither sip_trunks nor sip_webhook_url: anyone "
        "who can reach the port could call. Configure an inbound trunk (HARK_SIP_TRUNKS, "
        "or [[sip_trunks]] in the --config file), a webhook (--sip-webhook-url), "
        "--sip-host 127.0.0.1, or --no-sip."
    )


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` only ever reaches this machine (127.0.0.0/8, ::1, ``localhost``)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        # Any other host name may resolve to a public address.
        return False


def _validate_access_lists(values: dict[str, Any]) -> None:
    """The allow-lists: a list of strings (or one comma-separated string), each well formed."""
    from hark.tools.egress import EgressPolicy, EgressPolicyError

    for name in _LIST_OPTIONS:
        raw = values.get(name, ())
        if isinstance(raw, str):
            raw = tuple(item.strip() for item in raw.split(",") if item.strip())
        if not isinstance(raw, (tuple, list)) or not all(isinstance(i, str) for i in raw):
            raise ConfigError(f"{name} must be a list of strings")
        values[name] = tuple(raw)
    try:
        EgressPolicy.parse(values["egress_allow"])
    except EgressPolicyError as exc:
        raise ConfigError(f"egress_allow: {exc}") from None
    for origin in values["allowed_origins"]:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise ConfigError(
                f"allowed_origins holds origins such as https://app.example.com, not {origin!r}"
            )


def _validate_rtp_ports(values: dict[str, Any]) -> None:
    """``first-last`` (or a pair in the file); ``0`` for any free port."""
    ports = values.get("rtp_ports", _DEFAULTS.rtp_ports)
    if ports in (0, "0", None):
        values["rtp_ports"] = None
        return
    if isinstance(ports, str):
        low, dash, high = ports.partition("-")
        ports = (low.strip(), high.strip()) if dash else ()
    try:
        first, last = (int(p) for p in ports)
    except (TypeError, ValueError):
        raise ConfigError(
            f"rtp_ports must be FIRST-LAST (e.g. 10000-20000), not {ports!r}"
        ) from None
    if not 1024 <= first <= last <= 65535:
        raise ConfigError(f"rtp_ports must lie within 1024-65535, first <= last, not {ports!r}")
    values["rtp_ports"] = (first, last)

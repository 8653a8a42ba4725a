"""Server settings: command line, ``HARK_*`` environment variables, a TOML file, defaults.

Precedence, highest first: command line > environment > configuration file > defaults.
Every option has the same name everywhere: ``--llm-url`` on the command line, ``HARK_LLM_URL``
in the environment, ``llm_url`` in the file. Each option is declared once, in
``hark.config.options``: its default, its kind and its generic checks come from there; the
checks below that are written out tie several options together or parse a value's shape.
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

from hark.config.options import BY_NAME, DEFAULTS, OPTIONS

if TYPE_CHECKING:
    from hark.transports.sip.trunk import InboundTrunk

EngineSet = Literal["embedded", "fake"]

ENGINE_SETS: tuple[EngineSet, ...] = tuple(BY_NAME["engines"].choices)  # type: ignore[arg-type]
LOG_LEVELS: tuple[str, ...] = tuple(BY_NAME["log_level"].choices)  # type: ignore[arg-type]
DEFAULT_EMBEDDED_LLM_MODEL = "smollm2-135m"
# The shapes of ``redis_url`` (``hark.cluster.redis_url`` reads them whole).
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")


class ConfigError(ValueError):
    """The settings are invalid; the message says which option and why."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``hark serve`` needs to know. Secrets are left out of ``repr``."""

    host: str = DEFAULTS["host"]
    port: int = DEFAULTS["port"]
    engines: EngineSet = DEFAULTS["engines"]
    vad: str | None = DEFAULTS["vad"]
    asr: str | None = DEFAULTS["asr"]
    llm: str | None = DEFAULTS["llm"]
    tts: str | None = DEFAULTS["tts"]
    llm_url: tuple[str, ...] = DEFAULTS["llm_url"]
    llm_model: str | None = DEFAULTS["llm_model"]
    llm_api_key: str | None = field(default=DEFAULTS["llm_api_key"], repr=False)
    llm_model_path: str | None = DEFAULTS["llm_model_path"]
    llm_context_tokens: int | None = DEFAULTS["llm_context_tokens"]
    asr_model: str | None = DEFAULTS["asr_model"]
    asr_device: str = DEFAULTS["asr_device"]
    asr_url: str | None = DEFAULTS["asr_url"]
    asr_api_key: str | None = field(default=DEFAULTS["asr_api_key"], repr=False)
    tts_model: str | None = DEFAULTS["tts_model"]
    voice_map: tuple[tuple[str, str], ...] = DEFAULTS["voice_map"]
    tts_url: str | None = DEFAULTS["tts_url"]
    tts_api_key: str | None = field(default=DEFAULTS["tts_api_key"], repr=False)
    api_keys: tuple[str, ...] = field(default=DEFAULTS["api_keys"], repr=False)
    log_level: str = DEFAULTS["log_level"]
    config_file: Path | None = DEFAULTS["config_file"]
    rtc_port: int = DEFAULTS["rtc_port"]
    rtc_advertise_ip: str | None = DEFAULTS["rtc_advertise_ip"]
    workers: int = DEFAULTS["workers"]
    vad_rate: int = DEFAULTS["vad_rate"]
    echo_cancellation: Literal["on", "sip", "off"] = DEFAULTS["echo_cancellation"]
    otel_endpoint: str | None = DEFAULTS["otel_endpoint"]
    demo: bool | None = DEFAULTS["demo"]
    redis_url: str | None = field(default=DEFAULTS["redis_url"], repr=False)
    redis_password: str | None = field(default=DEFAULTS["redis_password"], repr=False)
    advertise_url: str | None = DEFAULTS["advertise_url"]
    hop_tls_cert: str | None = DEFAULTS["hop_tls_cert"]
    hop_tls_key: str | None = DEFAULTS["hop_tls_key"]
    hop_tls_ca: str | None = DEFAULTS["hop_tls_ca"]
    hop_port: int = DEFAULTS["hop_port"]
    zone: str = DEFAULTS["zone"]
    drain_timeout: float = DEFAULTS["drain_timeout"]
    run_dir: str | None = DEFAULTS["run_dir"]
    key_max_sessions: int | None = DEFAULTS["key_max_sessions"]
    key_requests_per_minute: int | None = DEFAULTS["key_requests_per_minute"]
    key_tokens_per_minute: int | None = DEFAULTS["key_tokens_per_minute"]
    relay_address: str | None = DEFAULTS["relay_address"]
    fleet_secret: str | None = field(default=DEFAULTS["fleet_secret"], repr=False)
    sip: bool = DEFAULTS["sip"]
    sip_host: str | None = DEFAULTS["sip_host"]
    sip_port: int = DEFAULTS["sip_port"]
    sip_advertise_ip: str | None = DEFAULTS["sip_advertise_ip"]
    sip_tls_port: int | None = DEFAULTS["sip_tls_port"]
    sip_tls_cert: str | None = DEFAULTS["sip_tls_cert"]
    sip_tls_key: str | None = DEFAULTS["sip_tls_key"]
    sip_tls_client_ca: str | None = DEFAULTS["sip_tls_client_ca"]
    rtp_ports: tuple[int, int] | None = DEFAULTS["rtp_ports"]
    sip_webhook_url: str | None = field(default=DEFAULTS["sip_webhook_url"], repr=False)
    sip_webhook_secret: str | None = field(default=DEFAULTS["sip_webhook_secret"], repr=False)
    sip_accept_timeout: float = DEFAULTS["sip_accept_timeout"]
    sip_session: str | None = DEFAULTS["sip_session"]
    sip_t1_ms: float = DEFAULTS["sip_t1_ms"]
    sip_trunks: tuple[InboundTrunk, ...] = field(default=DEFAULTS["sip_trunks"], repr=False)
    sip_invite_rate: float = DEFAULTS["sip_invite_rate"]
    sip_max_calls: int = DEFAULTS["sip_max_calls"]
    sip_rtp_timeout: float = DEFAULTS["sip_rtp_timeout"]
    twilio_auth_token: str | None = field(default=DEFAULTS["twilio_auth_token"], repr=False)
    twilio_url: str | None = DEFAULTS["twilio_url"]
    twilio_api_url: str = DEFAULTS["twilio_api_url"]
    llm_first_token_timeout: float = DEFAULTS["llm_first_token_timeout"]
    llm_token_timeout: float = DEFAULTS["llm_token_timeout"]
    tts_clause_timeout: float = DEFAULTS["tts_clause_timeout"]
    asr_timeout: float = DEFAULTS["asr_timeout"]
    egress_allow: tuple[str, ...] = DEFAULTS["egress_allow"]
    allowed_hosts: tuple[str, ...] = DEFAULTS["allowed_hosts"]
    allowed_origins: tuple[str, ...] = DEFAULTS["allowed_origins"]
    max_sessions: int = DEFAULTS["max_sessions"]
    max_connections: int = DEFAULTS["max_connections"]
    http_idle_timeout: float = DEFAULTS["http_idle_timeout"]
    prompts: str | None = DEFAULTS["prompts"]

    @property
    def llm_model_name(self) -> str:
        """The LLM's name as clients see it (``/v1/models``)."""
        return self.llm_model or DEFAULT_EMBEDDED_LLM_MODEL


_DEFAULTS = Settings()
_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
# Lists: comma-separated in the environment.
_ENV_LISTS = frozenset(option.name for option in OPTIONS if option.kind == "list")
# Lists of names and origins, checked as such.
_LIST_OPTIONS = tuple(option.name for option in OPTIONS if option.check == "names")
# The file cannot name another file, so config_file is not an option there.
_FILE_OPTIONS = frozenset(option.name for option in OPTIONS if option.in_file)


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
    return BY_NAME[option].env


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in _FIELDS:
        raw = env.get(env_var(name))
        if raw is None or raw == "":
            continue
        if name in _ENV_LISTS:
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
    # The generic checks each option declares; a port that may be unset is checked when set.
    for option in OPTIONS:
        name = option.name
        if option.check == "port" and (option.default is not None or values.get(name) is not None):
            _validate_port(values, name)
        elif option.check == "string" and name in values and not isinstance(values[name], str):
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
    for option in OPTIONS:
        if option.check == "positive":
            _positive_number(values, option.name, int if option.kind == "int" else float)
    _validate_vad_rate(values)
    _validate_flag(values, "demo")
    _validate_echo(values)
    _validate_fleet(values)
    _validate_relay(values)
    _validate_sip(values)
    _validate_access_lists(values)
    _validate_prompts(values)
    _validate_voice_map(values)
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
    hop_tls = ("hop_tls_cert", "hop_tls_key", "hop_tls_ca")
    for name in hop_tls:
        if values.get(name) is not None and not isinstance(values[name], str):
            raise ConfigError(f"{name} must be the path of a PEM file")
    given = [name for name in hop_tls if values.get(name)]
    if given and len(given) != len(hop_tls):
        raise ConfigError("hop_tls_cert, hop_tls_key and hop_tls_ca go together")


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
    from hark.protocol.webhook_signing import WebhookSecretError, secret_key

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
    _validate_sip_exposure(values)
    twilio_url = values.get("twilio_url")
    if twilio_url is not None and not str(twilio_url).startswith(("wss://", "ws://")):
        raise ConfigError("twilio_url must be a ws(s):// URL (the scheme and host of the stream)")
    if not str(values.get("twilio_api_url", "https://")).startswith(("https://", "http://")):
        raise ConfigError("twilio_api_url must be an http(s):// URL")
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

"""Settings: command line > environment > file > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from hark.config import ConfigError, Settings, load_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hark.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    settings = load_settings({}, env={})
    assert settings == Settings()
    assert (settings.host, settings.port, settings.engines) == ("127.0.0.1", 8000, "embedded")
    assert settings.llm_model_name == "smollm2-135m"
    assert settings.api_keys == ()


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        'host = "0.0.0.0"\nport = 9000\nengines = "fake"\nlog_level = "debug"\n'
        'api_keys = ["sk-file"]\n',
    )
    env = {"HARK_CONFIG": str(config), "HARK_PORT": "9001", "HARK_HOST": "127.0.0.2"}
    settings = load_settings({"host": "127.0.0.3", "port": None}, env=env)
    assert settings.host == "127.0.0.3"  # command line
    assert settings.port == 9001  # environment
    assert settings.engines == "fake"  # file
    assert settings.log_level == "debug"
    assert settings.api_keys == ("sk-file",)
    assert settings.config_file == config


def test_env_api_keys_are_comma_separated_and_win_over_the_file(tmp_path: Path) -> None:
    config = write(tmp_path, 'api_keys = ["sk-file"]\n')
    settings = load_settings({"config_file": str(config)}, env={"HARK_API_KEYS": " sk-a, sk-b ,,"})
    assert settings.api_keys == ("sk-a", "sk-b")


def test_remote_llm_needs_a_model_name() -> None:
    with pytest.raises(ConfigError, match="llm_model"):
        load_settings({"llm_url": "http://127.0.0.1:1/v1"}, env={})
    settings = load_settings(
        {"llm_url": "http://127.0.0.1:1/v1"},
        env={"HARK_LLM_MODEL": "qwen", "HARK_LLM_API_KEY": "x"},
    )
    assert settings.llm_model_name == "qwen"
    assert settings.llm_api_key == "x"


def test_secrets_are_not_in_repr() -> None:
    settings = load_settings({"llm_api_key": "sk-llm-secret"}, env={"HARK_API_KEYS": "sk-srv"})
    assert "sk-llm-secret" not in repr(settings)
    assert "sk-srv" not in repr(settings)


@pytest.mark.parametrize(
    ("cli", "env", "message"),
    [
        ({"port": 70000}, {}, "port"),
        ({}, {"HARK_PORT": "eighty"}, "port"),
        ({"engines": "gpu"}, {}, "engines"),
        ({}, {"HARK_LOG_LEVEL": "loud"}, "log_level"),
        ({"colour": "blue"}, {}, "unknown option"),
        ({"vad_rate": 24000}, {}, "vad_rate"),
        ({}, {"HARK_VAD_RATE": "fast"}, "vad_rate"),
        ({"workers": 0}, {}, "workers"),
        ({}, {"HARK_WORKERS": "many"}, "workers"),
        ({"workers": 1.5}, {}, "workers"),
    ],
)
def test_invalid_values(cli: dict[str, object], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(cli, env=env)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        load_settings({"config_file": str(write(tmp_path, 'api_key = "typo"\n'))}, env={})
    with pytest.raises(ConfigError, match="list of strings"):
        load_settings({"config_file": str(write(tmp_path, 'api_keys = "sk-one"\n'))}, env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings({"config_file": str(write(tmp_path, "port = \n"))}, env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings({"config_file": str(tmp_path / "missing.toml")}, env={})
    with pytest.raises(ConfigError, match="port"):
        load_settings({"config_file": str(write(tmp_path, 'port = "x"\n'))}, env={})


def test_workers_from_the_command_line_or_the_environment() -> None:
    assert load_settings({}, env={}).workers == 1
    assert load_settings({"workers": 4}, env={}).workers == 4
    assert load_settings({}, env={"HARK_WORKERS": "3"}).workers == 3


def test_vad_rate_from_the_command_line_or_the_environment() -> None:
    assert load_settings({}, env={}).vad_rate == 16000
    assert load_settings({"vad_rate": 8000}, env={}).vad_rate == 8000
    assert load_settings({}, env={"HARK_VAD_RATE": "8000"}).vad_rate == 8000


def test_llm_url_takes_several_endpoints_from_every_source(tmp_path: Path) -> None:
    a, b = "http://gpu-a:8001/v1", "https://gpu-b/v1"
    model = {"llm_model": "qwen"}
    assert load_settings({"llm_url": a, **model}, env={}).llm_url == (a,)
    assert load_settings({"llm_url": f"{a}, {b}", **model}, env={}).llm_url == (a, b)
    env = {"HARK_LLM_URL": f"{a},{b}", "HARK_LLM_MODEL": "qwen"}
    assert load_settings({}, env=env).llm_url == (a, b)
    config = write(tmp_path, f'llm_url = ["{a}", "{b}"]\nllm_model = "qwen"\n')
    assert load_settings({"config_file": str(config)}, env={}).llm_url == (a, b)
    config = write(tmp_path, f'llm_url = "{b}"\nllm_model = "qwen"\n')
    assert load_settings({"config_file": str(config)}, env={}).llm_url == (b,)


@pytest.mark.parametrize(
    "urls",
    [
        "ftp://gpu-a/v1",
        "http://gpu-a:8001/v1,gpu-b:8001",
        "http://gpu-a:eighty/v1",
        "http://gpu-a/v1,http://gpu-a/v1",
        ["http://gpu-a/v1", 8001],
    ],
)
def test_llm_url_refuses_what_is_not_a_list_of_http_urls(urls: object) -> None:
    with pytest.raises(ConfigError, match="llm_url"):
        load_settings({"llm_url": urls, "llm_model": "qwen"}, env={})


def test_a_bad_llm_url_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"llm_url": "ftp://user:sk-secret@gpu/v1", "llm_model": "q"}, env={})
    assert "sk-secret" not in str(refused.value)


def test_engines_by_name_from_every_source(tmp_path: Path) -> None:
    assert load_settings({}, env={}).tts is None  # the preset's
    assert load_settings({"tts": "fake"}, env={}).tts == "fake"
    assert load_settings({}, env={"HARK_ASR": "fake", "HARK_VAD": "silero"}).asr == "fake"
    config = write(tmp_path, 'llm = "fake"\ntts_model = "/voices/amy.onnx"\n')
    settings = load_settings({"config_file": str(config)}, env={})
    assert (settings.llm, settings.tts_model) == ("fake", "/voices/amy.onnx")


@pytest.mark.parametrize("kind", ["vad", "asr", "llm", "tts"])
def test_an_unknown_engine_is_refused_with_the_known_names(kind: str) -> None:
    with pytest.raises(ConfigError, match=rf"{kind} must be one of"):
        load_settings({kind: "no-such-engine"}, env={})
    with pytest.raises(ConfigError) as refused:
        load_settings({}, env={f"HARK_{kind.upper()}": "no-such-engine"})
    message = str(refused.value)
    assert "no-such-engine" in message
    assert ("silero" if kind == "vad" else "fake") in message


def test_remote_audio_engines_take_their_endpoints() -> None:
    settings = load_settings(
        {"asr": "openai", "asr_url": "http://gpu:8000/v1", "tts_url": "https://tts.example/v1"},
        env={"HARK_ASR_API_KEY": "sk-asr-secret", "HARK_TTS_API_KEY": "sk-tts-secret"},
    )
    assert (settings.asr_url, settings.tts_url) == ("http://gpu:8000/v1", "https://tts.example/v1")
    assert (settings.asr_api_key, settings.tts_api_key) == ("sk-asr-secret", "sk-tts-secret")
    assert "sk-asr-secret" not in repr(settings) and "sk-tts-secret" not in repr(settings)


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"asr": "openai"}, "asr openai needs asr_url"),
        ({"tts": "openai"}, "tts openai needs tts_url"),
        ({"llm": "openai"}, "llm openai needs llm_url"),
        ({"asr": "whisper", "asr_url": "http://gpu/v1"}, "asr_url is for the openai asr"),
        ({"tts": "fake", "tts_url": "http://gpu/v1"}, "tts_url is for the openai tts"),
        (
            {"llm": "llama_cpp", "llm_url": "http://gpu/v1", "llm_model": "q"},
            "llm_url is for the openai llm",
        ),
    ],
)
def test_a_remote_engine_and_its_url_go_together(cli: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(cli, env={})


@pytest.mark.parametrize("name", ["asr_url", "tts_url"])
def test_a_bad_audio_url_is_refused_and_not_echoed(name: str) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be an http") as refused:
        load_settings({name: "ftp://user:sk-secret@gpu/v1"}, env={})
    assert "sk-secret" not in str(refused.value)


def test_the_allow_lists_from_every_source(tmp_path: Path) -> None:
    config = write(tmp_path, 'egress_allow = ["10.0.0.0/8", "mcp.internal"]\n')
    assert load_settings({"config_file": str(config)}).egress_allow == (
        "10.0.0.0/8",
        "mcp.internal",
    )
    env = {"HARK_EGRESS_ALLOW": "127.0.0.2, *.svc.local", "HARK_ALLOWED_HOSTS": "voice.lan"}
    settings = load_settings({"allowed_origins": "http://app.lan:3000,https://x.example"}, env=env)
    assert settings.egress_allow == ("127.0.0.2", "*.svc.local")
    assert settings.allowed_hosts == ("voice.lan",)
    assert settings.allowed_origins == ("http://app.lan:3000", "https://x.example")
    assert Settings().egress_allow == Settings().allowed_hosts == Settings().allowed_origins == ()


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"egress_allow": "10.0.0.0/33"}, "egress_allow"),
        ({"egress_allow": "http://10.0.0.1/"}, "egress_allow"),
        ({"allowed_origins": "app.lan"}, "allowed_origins"),
        ({"allowed_origins": "https://app.lan/page"}, "allowed_origins"),
        ({"max_sessions": "0"}, "max_sessions"),
        ({"max_connections": "-1"}, "max_connections"),
        ({"http_idle_timeout": "soon"}, "http_idle_timeout"),
    ],
)
def test_bad_limits_and_allow_lists_are_refused(cli: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(cli, env={})


def test_the_abuse_limits_are_on_by_default() -> None:
    settings = load_settings({}, env={"HARK_MAX_SESSIONS": "10", "HARK_HTTP_IDLE_TIMEOUT": "5"})
    assert (settings.max_sessions, settings.http_idle_timeout) == (10, 5.0)
    defaults = Settings()
    assert (defaults.max_sessions, defaults.max_connections) == (1000, 4096)
    assert defaults.http_idle_timeout == 75.0

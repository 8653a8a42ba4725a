"""The SIP options: command line, environment and file, their defaults and their checks."""

from __future__ import annotations

from typing import Any

import pytest

from hark.cli import build_parser
from hark.config import ConfigError, load_settings
from hark.server.workers import worker_settings

SECRET = "whsec_c2VjcmV0LWtleS1ieXRlcy0wMTIzNDU2Nzg5"


def from_cli(*argv: str, env: dict[str, str] | None = None) -> Any:
    args = build_parser().parse_args(["serve", *argv])
    options = {k: v for k, v in vars(args).items() if k not in ("command", "handler")}
    return load_settings(options, env=env or {})


def test_sip_is_on_by_default_on_5060_with_a_port_range() -> None:
    settings = from_cli()
    assert settings.sip is True
    assert settings.sip_port == 5060 and settings.sip_host is None
    assert settings.rtp_ports == (10000, 20000)
    assert settings.sip_webhook_url is None and settings.sip_accept_timeout == 30.0
    assert settings.sip_t1_ms == 500.0


def test_the_options_are_read_from_the_command_line() -> None:
    settings = from_cli(
        "--no-sip",
        "--sip-port",
        "0",
        "--sip-host",
        "0.0.0.0",
        "--sip-advertise-ip",
        "203.0.113.7",
        "--rtp-ports",
        "12000-12099",
        "--sip-webhook-url",
        "https://backend.example.com/hook",
        "--sip-accept-timeout",
        "2.5",
        "--sip-t1-ms",
        "50",
        "--sip-session",
        '{"instructions": "Answer the phone."}',
        env={"HARK_SIP_WEBHOOK_SECRET": SECRET},
    )
    assert settings.sip is False and settings.sip_port == 0
    assert settings.sip_advertise_ip == "203.0.113.7" and settings.rtp_ports == (12000, 12099)
    assert settings.sip_webhook_secret == SECRET and settings.sip_accept_timeout == 2.5
    assert settings.sip_t1_ms == 50.0
    # Neither the secret nor the URL (which may hold a token) is in the settings' repr.
    assert SECRET not in repr(settings) and "backend.example.com" not in repr(settings)


def test_rtp_ports_zero_means_any_free_port() -> None:
    assert from_cli("--rtp-ports", "0").rtp_ports is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rtp_ports": "20000-10000"}, "rtp_ports"),
        ({"rtp_ports": "80-90"}, "rtp_ports"),
        ({"rtp_ports": "many"}, "rtp_ports"),
        ({"sip_port": 70000}, "sip_port"),
        ({"sip_advertise_ip": "phones.example.com"}, "sip_advertise_ip"),
        ({"sip_tls_port": 5061}, "sip_tls_cert"),
        ({"sip_tls_cert": "cert.pem"}, "sip_tls_port"),
        ({"sip_webhook_url": "https://backend.example.com/hook"}, "sip_webhook_secret"),
        ({"sip_webhook_url": "ftp://x/", "sip_webhook_secret": SECRET}, "sip_webhook_url"),
        ({"sip_accept_timeout": 0}, "sip_accept_timeout"),
        ({"sip_t1_ms": 0}, "sip_t1_ms"),
        ({"sip_session": "[]"}, "sip_session"),
        ({"sip_session": '{"audio": {"output": {"speed": 9}}}'}, "speed"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(options)


def test_a_bad_secret_is_refused_without_being_echoed() -> None:
    secret = "whsec_not-base64-but-private!"
    with pytest.raises(ConfigError) as refused:
        load_settings({"sip_webhook_secret": secret})
    assert "sip_webhook_secret" in str(refused.value)
    assert "private" not in str(refused.value)


def test_with_several_workers_only_the_first_answers_sip() -> None:
    settings = from_cli("--workers", "3", "--sip-port", "5070")
    assert [worker_settings(settings, i).sip for i in range(3)] == [True, False, False]
    assert worker_settings(from_cli("--no-sip"), 0).sip is False


TRUNK = '[{"name": "pbx", "addresses": ["203.0.113.0/24"], "username": "u", "password": "pw7"}]'


@pytest.mark.parametrize(
    "argv",
    [
        ("--sip-host", "0.0.0.0"),
        ("--sip-host", "192.0.2.10"),
        # SIP follows an HTTP address opened with keys.
        ("--host", "0.0.0.0"),
        ("--host", "::", "--sip-host", "::"),
    ],
)
def test_sip_beyond_loopback_with_nobody_to_decide_is_refused(argv: tuple[str, ...]) -> None:
    env = {"HARK_API_KEYS": "sk-test"}
    with pytest.raises(ConfigError, match=r"refusing SIP on .* sip_trunks nor sip_webhook_url"):
        from_cli(*argv, env=env)
    # A trunk, a webhook, loopback or no SIP at all: it starts.
    assert from_cli(*argv, env={**env, "HARK_SIP_TRUNKS": TRUNK}).sip_trunks
    hooked = {**env, "HARK_SIP_WEBHOOK_SECRET": SECRET}
    assert from_cli(*argv, "--sip-webhook-url", "https://b.example/hook", env=hooked).sip
    assert from_cli(*argv, "--no-sip", env=env).sip is False
    assert from_cli("--host", "0.0.0.0", "--sip-host", "127.0.0.1", env=env).sip


def test_the_serve_command_refuses_an_open_sip_port(capsys: pytest.CaptureFixture[str]) -> None:
    from hark.cli import main

    assert main(["serve", "--sip-host", "0.0.0.0", "--engines", "fake"]) == 2
    assert "refusing SIP on '0.0.0.0'" in capsys.readouterr().err


def test_trunks_come_from_the_file_environment_or_command_line(tmp_path: Any) -> None:
    config = tmp_path / "hark.toml"
    config.write_text(
        '[[sip_trunks]]\nname = "pbx"\naddresses = ["203.0.113.0/24"]\ntrusted = true\n'
        "[[sip_trunks]]\n"
        'name = "office"\nusername = "alice"\npassword = "hunter2"\nnumbers = ["+15550100"]\n'
    )
    settings = from_cli("--config", str(config))
    pbx, office = settings.sip_trunks
    assert (pbx.name, pbx.trusted, [str(n) for n in pbx.networks]) == (
        "pbx",
        True,
        ["203.0.113.0/24"],
    )
    assert (office.username, office.numbers, office.networks) == ("alice", {"+15550100"}, ())
    assert "hunter2" not in repr(settings)
    (trunk,) = from_cli(env={"HARK_SIP_TRUNKS": TRUNK}).sip_trunks
    assert trunk.name == "pbx" and trunk.password == "pw7"
    (trunk,) = from_cli("--sip-trunks", TRUNK).sip_trunks
    assert trunk.username == "u"
    settings = from_cli(
        "--sip-invite-rate", "2.5", "--sip-max-calls", "7", "--sip-rtp-timeout", "30"
    )
    assert (settings.sip_invite_rate, settings.sip_max_calls, settings.sip_rtp_timeout) == (
        2.5,
        7,
        30.0,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HARK_SIP_TRUNKS": '[{"name": "x"}]'}, "needs addresses or a username"),
        ({"HARK_SIP_TRUNKS": "[{"}, "JSON"),
        ({"HARK_SIP_INVITE_RATE": "0"}, "sip_invite_rate"),
        ({"HARK_SIP_MAX_CALLS": "1.5"}, "sip_max_calls"),
        ({"HARK_SIP_RTP_TIMEOUT": "-1"}, "sip_rtp_timeout"),
        ({"HARK_SIP_TLS_CLIENT_CA": "/etc/hark/ca.pem"}, "goes with sip_tls_port"),
    ],
)
def test_bad_trunks_and_limits_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_cli(env=env)

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

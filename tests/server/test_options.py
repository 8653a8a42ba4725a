"""Each option of ``hark serve`` is declared once (``hark.config.options``): the command
line, the environment, the file, the settings' defaults, the generic checks and
docs/configuration.md all come from that table."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from hark.cli import build_parser
from hark.config import ConfigError, Settings, env_var, load_settings
from hark.config.options import OPTIONS, Option, add_arguments, configuration_page
from hark.config.relay import RELAY_OPTIONS, relay_values

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_the_committed_page_is_what_the_declarations_generate() -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "hark.config", "docs"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    assert generated == configuration_page(RELAY_OPTIONS)
    assert PAGE.read_text() == generated, (
        "docs/configuration.md differs from the declarations: run "
        "`python -m hark.config docs > docs/configuration.md`"
    )


def test_the_page_names_every_option_its_variable_and_its_default() -> None:
    page = PAGE.read_text()
    for option in OPTIONS:
        rows = [line for line in page.splitlines() if line.startswith("| ")]
        row = next((line for line in rows if f"| `{option.env}`" in line), None)
        assert row is not None, option.name
        if option.cli:
            assert row.startswith(f"| `{option.flag}`"), row
        if option.in_file:
            assert f"`{option.name}`" in row
        if isinstance(option.default, int) and not isinstance(option.default, bool):
            assert f"`{option.default}`" in row, row


def test_the_settings_take_their_fields_and_defaults_from_the_declarations() -> None:
    fields = {field.name: field for field in dataclasses.fields(Settings)}
    assert set(fields) == {option.name for option in OPTIONS}
    for option in OPTIONS:
        assert fields[option.name].default == option.default, option.name
        # Secrets stay out of repr.
        assert fields[option.name].repr is not option.secret, option.name


def test_the_command_line_has_one_flag_per_declared_option_and_hides_nothing() -> None:
    args = build_parser().parse_args(["serve"])
    dests = set(vars(args)) - {"command", "handler"}
    assert dests == {option.name for option in OPTIONS if option.cli}
    # Nothing given: nothing that would hide the environment or the file.
    assert all(value is None for name, value in vars(args).items() if name in dests)
    assert "api_keys" not in dests  # keys are never arguments: others can read those


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS if o.check == "positive"], ids=lambda o: o.name
)
def test_each_positive_option_is_checked_from_each_source(option: Option) -> None:
    for source in ("cli", "env"):
        with pytest.raises(ConfigError, match=option.name):
            if source == "cli":
                parsed = serve_parser().parse_args([option.flag, "0"])
                load_settings(vars(parsed), env={})
            else:
                load_settings({}, env={env_var(option.name): "0"})


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.check == "port"], ids=lambda o: o.name)
def test_each_port_is_checked(option: Option) -> None:
    env = {env_var(option.name): "65536"}
    if option.name == "sip_tls_port":
        env |= {"HARK_SIP_TLS_CERT": "c.pem", "HARK_SIP_TLS_KEY": "k.pem"}
    with pytest.raises(ConfigError, match=f"{option.name} must be an integer from 0 to 65535"):
        load_settings({}, env=env)


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS if o.check == "string"], ids=lambda o: o.name
)
def test_each_string_option_refuses_another_type_in_the_file(
    option: Option, tmp_path: Path
) -> None:
    path = tmp_path / "hark.toml"
    path.write_text(f"{option.name} = 3\n")
    with pytest.raises(ConfigError, match=f"{option.name} must be a string"):
        load_settings({"config_file": str(path)}, env={})


def test_the_file_takes_every_declared_key_but_the_files_own(tmp_path: Path) -> None:
    path = tmp_path / "hark.toml"
    path.write_text('config_file = "other.toml"\n')
    with pytest.raises(ConfigError, match="unknown key") as refused:
        load_settings({"config_file": str(path)}, env={})
    known = {option.name for option in OPTIONS if option.in_file}
    assert f"known keys are {', '.join(sorted(known))}" in str(refused.value)


def test_a_list_is_comma_separated_in_the_environment() -> None:
    lists = [option.name for option in OPTIONS if option.kind == "list"]
    assert set(lists) >= {"api_keys", "llm_url", "egress_allow"}
    settings = load_settings(
        {}, env={"HARK_API_KEYS": "sk-a, sk-b", "HARK_ALLOWED_HOSTS": "a.example,b.example"}
    )
    assert settings.api_keys == ("sk-a", "sk-b")
    assert settings.allowed_hosts == ("a.example", "b.example")


# ---------------------------------------------------------------------------- hark relay

RELAY_SECRET = "fleet-secret-of-the-options-test-01"


def relay_options(*argv: str) -> dict[str, object]:
    args = build_parser().parse_args(["relay", *argv])
    return {k: v for k, v in vars(args).items() if k not in ("command", "handler")}


def test_the_relays_options_come_from_its_declarations() -> None:
    values = relay_values(
        relay_options("--workers", "3"),
        {"HARK_REDIS_URL": "redis://127.0.0.1:6379/0", "HARK_FLEET_SECRET": RELAY_SECRET},
    )
    declared = {option.name: option.default for option in RELAY_OPTIONS}
    assert values == {
        **{name: default for name, default in declared.items() if name != "redis_password"},
        "redis_url": "redis://127.0.0.1:6379/0",
        "fleet_secret": RELAY_SECRET,
        "workers": 3,
    }


def test_the_relays_command_line_wins_over_the_environment_it_reads() -> None:
    env = {
        "HARK_REDIS_URL": "redis://env:6379/0",
        "HARK_FLEET_SECRET": "x" * 40,
        "HARK_REDIS_PASSWORD": "pw",
        # Read by hark serve, not by the relay.
        "HARK_LOG_LEVEL": "debug",
        "HARK_WORKERS": "9",
    }
    options = relay_options("--redis-url", "redis://cli:6379/0", "--fleet-secret", RELAY_SECRET)
    values = relay_values(options, env)
    assert values["redis_url"] == "redis://:pw@cli:6379/0"
    assert values["fleet_secret"] == RELAY_SECRET
    assert (values["log_level"], values["workers"]) == ("info", 1)


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        ((), "needs --redis-url"),
        (("--redis-url", "redis://r:6379/0", "--fleet-secret", "short"), "at least 16 bytes"),
        (("--workers", "0"), "--workers must be at least 1"),
        (("--source-flow-rate", "0"), "--source-flow-rate must be positive"),
        (("--source-flow-burst", "-1"), "--source-flow-burst must be at least 1"),
    ],
)
def test_a_wrong_relay_option_is_named(argv: tuple[str, ...], complaint: str) -> None:
    env = {} if argv == () else {"HARK_REDIS_URL": "redis://r:6379/0"}
    env |= {"HARK_FLEET_SECRET": RELAY_SECRET} if "--fleet-secret" not in argv else {}
    with pytest.raises(ValueError, match=complaint) as caught:
        relay_values(relay_options(*argv), env)
    assert RELAY_SECRET not in str(caught.value)


def test_the_page_lists_the_relays_options() -> None:
    rows = PAGE.read_text().split("## `hark relay`")[1].splitlines()
    for option in RELAY_OPTIONS:
        flag = f"`{option.flag}`" if option.cli else "—"
        env = f"`{option.env}`" if option.in_env else "—"
        assert any(row.startswith(f"| {flag} | {env} |") for row in rows), option.name

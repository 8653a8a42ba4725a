"""``--echo-cancellation on|off`` (``HARK_ECHO_CANCELLATION``): on unless turned off, and
handed to the WebRTC calls and the SIP service."""

from __future__ import annotations

import pytest

from hark.config import ConfigError, load_settings


def test_echo_cancellation_is_on_unless_turned_off() -> None:
    assert load_settings({}, env={}).echo_cancellation is True
    assert load_settings({"echo_cancellation": "off"}, env={}).echo_cancellation is False
    assert load_settings({"echo_cancellation": "on"}, env={}).echo_cancellation is True
    env = {"HARK_ECHO_CANCELLATION": "off"}
    assert load_settings({}, env=env).echo_cancellation is False


def test_anything_else_is_refused() -> None:
    with pytest.raises(ConfigError, match="echo_cancellation"):
        load_settings({"echo_cancellation": "maybe"}, env={})


def test_the_server_cli_takes_the_option() -> None:
    import argparse

    from hark.server.cli import configure_parser

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert parser.parse_args(["--echo-cancellation", "off"]).echo_cancellation == "off"
    assert parser.parse_args([]).echo_cancellation is None

"""``--echo-cancellation on|sip|off`` (``HARK_ECHO_CANCELLATION``): phone calls only unless
set, and handed to the WebRTC calls and the SIP service."""

from __future__ import annotations

import pytest

from hark.config import ConfigError, load_settings
from hark.engines.registry import Engines
from hark.server.app import create_app
from hark.server.state import CALLS, SIP


def test_echo_cancellation_is_for_phone_calls_unless_set() -> None:
    assert load_settings({}, env={}).echo_cancellation == "sip"
    assert load_settings({"echo_cancellation": "off"}, env={}).echo_cancellation == "off"
    assert load_settings({"echo_cancellation": "ON"}, env={}).echo_cancellation == "on"
    # A TOML boolean means all calls or none.
    assert load_settings({"echo_cancellation": True}, env={}).echo_cancellation == "on"
    assert load_settings({"echo_cancellation": False}, env={}).echo_cancellation == "off"
    env = {"HARK_ECHO_CANCELLATION": "off"}
    assert load_settings({}, env=env).echo_cancellation == "off"


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


@pytest.mark.parametrize(
    ("setting", "webrtc", "sip"),
    [("sip", False, True), ("on", True, True), ("off", False, False)],
)
def test_the_calls_get_what_the_setting_says(
    fake_engines: Engines, setting: str, webrtc: bool, sip: bool
) -> None:
    settings = load_settings({"rtc_port": 0, "echo_cancellation": setting}, env={})
    app = create_app(settings, fake_engines)
    assert app[CALLS].echo_cancellation is webrtc
    assert app[SIP].media.echo_cancellation is sip

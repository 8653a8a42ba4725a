"""``hark serve`` behind a relay: the relay address and the fleet secret in the settings."""

from __future__ import annotations

import pytest

from hark.config import ConfigError, load_settings
from hark.edge.route_hint import HINT_LENGTH
from hark.transports.webrtc.udp_mux import UdpMux, behind_relay

SECRET = "fleet-secret-for-the-edge-tests-0123"


def test_the_relay_address_and_secret_come_from_options_or_the_environment() -> None:
    settings = load_settings(
        {"relay_address": "203.0.113.5:3478"}, env={"HARK_FLEET_SECRET": SECRET}
    )
    assert (settings.relay_address, settings.fleet_secret) == ("203.0.113.5:3478", SECRET)
    assert SECRET not in repr(settings)


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"relay_address": "203.0.113.5:3478"}, "needs fleet_secret"),
        ({"relay_address": "relay.example:3478", "fleet_secret": SECRET}, "IPv4:PORT"),
        ({"relay_address": "203.0.113.5:0", "fleet_secret": SECRET}, "IPv4:PORT"),
        ({"fleet_secret": "short"}, "at least"),
    ],
)
def test_bad_relay_settings_are_refused(options: dict[str, str], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint) as caught:
        load_settings(options, env={})
    assert SECRET not in str(caught.value)


def test_a_mux_behind_a_relay_signs_its_ufrags_and_advertises_the_relay() -> None:
    mux = UdpMux("127.0.0.1", 0)
    behind_relay(mux, "203.0.113.5:3478", SECRET, "wrk_0123456789ab")
    assert mux.relay == ("203.0.113.5", 3478)
    assert mux.signer is not None and mux.signer.worker_id == "wrk_0123456789ab"
    assert mux.hellos is not None
    assert len(mux.new_ufrag()) == HINT_LENGTH

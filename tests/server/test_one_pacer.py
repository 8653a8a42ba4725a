"""One pacer per worker: the server's ``CallHost`` builds it, and every call registry (WebRTC,
SIP, Twilio) sends its calls' reply audio on it, so a worker has one 20 ms timer."""

from __future__ import annotations

from hark.config import load_settings
from hark.engines.registry import Engines
from hark.server.app import create_app
from hark.server.state import CALL_HOST, CALL_REGISTRIES
from hark.transports.ticker import Pacer, PlayoutTicker


def test_every_call_transport_of_a_worker_is_paced_by_the_hosts_one_pacer(
    fake_engines: Engines,
) -> None:
    settings = load_settings({"rtc_port": 0, "twilio_auth_token": "twilio-secret"}, env={})
    app = create_app(settings, fake_engines)
    host = app[CALL_HOST]
    registries = {registry.name: registry for registry in app[CALL_REGISTRIES]}
    assert set(registries) == {"webrtc", "sip", "twilio"}
    for name, registry in registries.items():
        assert vars(registry)["host"] is host, name
        # No timer of its own: any pacer or ticker it holds is the host's.
        timers = [v for v in vars(registry).values() if isinstance(v, Pacer | PlayoutTicker)]
        assert all(timer is host.pacer for timer in timers), name
    # SIP keeps its calls' pacer with the rest of their media options.
    assert vars(registries["sip"])["media"].pacer is host.pacer
    # Nothing is paced before a call starts, and then the timer starts with it.
    assert len(host.pacer) == 0 and len(host.pacer.ticker) == 0

"""Ended phone calls are freed by reference counting, their sessions and audio with them.

A SIP call refers to its session, and the session plays its replies through the call's RTP
media; anything that ties them into a cycle keeps the session, conversation audio included,
until the cycle collector runs, which hark's GC tuning makes rare. With the collector off,
calls that ended must be gone all the same. SIPp places real calls that speak and hang up.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from hark.config import Settings
from hark.driver.runner import SessionRunner
from hark.engines.registry import build_engines
from hark.session.core import Session
from hark.transports.sip.phone_call import PhoneCall
from tests.server.conftest import serving
from tests.transports.conftest import until

from .conftest import free_sip_port, run_sipp


def alive() -> tuple[int, int, int]:
    """Phone calls, session runners and session cores that still exist, reachable or not."""
    kinds = [type(obj) for obj in gc.get_objects()]
    return kinds.count(PhoneCall), kinds.count(SessionRunner), kinds.count(Session)


@pytest.mark.usefixtures("no_cycle_collector")
async def test_ended_phone_calls_are_freed_without_the_cycle_collector(tmp_path: Path) -> None:
    port = free_sip_port()
    settings = Settings(
        engines="fake",
        sip_host="127.0.0.1",
        sip_port=port,
        sip_advertise_ip="127.0.0.1",
        rtp_ports=None,
    )
    async with serving() as start:
        await start(settings, build_engines(Settings(engines="fake")))
        before = alive()
        for call in range(2):
            workdir = tmp_path / str(call)
            workdir.mkdir()
            # The caller speaks a question, hears the reply begin, and hangs up.
            run = await run_sipp("uac_rtp", port, workdir)
            assert run.ok, run.describe()
        # The server's last references go as its calls' tasks finish.
        await until(lambda: alive() == before)

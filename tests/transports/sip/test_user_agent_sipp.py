"""SIPp's built-in ``uac`` scenario (INVITE, 100/180/200, ACK, pause, BYE) against the user
agent server alone, over UDP and TCP: a real, independent SIP implementation agrees with
the stack on every message of the call."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from hark.transports.sip.user_agent import IncomingCall, UserAgentServer
from tests.transports.sip.test_user_agent import ANSWER

pytestmark = pytest.mark.realtime

CALLS = 20


def _errors(directory: Path) -> str:
    """What SIPp traced as unexpected (``-trace_err``)."""
    return "".join(p.read_text() for p in directory.glob("*_errors.log"))


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_sipp_uac_calls_complete(transport: str, tmp_path: Path) -> None:
    sipp = shutil.which("sipp")
    assert sipp is not None, "SIPp is missing: install the sip-tester Debian package"
    ended: list[str] = []
    answered: list[IncomingCall] = []

    def on_invite(call: IncomingCall) -> None:
        call.on_ended = ended.append
        call.ringing()
        call.answer(ANSWER)
        answered.append(call)

    uas = UserAgentServer(on_invite=on_invite, host="127.0.0.1", port=0)
    await uas.start()
    try:
        process = await asyncio.create_subprocess_exec(
            sipp,
            "-sn",
            "uac",
            f"127.0.0.1:{uas.port}",
            "-i",
            "127.0.0.1",
            "-t",
            transport,
            "-m",
            str(CALLS),
            "-r",
            "20",
            "-l",
            "10",
            "-d",
            "200",
            "-nostdin",
            "-timeout",
            "60s",
            "-trace_err",
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await process.communicate()
        assert process.returncode == 0, output.decode(errors="replace")[-3000:] + _errors(tmp_path)
    finally:
        await uas.stop()
    assert len(answered) == CALLS
    assert ended == ["bye"] * CALLS
    assert all(call.acked.is_set() and call.state == "ended" for call in answered)

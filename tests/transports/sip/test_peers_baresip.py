"""baresip, a real softphone, dials hark: a spoken question from a WAV file as its microphone,
what it hears recorded (its sndfile module) and judged: audible reply audio on the fake
engines, and on the embedded models Whisper's hearing of the reply names the right answer.
"""

from __future__ import annotations

import asyncio
import json
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from hark.audio.resample import resample
from tests.e2e.conftest import transcribe, words
from tests.server.webhook_receiver import webhook_receiver
from tests.servers import HarkProcess
from tests.speech import RATE, spoken
from tests.transports.sip.conftest import (
    SECRET,
    SipServer,
    WebhookSipServer,
    free_sip_port,
    sip_serve,
    sip_server_args,
)
from tests.transports.sip.test_trunk_certificates import SBC, Authority
from tests.transports.sip.test_user_agent import _self_signed

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

PHONE_RATE = 8000
QUESTION = "What is the capital of France?"
AUDIBLE_RMS = 200.0


@dataclass
class Softphone:
    """A baresip configured in its own directory: one account (with a digest password, if
    given; over TLS with mandatory SDES-SRTP when given the server's CA, presenting
    ``certificate``, a PEM of a client certificate and its key, when given), PCMU/PCMA, a
    WAV file as the microphone, ALSA's null device as the speaker, and sndfile recording
    both directions."""

    home: Path
    password: str | None = None
    tls_ca: Path | None = None
    certificate: Path | None = None

    def configure(self, microphone: npt.NDArray[np.int16]) -> None:
        """Write the configuration, the account and the microphone's WAV (8 kHz)."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "recordings").mkdir(exist_ok=True)
        with wave.open(str(self.home / "microphone.wav"), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(PHONE_RATE)
            wav.writeframes(microphone.astype("<i2").tobytes())
        (self.home / "config").write_text(
            "\n".join(
                [
                    "poll_method epoll",
                    "sip_listen 127.0.0.1:0",
                    "sip_transports udp" + (",tls" if self.tls_ca else ""),
                    *([f"sip_cafile {self.tls_ca}", "module srtp.so"] if self.tls_ca else []),
                    *([f"sip_certificate {self.certificate}"] if self.certificate else []),
                    "audio_player alsa,null",
                    "audio_alert alsa,null",
                    f"audio_source aufile,{self.home / 'microphone.wav'}",
                    "audio_path /usr/share/baresip",
                    "module_path /usr/lib/baresip/modules",
                    "module g711.so",
                    "module aufile.so",
                    "module alsa.so",
                    "module sndfile.so",
                    "module_app account.so",
                    "module_app menu.so",
                    f"snd_path {self.home / 'recordings'}",
                    "",
                ]
            )
        )
        auth = f";auth_pass={self.password}" if self.password is not None else ""
        tls = ";transport=tls" if self.tls_ca else ""
        srtp = ";mediaenc=srtp-mand" if self.tls_ca else ""
        (self.home / "accounts").write_text(
            f"<sip:phone@127.0.0.1{tls}>{auth};regint=0;audio_codecs=PCMU,PCMA{srtp}\n"
        )

    async def call(self, uri: str, seconds: int) -> str:
        """Dial ``uri``, stay on the line ``seconds``, hang up; baresip's output."""
        process = await asyncio.create_subprocess_exec(
            "baresip",
            "-f",
            str(self.home),
            "-e",
            f"/dial {uri}",
            "-t",
            str(seconds),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(seconds + 30):
                output, _ = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        return output.decode(errors="replace")

    def heard(self) -> npt.NDArray[np.int16]:
        """What the phone's speaker got (sndfile's decoder-side dump), at 8 kHz."""
        (path,) = (self.home / "recordings").glob("dump-*-dec.wav")
        with wave.open(str(path), "rb") as wav:
            assert (wav.getnchannels(), wav.getframerate()) == (1, PHONE_RATE)
            return np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.int16)


def question(text: str, silence_after_s: float) -> npt.NDArray[np.int16]:
    """``text`` spoken at 8 kHz, with silence after it while the phone listens."""
    pcm = resample(np.asarray(spoken(text)), RATE, PHONE_RATE)
    return np.concatenate(
        [
            np.zeros(PHONE_RATE // 2, np.int16),
            pcm,
            np.zeros(int(PHONE_RATE * silence_after_s), np.int16),
        ]
    )


def audible_seconds(pcm: npt.NDArray[np.int16]) -> float:
    """How much of ``pcm`` is audible, in 20 ms frames."""
    frames = pcm[: len(pcm) // 160 * 160].reshape(-1, 160).astype(np.float64)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    return float(np.count_nonzero(rms > AUDIBLE_RMS)) * 0.02


async def test_a_softphone_hears_the_reply_on_the_fake_engines(
    sip_server: SipServer, tmp_path: Path
) -> None:
    phone = Softphone(tmp_path / "baresip")
    phone.configure(question(QUESTION, silence_after_s=10))
    output = await phone.call(f"sip:hark@127.0.0.1:{sip_server.sip_port}", seconds=9)
    assert "Call established" in output, output[-3000:]
    heard = phone.heard()
    # The question takes 2.5 s; the fake voice reads the fake answer at 0.4 s a word.
    assert audible_seconds(heard) >= 1.5, output[-3000:]
    assert audible_seconds(heard[: PHONE_RATE * 2]) == 0, "audio before the question was over"
    assert "terminated" in output
    assert sip_server.alive()


async def test_a_softphone_calls_through_its_trunk_with_its_password(tmp_path: Path) -> None:
    password = "correct-horse-battery-staple"
    trunk = {"name": "desk", "addresses": ["127.0.0.1/32"], "username": "phone"}
    env = {"HARK_SIP_TRUNKS": json.dumps([{**trunk, "password": password}])}
    with sip_serve(tmp_path / "hark.log", env=env) as server:
        uri = f"sip:hark@127.0.0.1:{server.sip_port}"
        stranger = Softphone(tmp_path / "stranger")
        stranger.configure(question(QUESTION, silence_after_s=3))
        output = await stranger.call(uri, seconds=3)
        assert "Call established" not in output, output[-3000:]
        phone = Softphone(tmp_path / "baresip", password=password)
        phone.configure(question(QUESTION, silence_after_s=10))
        output = await phone.call(uri, seconds=9)
        assert "Call established" in output, output[-3000:]
        assert audible_seconds(phone.heard()) >= 1.5, output[-3000:]
        assert server.alive()


async def test_a_softphone_over_tls_talks_srtp_and_hears_the_reply(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    cert, key = _self_signed(tmp_path / "server")
    tls_port = free_sip_port()
    tls = ("--sip-tls-port", str(tls_port), "--sip-tls-cert", str(cert), "--sip-tls-key", str(key))
    with sip_serve(tmp_path / "hark.log", *tls) as server:
        # srtp-mand: baresip offers RTP/SAVP with its key and hangs up on an answer without
        # SRTP, so an established call is an encrypted one.
        phone = Softphone(tmp_path / "baresip", tls_ca=cert)
        phone.configure(question(QUESTION, silence_after_s=10))
        output = await phone.call(f"sip:hark@127.0.0.1:{tls_port};transport=tls", seconds=9)
        assert "Call established" in output, output[-3000:]
        assert audible_seconds(phone.heard()) >= 1.5, output[-3000:]
        assert server.alive()


async def test_the_webhook_of_a_call_over_tls_tells_srtp(tmp_path: Path) -> None:
    """``sip_media_security`` is what the answer will select: baresip (srtp-mand) offers
    RTP/SAVP with its key over TLS, and the call accepted on the webhook is established."""
    (tmp_path / "server").mkdir()
    cert, key = _self_signed(tmp_path / "server")
    tls_port = free_sip_port()
    tls = ("--sip-tls-port", str(tls_port), "--sip-tls-cert", str(cert), "--sip-tls-key", str(key))
    with webhook_receiver() as receiver:
        hook = ("--sip-webhook-url", receiver.url)
        env = {"HARK_SIP_WEBHOOK_SECRET": SECRET}
        with sip_serve(tmp_path / "hark.log", *tls, *hook, env=env) as server:
            hooks = WebhookSipServer(server, receiver)
            phone = Softphone(tmp_path / "baresip", tls_ca=cert)
            phone.configure(question(QUESTION, silence_after_s=6))
            call = asyncio.create_task(
                phone.call(f"sip:hark@127.0.0.1:{tls_port};transport=tls", seconds=5)
            )
            event = await hooks.incoming_call()
            assert event.data.sip_media_security == "srtp"
            await server.sdk().realtime.calls.accept(event.data.call_id, type="realtime")
            output = await call
            assert "Call established" in output, output[-3000:]
            assert server.alive()


async def test_a_softphone_with_its_trunks_certificate_is_answered(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    cert, key = _self_signed(tmp_path / "server")
    ca = Authority.make(tmp_path, "carrier-ca")
    trunk = {"name": "carrier", "tls_client_ca": str(ca.path), "tls_client_names": [SBC]}
    tls_port = free_sip_port()
    tls = ("--sip-tls-port", str(tls_port), "--sip-tls-cert", str(cert), "--sip-tls-key", str(key))
    env = {"HARK_SIP_TRUNKS": json.dumps([trunk])}
    with sip_serve(tmp_path / "hark.log", *tls, env=env) as server:
        uri = f"sip:hark@127.0.0.1:{tls_port};transport=tls"
        stranger = Softphone(tmp_path / "stranger", tls_ca=cert)
        stranger.configure(question(QUESTION, silence_after_s=3))
        output = await stranger.call(uri, seconds=3)
        assert "Call established" not in output, output[-3000:]
        assert "without a client certificate" in server.log()
        phone = Softphone(
            tmp_path / "baresip", tls_ca=cert, certificate=ca.issue(tmp_path, dns=(SBC,))
        )
        phone.configure(question(QUESTION, silence_after_s=10))
        output = await phone.call(uri, seconds=9)
        assert "Call established" in output, output[-3000:]
        assert audible_seconds(phone.heard()) >= 1.5, output[-3000:]
        assert server.alive()


async def test_a_softphone_asks_a_spoken_question_and_hears_the_answer(tmp_path: Path) -> None:
    sip_port = free_sip_port()
    args = sip_server_args(sip_port, fake_engines=False)
    with HarkProcess(args, tmp_path / "hark.log") as process:
        server = SipServer(process, sip_port)
        phone = Softphone(tmp_path / "baresip")
        phone.configure(question(QUESTION, silence_after_s=40))
        output = await phone.call(f"sip:hark@127.0.0.1:{server.sip_port}", seconds=30)
        assert "Call established" in output, output[-3000:]
        assert server.alive()
    heard = phone.heard()
    assert audible_seconds(heard) >= 1.0, output[-3000:]
    answer = await transcribe(heard, PHONE_RATE)
    assert "paris" in words(answer), answer

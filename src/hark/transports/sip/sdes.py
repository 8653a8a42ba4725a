"""SDES-SRTP (RFC 4568): the keys of a call's SRTP exchanged in its SDP, and the SRTP itself.

An offer on ``RTP/SAVP`` carries ``a=crypto:<tag> <suite> inline:<key>`` lines; the
answer picks the first whose suite we take (AES_CM_128_HMAC_SHA1_80, then _32) and
answers with the same tag, the same suite and a fresh key of ours. Each side encrypts
what it sends with its own key, so ``SrtpContext`` decrypts with the offerer's key and
encrypts with ours (libsrtp, through pylibsrtp, as the WebRTC side uses it).

The keys travel in the SDP in clear, so SDES is worth something only where the signalling
is encrypted: the SIP layer takes an SRTP offer only on a TLS connection (RFC 4568 §8.3).
Key lifetimes and MKIs are not taken (an offer that needs one is refused).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass, field

import pylibsrtp

# Master key and salt of the AES_CM_128 suites: 16 + 14 bytes (RFC 4568 §6.2).
KEY_BYTES = 30
SUITES: dict[str, int] = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}
SECURE_PROFILES = ("RTP/SAVP", "RTP/SAVPF")


class SdesError(ValueError):
    """A crypto attribute that cannot be used."""


@dataclass(frozen=True, slots=True)
class Crypto:
    """One ``a=crypto`` line: its tag, suite and master key (with salt). The key is kept
    out of ``repr``."""

    tag: int
    suite: str
    key: bytes = field(repr=False)

    @classmethod
    def parse(cls, value: str) -> Crypto:
        """``1 AES_CM_128_HMAC_SHA1_80 inline:<base64>`` → a ``Crypto``; ``SdesError`` when
        the suite is not ours or the key parameter is not one we take."""
        parts = value.split()
        if len(parts) < 3 or not parts[0].isdigit():
            raise SdesError("a malformed a=crypto line")
        suite = parts[1].upper()
        if suite not in SUITES:
            raise SdesError(f"crypto suite {suite} is not supported")
        if len(parts) > 3 or ";" in parts[2]:
            raise SdesError("several keys or session parameters are not supported")
        method, _, info = parts[2].partition(":")
        key_text, _, lifetime_mki = info.partition("|")
        if method.lower() != "inline" or lifetime_mki:
            raise SdesError("only inline keys without lifetime or MKI are supported")
        try:
            key = base64.b64decode(key_text + "=" * (-len(key_text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise SdesError("the crypto key is not base64") from None
        if len(key) != KEY_BYTES:
            raise SdesError(f"the crypto key must be {KEY_BYTES} bytes")
        return cls(int(parts[0]), suite, key)

    def attribute(self) -> str:
        """The ``a=crypto`` value for this line."""
        return f"{self.tag} {self.suite} inline:{base64.b64encode(self.key).decode()}"


def choose(values: list[str]) -> Crypto:
    """The first usable crypto line of an offer; ``SdesError`` when there is none."""
    problems = []
    for value in values:
        try:
            return Crypto.parse(value)
        except SdesError as exc:
            problems.append(str(exc))
    raise SdesError("; ".join(problems) or "an SRTP offer without a=crypto")


def our_crypto(theirs: Crypto) -> Crypto:
    """The answer's line to ``theirs``: its tag and suite, a fresh key of ours."""
    return Crypto(theirs.tag, theirs.suite, secrets.token_bytes(KEY_BYTES))


class SrtpContext:
    """Decrypts what the caller sends (its key) and encrypts what we send (ours)."""

    def __init__(self, theirs: Crypto, ours: Crypto) -> None:
        self._in = pylibsrtp.Session(
            pylibsrtp.Policy(
                key=theirs.key,
                ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND,
                srtp_profile=SUITES[theirs.suite],
            )
        )
        self._out = pylibsrtp.Session(
            pylibsrtp.Policy(
                key=ours.key,
                ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
                srtp_profile=SUITES[ours.suite],
            )
        )

    def protect(self, packet: bytes) -> bytes:
        """An RTP packet of ours, encrypted and authenticated."""
        return self._out.protect(packet)

    def protect_rtcp(self, packet: bytes) -> bytes:
        """An RTCP compound packet of ours, as SRTCP."""
        return self._out.protect_rtcp(packet)

    def unprotect(self, packet: bytes) -> bytes:
        """The caller's RTP in clear; ``pylibsrtp.Error`` when it does not authenticate."""
        return self._in.unprotect(packet)

    def unprotect_rtcp(self, packet: bytes) -> bytes:
        """The caller's SRTCP in clear; ``pylibsrtp.Error`` when it does not authenticate."""
        return self._in.unprotect_rtcp(packet)

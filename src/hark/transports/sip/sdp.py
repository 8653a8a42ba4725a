"""SDP offer/answer for one audio stream (RFC 4566, RFC 3264): G.711 and telephone-event.

``parse_offer`` reads what the answer depends on: the connection address, each media line,
the audio line's payload types with their ``rtpmap``/``fmtp``, ``ptime``, the direction
(media level over session level; ``c=0.0.0.0`` is the old way to say hold) and
``rtcp-mux``/``rtcp``. ``Answerer`` picks the codec, the offerer's first of PCMU and PCMA,
plus ``telephone-event`` at its clock rate, and writes the answer: the same media lines in
the same order, the others refused with port 0; a direction that mirrors the offer's; one
origin whose version moves on by one whenever a re-answer says something new (RFC 3264
section 8). An offer that cannot be answered raises ``SdpError`` with the reason, which
the SIP layer turns into 488 Not Acceptable Here.

RTCP shares the RTP port: the answer says ``a=rtcp-mux`` when offered, and otherwise
``a=rtcp:`` with the RTP port (RFC 3605), so one socket per call carries both.

SRTP: an offer on ``RTP/SAVP`` (or ``SAVPF``) must carry an ``a=crypto`` line we take
(``sdes.py``); the answer mirrors the profile and gives ours.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field
from typing import Literal

from hark.transports.sip.sdes import SECURE_PROFILES, Crypto, SdesError, choose

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
_DIRECTIONS: tuple[Direction, ...] = ("sendrecv", "sendonly", "recvonly", "inactive")
_MIRROR: dict[Direction, Direction] = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
_RTP_PROFILES = ("RTP/AVP", "RTP/AVPF", *SECURE_PROFILES)
# The static payload types (RFC 3551) an offer may use without an rtpmap.
_STATIC = {0: ("PCMU", 8000), 8: ("PCMA", 8000)}
SUPPORTED = ("PCMU", "PCMA")
TELEPHONE_EVENT = "telephone-event"
# The events we take (RFC 4733: 0-9, *, #, A-D, flash) when the offer names none.
_DEFAULT_EVENTS = "0-16"
_MAX_SDP = 64 * 1024
# Connection addresses that mean "send nothing here" (RFC 2543 hold, RFC 3264 section 8.4).
HOLD_ADDRESSES = ("0.0.0.0", "::")


class SdpError(ValueError):
    """An offer that cannot be answered; ``reason`` is what to tell the offerer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Codec:
    """A payload type as the offer maps it."""

    payload_type: int
    name: str
    clock_rate: int
    channels: int = 1
    fmtp: str | None = None

    @property
    def rtpmap(self) -> str:
        """The value of this codec's ``a=rtpmap``."""
        suffix = f"/{self.channels}" if self.channels != 1 else ""
        return f"{self.payload_type} {self.name}/{self.clock_rate}{suffix}"


@dataclass(frozen=True, slots=True)
class MediaLine:
    """One ``m=`` line: media, port, transport and formats as offered."""

    media: str
    port: int
    proto: str
    formats: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AudioOffer:
    """The audio stream an offer proposes, and the media lines the answer must mirror."""

    address: str
    port: int
    codecs: tuple[Codec, ...]
    direction: Direction
    ptime: int | None
    rtcp_mux: bool
    rtcp_port: int | None
    media: tuple[MediaLine, ...]
    audio_index: int
    # The a=crypto values of an SRTP (SAVP) offer; None for plain RTP.
    crypto: tuple[str, ...] | None = None

    @property
    def held(self) -> bool:
        """Whether the offerer stops listening: ``sendonly``/``inactive``, or ``c=0.0.0.0``."""
        return self.direction in ("sendonly", "inactive") or self.address in HOLD_ADDRESSES


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What both sides agreed on for the call's audio."""

    codec: Codec
    telephone_event: Codec | None
    direction: Direction
    remote: tuple[str, int]
    remote_rtcp: tuple[str, int]
    rtcp_mux: bool
    held: bool = False
    # The offerer's SRTP key (SDES); None for plain RTP.
    crypto: Crypto | None = None

    @property
    def sending(self) -> bool:
        """Whether we send audio (the answer's direction includes send, to a real address)."""
        return self.direction in ("sendrecv", "sendonly") and self.remote[0] not in HOLD_ADDRESSES

    @property
    def receiving(self) -> bool:
        """Whether the caller's audio is for the session: the answer's direction includes
        recv and the caller has not put the call on hold (music on hold is not speech)."""
        return self.direction in ("sendrecv", "recvonly") and not self.held


def _int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SdpError(f"bad {what}: {text!r}") from None
    if value < 0:
        raise SdpError(f"bad {what}: {text!r}")
    return value


def _address(value: str) -> str:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError(f"bad connection line: c={value}")
    host = parts[2].split("/")[0]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise SdpError(f"connection address is not an IP address: {host!r}") from None
    return host


@dataclass(slots=True)
class _Section:
    line: MediaLine | None
    connection: str | None = None
    attributes: list[tuple[str, str]] = field(default_factory=list)


def _sections(text: str) -> list[_Section]:
    if len(text) > _MAX_SDP:
        raise SdpError("SDP body too large")
    sections = [_Section(None)]
    version_seen = False
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if not line:
            continue
        if len(line) < 2 or line[1] != "=":
            raise SdpError(f"not an SDP line: {line[:40]!r}")
        kind, value = line[0], line[2:]
        if kind == "v":
            if value != "0":
                raise SdpError(f"SDP version {value!r}")
            version_seen = True
        elif kind == "m":
            parts = value.split()
            if len(parts) < 4:
                raise SdpError(f"bad media line: m={value}")
            port = _int(parts[1].split("/")[0], "media port")
            if port > 65535:
                raise SdpError(f"bad media port: {port}")
            sections.append(_Section(MediaLine(parts[0], port, parts[2], tuple(parts[3:]))))
        elif kind == "c":
            sections[-1].connection = _address(value)
        elif kind == "a":
            name, _, attr_value = value.partition(":")
            sections[-1].attributes.append((name.strip(), attr_value.strip()))
    if not version_seen:
        raise SdpError("no v= line")
    return sections


def _direction(attributes: list[tuple[str, str]]) -> Direction | None:
    for name, _ in attributes:
        for direction in _DIRECTIONS:
            if name == direction:
                return direction
    return None


def _codecs(line: MediaLine, attributes: list[tuple[str, str]]) -> tuple[Codec, ...]:
    maps: dict[int, tuple[str, int, int]] = {}
    fmtps: dict[int, str] = {}
    for name, value in attributes:
        if name not in ("rtpmap", "fmtp"):
            continue
        pt_text, _, rest = value.partition(" ")
        if not pt_text.isdigit():
            continue
        if name == "fmtp":
            fmtps[int(pt_text)] = rest.strip()
            continue
        encoding = rest.strip().split("/")
        if len(encoding) < 2 or not encoding[1].isdigit():
            raise SdpError(f"bad rtpmap: a=rtpmap:{value}")
        channels = int(encoding[2]) if len(encoding) > 2 and encoding[2].isdigit() else 1
        maps[int(pt_text)] = (encoding[0], int(encoding[1]), channels)
    codecs = []
    for fmt in line.formats:
        if not fmt.isdigit() or int(fmt) > 127:
            raise SdpError(f"bad payload type {fmt!r}")
        pt = int(fmt)
        if pt in maps:
            name, rate, channels = maps[pt]
        elif pt in _STATIC:
            (name, rate), channels = _STATIC[pt], 1
        else:
            continue
        codecs.append(Codec(pt, name, rate, channels, fmtps.get(pt)))
    return tuple(codecs)


def parse_offer(text: str) -> AudioOffer:
    """The first usable audio stream of an SDP offer; ``SdpError`` when there is none."""
    sections = _sections(text)
    session = sections[0]
    media = tuple(s.line for s in sections[1:] if s.line is not None)
    for index, section in enumerate(sections[1:]):
        line = section.line
        if line is None or line.media != "audio" or line.port == 0:
            continue
        if line.proto not in _RTP_PROFILES:
            raise SdpError(f"audio over {line.proto} is not supported (RTP/AVP or RTP/SAVP)")
        address = section.connection or session.connection
        if address is None:
            raise SdpError("no connection address for the audio stream")
        attributes = section.attributes
        direction = _direction(attributes) or _direction(session.attributes) or "sendrecv"
        ptime = next((v for n, v in attributes if n == "ptime"), None)
        rtcp = next((v for n, v in attributes if n == "rtcp"), None)
        return AudioOffer(
            address=address,
            port=line.port,
            codecs=_codecs(line, attributes),
            direction=direction,
            ptime=_int(ptime, "ptime") if ptime is not None else None,
            rtcp_mux=any(n == "rtcp-mux" for n, _ in attributes),
            rtcp_port=_int(rtcp.split()[0], "rtcp port") if rtcp else None,
            media=media,
            audio_index=index,
            crypto=tuple(v for n, v in attributes if n == "crypto")
            if line.proto in SECURE_PROFILES
            else None,
        )
    raise SdpError("no audio stream offered")


def negotiate(offer: AudioOffer) -> Negotiated:
    """The codec and events to use: the offerer's first of ``SUPPORTED``, and its
    telephone-event at that codec's clock rate."""
    codec = next(
        (c for c in offer.codecs if c.name.upper() in SUPPORTED and c.clock_rate == 8000),
        None,
    )
    if codec is None:
        offered = ", ".join(c.name for c in offer.codecs) or "none we know"
        raise SdpError(f"no common codec: we take PCMU or PCMA, the offer has {offered}")
    events = next(
        (
            c
            for c in offer.codecs
            if c.name.lower() == TELEPHONE_EVENT and c.clock_rate == codec.clock_rate
        ),
        None,
    )
    rtcp_port = offer.port if offer.rtcp_mux else offer.rtcp_port or offer.port + 1
    crypto = None
    if offer.crypto is not None:
        try:
            crypto = choose(list(offer.crypto))
        except SdesError as exc:
            raise SdpError(f"SRTP: {exc}") from None
    return Negotiated(
        codec=Codec(codec.payload_type, codec.name.upper(), codec.clock_rate),
        telephone_event=events,
        direction=_MIRROR[offer.direction],
        remote=(offer.address, offer.port),
        remote_rtcp=(offer.address, rtcp_port),
        rtcp_mux=offer.rtcp_mux,
        held=offer.held,
        crypto=crypto,
    )


def media_security(offer_sdp: str, *, secure: bool) -> str | None:
    """The media protection an answer to ``offer_sdp`` will select, as OpenAI's
    ``realtime.call.incoming`` webhook tells it (``sip_media_security``): ``srtp`` for an
    SDES key offered over encrypted signalling (``secure``), ``rtp`` for plain RTP, and None
    (unknown: the field is left out) when no answer can be made, a key offered over plain
    signalling among them (``RtpSession.negotiate`` refuses it)."""
    try:
        agreed = negotiate(parse_offer(offer_sdp))
    except SdpError:
        return None
    if agreed.crypto is None:
        return "rtp"
    return "srtp" if secure else None


class Answerer:
    """Writes the answers of one call, initial and re-INVITE, under one origin line."""

    def __init__(self, *, username: str = "hark", session_name: str = "hark") -> None:
        self._username = username
        self._session_name = session_name
        self._session_id = secrets.randbelow(1 << 62)
        self.version = self._session_id
        self._last: str | None = None

    def answer(
        self,
        offer: AudioOffer,
        agreed: Negotiated,
        *,
        address: str,
        port: int,
        crypto: Crypto | None = None,
    ) -> str:
        """The answer to ``offer`` with ``agreed``'s codec, our media at ``address:port``
        (and our SRTP key, ``crypto``, for an SRTP offer)."""
        family = "IP6" if ipaddress.ip_address(address).version == 6 else "IP4"
        lines = [f"s={self._session_name}", f"c=IN {family} {address}", "t=0 0"]
        for index, line in enumerate(offer.media):
            if index != offer.audio_index:
                lines.append(f"m={line.media} 0 {line.proto} {' '.join(line.formats)}")
                continue
            codecs = [agreed.codec] + ([agreed.telephone_event] if agreed.telephone_event else [])
            lines.append(
                f"m=audio {port} {line.proto} {' '.join(str(c.payload_type) for c in codecs)}"
            )
            lines.append(f"a=rtpmap:{agreed.codec.rtpmap}")
            if agreed.telephone_event is not None:
                lines.append(f"a=rtpmap:{agreed.telephone_event.rtpmap}")
                events = agreed.telephone_event.fmtp or _DEFAULT_EVENTS
                lines.append(f"a=fmtp:{agreed.telephone_event.payload_type} {events}")
            lines.append("a=ptime:20")
            lines.append("a=rtcp-mux" if agreed.rtcp_mux else f"a=rtcp:{port}")
            if crypto is not None:
                lines.append(f"a=crypto:{crypto.attribute()}")
            lines.append(f"a={agreed.direction}")
        body = "\r\n".join(lines) + "\r\n"
        if self._last is not None and body != self._last:
            self.version += 1
        self._last = body
        origin = f"o={self._username} {self._session_id} {self.version} IN {family} {address}"
        return f"v=0\r\n{origin}\r\n{body}"

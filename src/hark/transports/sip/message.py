"""SIP messages (RFC 3261 §7, §20, §25): parsing, serialising and building responses.

Parsing is strict about size (``MAX_MESSAGE_BYTES``, ``MAX_HEADERS``, ``MAX_LINE_BYTES``)
and about the start line and header syntax, and lenient about what a UAS can live without
(bare LF line ends, stray CRLFs before the start line). Header *values* are parsed on
demand by the typed accessors (``vias``, ``from_addr``, ``cseq`` …): a message whose start
line and headers are well formed but whose ``CSeq`` is not can still be answered 400, so the
user agent checks them with ``Request.validate`` rather than the parser refusing the message.
Every failure is a ``SipParseError`` and nothing else.

Headers keep the names and order they arrived with (a webhook shows them as the phone sent
them); look-ups are case-insensitive and know the compact forms (``v`` is ``Via``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_MESSAGE_BYTES = 65536
MAX_HEADERS = 128
MAX_LINE_BYTES = 8192
SIP_VERSION = "SIP/2.0"
# The magic cookie of RFC 3261 branches (§8.1.1.7): a branch without it is from RFC 2543.
BRANCH_COOKIE = "z9hG4bK"

COMPACT_FORMS = {
    "a": "Accept-Contact",
    "b": "Referred-By",
    "c": "Content-Type",
    "d": "Request-Disposition",
    "e": "Content-Encoding",
    "f": "From",
    "i": "Call-ID",
    "j": "Reject-Contact",
    "k": "Supported",
    "l": "Content-Length",
    "m": "Contact",
    "n": "Identity-Info",
    "o": "Event",
    "r": "Refer-To",
    "s": "Subject",
    "t": "To",
    "u": "Allow-Events",
    "v": "Via",
    "x": "Session-Expires",
    "y": "Identity",
}

# Headers whose values may be joined with commas into one line (RFC 3261 §7.3.1); the
# others (Date, the authentication headers …) carry commas inside a single value.
_LIST_HEADERS = frozenset(
    {
        "via",
        "route",
        "record-route",
        "contact",
        "allow",
        "supported",
        "require",
        "proxy-require",
        "unsupported",
        "accept",
        "accept-encoding",
        "accept-language",
        "allow-events",
        "content-encoding",
        "in-reply-to",
    }
)

REASON_PHRASES = {
    100: "Trying",
    180: "Ringing",
    181: "Call Is Being Forwarded",
    182: "Queued",
    183: "Session Progress",
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    415: "Unsupported Media Type",
    416: "Unsupported URI Scheme",
    420: "Bad Extension",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    491: "Request Pending",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Server Time-out",
    505: "Version Not Supported",
    600: "Busy Everywhere",
    603: "Decline",
}

_TOKEN = re.compile(r"^[A-Za-z0-9\-.!%*_+`'~]+$")
_STATUS_LINE = re.compile(r"^SIP/(\d+\.\d+) (\d{3}) (.*)$")
_REQUEST_LINE = re.compile(r"^([A-Za-z0-9\-.!%*_+`'~]+) (\S+) SIP/(\d+\.\d+)$")
_VIA_PROTOCOL = re.compile(r"^SIP\s*/\s*2\.0\s*/\s*([A-Za-z0-9\-.!%*_+`'~]+)\s+(.+)$", re.I)
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-.]+)(?::(\d{1,5}))?$")


class SipParseError(ValueError):
    """The bytes are not a SIP message this stack accepts (syntax, or over a limit)."""


def canonical_name(name: str) -> str:
    """The lower-case long form of a header name, for comparisons (``v`` → ``via``)."""
    long = COMPACT_FORMS.get(name.lower()) if len(name) == 1 else None
    return (long or name).lower()


def split_list(value: str) -> list[str]:
    """A comma-joined header value split into its elements.

    Commas inside quoted strings and inside ``<…>`` are part of the element; an empty value
    (``Supported:`` with nothing) has no elements.
    """
    if not value.strip():
        return []
    parts = [part.strip() for part in _split_outside_quotes(value, ",", brackets=True)]
    if any(not part for part in parts):
        raise SipParseError("empty element in a header list")
    return parts


def _split_params(text: str) -> dict[str, str | None]:
    """``;a=1;b`` → ``{"a": "1", "b": None}`` (names lower-cased, quotes kept in values)."""
    params: dict[str, str | None] = {}
    if not text.strip():
        return params
    if not text.lstrip().startswith(";"):
        raise SipParseError(f"expected ';' before parameters: {text[:40]!r}")
    for raw in _split_outside_quotes(text.lstrip()[1:], ";"):
        item = raw.strip()
        if not item:
            raise SipParseError("empty parameter")
        name, sep, val = item.partition("=")
        name = name.strip()
        if not _TOKEN.match(name):
            raise SipParseError(f"bad parameter name: {name[:40]!r}")
        params[name.lower()] = val.strip() if sep else None
    return params


def _split_outside_quotes(text: str, sep: str, *, brackets: bool = False) -> list[str]:
    """``text`` split at ``sep`` outside quoted strings (and outside ``<…>`` with
    ``brackets``: a URI in angle brackets may hold the separator)."""
    parts: list[str] = []
    start = 0
    quoted = False
    angle = False
    i = 0
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif brackets and ch == "<":
            angle = True
        elif brackets and ch == ">":
            angle = False
        elif ch == sep and not angle:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if quoted or angle:
        raise SipParseError("unbalanced quotes or brackets in a header value")
    parts.append(text[start:])
    return parts


def _format_params(params: dict[str, str | None]) -> str:
    return "".join(f";{k}" if v is None else f";{k}={v}" for k, v in params.items())


def parse_host_port(text: str) -> tuple[str, int | None]:
    """``host[:port]`` (an IPv6 host in brackets) → ``(host, port)``, brackets kept off."""
    match = _HOST.match(text.strip())
    if not match:
        raise SipParseError(f"bad host: {text[:60]!r}")
    host, port_text = match.group(1), match.group(2)
    port = None
    if port_text is not None:
        port = int(port_text)
        if not 0 < port < 65536:
            raise SipParseError(f"bad port: {port_text}")
    return host.strip("[]"), port


def format_host(host: str, port: int | None = None) -> str:
    """A host (IPv6 in brackets) with its port, if any."""
    text = f"[{host}]" if ":" in host else host
    return text if port is None else f"{text}:{port}"


@dataclass(slots=True)
class SipUri:
    """A ``sip:``/``sips:`` URI, or any other scheme kept whole in ``opaque``."""

    scheme: str
    user: str | None = None
    host: str = ""
    port: int | None = None
    params: dict[str, str | None] = field(default_factory=dict)
    headers: str = ""
    opaque: str = ""

    @classmethod
    def parse(cls, text: str) -> SipUri:
        """Parse a URI; sip/sips URIs are split into their parts."""
        scheme, colon, rest = text.strip().partition(":")
        if not colon or not scheme or not _TOKEN.match(scheme) or not rest:
            raise SipParseError(f"bad URI: {text[:60]!r}")
        scheme = scheme.lower()
        if scheme not in ("sip", "sips"):
            return cls(scheme=scheme, opaque=rest)
        rest, _, headers = rest.partition("?")
        user = None
        if "@" in rest:
            user, _, rest = rest.rpartition("@")
            if not user:
                raise SipParseError("empty user part")
        hostport, semi, params = rest.partition(";")
        host, port = parse_host_port(hostport)
        return cls(
            scheme=scheme,
            user=user,
            host=host,
            port=port,
            params=_split_params(semi + params),
            headers=headers,
        )

    @property
    def transport(self) -> str | None:
        """The ``transport`` parameter, lower-cased (``sips:`` means TLS)."""
        value = self.params.get("transport")
        if value is None:
            return "tls" if self.scheme == "sips" else None
        return value.lower()

    def __str__(self) -> str:
        if self.scheme not in ("sip", "sips"):
            return f"{self.scheme}:{self.opaque}"
        user = f"{self.user}@" if self.user is not None else ""
        headers = f"?{self.headers}" if self.headers else ""
        host = format_host(self.host, self.port)
        return f"{self.scheme}:{user}{host}{_format_params(self.params)}{headers}"


@dataclass(slots=True)
class NameAddr:
    """The value of From, To, Contact, Route, Record-Route, Refer-To …: a URI with a display
    name and header parameters (``tag``, ``expires`` …)."""

    uri: str
    display: str = ""
    params: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> NameAddr:
        """Parse ``"Name" <uri;uri-params>;params`` or the bare ``uri;params`` form."""
        value = text.strip()
        display = ""
        if value.startswith('"'):
            end = _closing_quote(value)
            display = value[: end + 1]
            value = value[end + 1 :].lstrip()
            if not value.startswith("<"):
                raise SipParseError("a quoted display name must be followed by <URI>")
        if "<" in value:
            before, _, after = value.partition("<")
            if before.strip():
                display = before.strip()
            uri, close, rest = after.partition(">")
            if not close:
                raise SipParseError("missing '>'")
        else:
            uri, semi, params = value.partition(";")
            rest = semi + params
        uri = uri.strip()
        if ":" not in uri or " " in uri:
            raise SipParseError(f"bad URI in address: {uri[:60]!r}")
        return cls(uri=uri, display=display, params=_split_params(rest))

    @property
    def tag(self) -> str | None:
        """The ``tag`` parameter (From/To)."""
        return self.params.get("tag")

    def sip_uri(self) -> SipUri:
        """The URI, parsed."""
        return SipUri.parse(self.uri)

    def __str__(self) -> str:
        display = f"{self.display} " if self.display else ""
        return f"{display}<{self.uri}>{_format_params(self.params)}"


def _closing_quote(value: str) -> int:
    i = 1
    while i < len(value):
        if value[i] == "\\":
            i += 2
            continue
        if value[i] == '"':
            return i
        i += 1
    raise SipParseError("unterminated quoted string")


@dataclass(slots=True)
class Via:
    """One Via value: ``SIP/2.0/UDP host:port;branch=…;rport;received=…``."""

    transport: str
    host: str
    port: int | None = None
    params: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Via:
        """Parse one Via value (an element of the comma-joined list)."""
        match = _VIA_PROTOCOL.match(text.strip())
        if not match:
            raise SipParseError(f"bad Via: {text[:60]!r}")
        sent_by, semi, params = match.group(2).partition(";")
        host, port = parse_host_port(sent_by)
        return cls(
            transport=match.group(1).upper(),
            host=host,
            port=port,
            params=_split_params(semi + params),
        )

    @property
    def branch(self) -> str | None:
        """The ``branch`` parameter."""
        return self.params.get("branch")

    def __str__(self) -> str:
        return f"SIP/2.0/{self.transport} {format_host(self.host, self.port)}" + _format_params(
            self.params
        )


@dataclass(slots=True, frozen=True)
class CSeq:
    """The CSeq header: a sequence number and a method."""

    number: int
    method: str

    @classmethod
    def parse(cls, text: str) -> CSeq:
        """Parse ``1 INVITE``; the number must fit 31 bits (RFC 3261 §8.1.1.5)."""
        parts = text.split()
        if len(parts) != 2 or not parts[0].isdigit() or not _TOKEN.match(parts[1]):
            raise SipParseError(f"bad CSeq: {text[:60]!r}")
        number = int(parts[0])
        if number >= 2**31:
            raise SipParseError("CSeq number too large")
        return cls(number, parts[1])

    def __str__(self) -> str:
        return f"{self.number} {self.method}"


@dataclass(slots=True)
class SipMessage:
    """What requests and responses share: headers in arrival order and a body."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def get(self, name: str) -> str | None:
        """The first value of a header (the whole line: a list header is not split)."""
        key = canonical_name(name)
        for header, value in self.headers:
            if canonical_name(header) == key:
                return value
        return None

    def get_all(self, name: str) -> list[str]:
        """Every value of a header, in order; list headers split at their commas."""
        key = canonical_name(name)
        values: list[str] = []
        for header, value in self.headers:
            if canonical_name(header) == key:
                if key in _LIST_HEADERS:
                    values.extend(split_list(value))
                else:
                    values.append(value)
        return values

    def set(self, name: str, value: str) -> None:
        """Replace every value of a header with one (where the first was, else at the end)."""
        key = canonical_name(name)
        kept: list[tuple[str, str]] = []
        placed = False
        for header, old in self.headers:
            if canonical_name(header) != key:
                kept.append((header, old))
            elif not placed:
                kept.append((name, value))
                placed = True
        if not placed:
            kept.append((name, value))
        self.headers = kept

    def add(self, name: str, value: str) -> None:
        """Append a header."""
        self.headers.append((name, value))

    def remove(self, name: str) -> None:
        """Drop every value of a header."""
        key = canonical_name(name)
        self.headers = [(h, v) for h, v in self.headers if canonical_name(h) != key]

    def replace_top_via(self, via: Via) -> None:
        """Put ``via`` in place of the top Via value (§18.2.1 stamps ``received``/``rport``)."""
        for index, (name, value) in enumerate(self.headers):
            if canonical_name(name) == "via":
                rest = split_list(value)[1:]
                self.headers[index] = (name, ", ".join([str(via), *rest]))
                return
        raise SipParseError("missing Via")

    def _required(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise SipParseError(f"missing {name}")
        return value

    @property
    def call_id(self) -> str:
        """The Call-ID."""
        value = self._required("Call-ID").strip()
        if not value or any(c.isspace() for c in value):
            raise SipParseError("bad Call-ID")
        return value

    @property
    def cseq(self) -> CSeq:
        """The CSeq, parsed."""
        return CSeq.parse(self._required("CSeq"))

    @property
    def vias(self) -> list[Via]:
        """The Via values, top first."""
        values = self.get_all("Via")
        if not values:
            raise SipParseError("missing Via")
        return [Via.parse(v) for v in values]

    @property
    def from_addr(self) -> NameAddr:
        """The From header, parsed."""
        return NameAddr.parse(self._required("From"))

    @property
    def to_addr(self) -> NameAddr:
        """The To header, parsed."""
        return NameAddr.parse(self._required("To"))

    @property
    def contact(self) -> NameAddr | None:
        """The first Contact, parsed (None when absent)."""
        values = self.get_all("Contact")
        return NameAddr.parse(values[0]) if values else None

    @property
    def content_type(self) -> str:
        """The Content-Type's media type, lower-cased, without parameters ("" when none)."""
        value = self.get("Content-Type") or ""
        return value.split(";", 1)[0].strip().lower()

    def _encode(self, start_line: str) -> bytes:
        # Content-Length is always the body's, written where it was (a round trip keeps
        # the order), or last.
        lines = [start_line]
        length = str(len(self.body))
        placed = False
        for name, value in self.headers:
            if canonical_name(name) != "content-length":
                lines.append(f"{name}: {value}")
            elif not placed:
                lines.append(f"{name}: {length}")
                placed = True
        if not placed:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


@dataclass(slots=True)
class Request(SipMessage):
    """A SIP request."""

    method: str = ""
    uri: str = ""
    version: str = "2.0"

    def validate(self) -> None:
        """Check what a UAS needs of a request (§8.2): raises ``SipParseError`` if unusable."""
        for name in ("From", "To", "Call-ID", "CSeq"):
            if len([h for h, _ in self.headers if canonical_name(h) == name.lower()]) > 1:
                raise SipParseError(f"more than one {name}")
        self.vias  # noqa: B018 - parsed for the check
        self.from_addr  # noqa: B018
        self.to_addr  # noqa: B018
        self.call_id  # noqa: B018
        cseq = self.cseq
        if cseq.method != self.method:
            raise SipParseError("CSeq method differs from the request's")
        SipUri.parse(self.uri)
        contact = self.get_all("Contact")
        if contact and contact != ["*"]:
            for value in contact:
                NameAddr.parse(value)

    def encode(self) -> bytes:
        """The request on the wire, with a Content-Length."""
        return self._encode(f"{self.method} {self.uri} SIP/{self.version}")


@dataclass(slots=True)
class Response(SipMessage):
    """A SIP response."""

    status: int = 200
    reason: str = "OK"
    version: str = "2.0"

    def encode(self) -> bytes:
        """The response on the wire, with a Content-Length."""
        return self._encode(f"SIP/{self.version} {self.status} {self.reason}")


def _split_head(data: bytes) -> tuple[bytes, bytes]:
    """Headers and body; the start line may be preceded by CRLFs (§7.5)."""
    data = data.lstrip(b"\r\n")
    for sep in (b"\r\n\r\n", b"\n\n"):
        index = data.find(sep)
        if index >= 0:
            return data[:index], data[index + len(sep) :]
    raise SipParseError("no end of headers")


def _header_lines(head: bytes) -> list[str]:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SipParseError("headers are not UTF-8") from exc
    lines = text.replace("\r\n", "\n").split("\n")
    if any(len(line) > MAX_LINE_BYTES for line in lines):
        raise SipParseError("line too long")
    if any("\r" in line or "\x00" in line for line in lines):
        raise SipParseError("stray CR or NUL in headers")
    return lines


def _parse_headers(lines: Iterable[str]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for line in lines:
        if line[:1] in (" ", "\t"):
            if not headers:
                raise SipParseError("continuation line before any header")
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}".strip())
            continue
        name, colon, value = line.partition(":")
        name = name.rstrip(" \t")
        if not colon or not _TOKEN.match(name):
            raise SipParseError(f"bad header line: {line[:60]!r}")
        headers.append((name, value.strip()))
        if len(headers) > MAX_HEADERS:
            raise SipParseError("too many headers")
    return headers


def _content_length(headers: list[tuple[str, str]]) -> int | None:
    values = [v for n, v in headers if canonical_name(n) == "content-length"]
    if not values:
        return None
    if len(set(values)) != 1 or not values[0].isdigit() or len(values[0]) > 6:
        raise SipParseError("bad Content-Length")
    return int(values[0])


def parse_message(data: bytes) -> Request | Response:
    """Parse one SIP message (a UDP datagram, or one framed by ``StreamFramer``).

    Without a Content-Length the body is the rest of the datagram; with one, a shorter
    body is an error and a longer one is cut to it (§18.3).
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError("message too large")
    head, body = _split_head(data)
    lines = _header_lines(head)
    start, header_lines = lines[0], lines[1:]
    headers = _parse_headers(header_lines)
    length = _content_length(headers)
    if length is not None:
        if length > len(body):
            raise SipParseError("body shorter than Content-Length")
        body = body[:length]
    status = _STATUS_LINE.match(start)
    if status:
        return Response(
            headers=headers,
            body=body,
            status=int(status.group(2)),
            reason=status.group(3),
            version=status.group(1),
        )
    request = _REQUEST_LINE.match(start)
    if not request:
        raise SipParseError(f"bad start line: {start[:60]!r}")
    return Request(
        headers=headers,
        body=body,
        method=request.group(1),
        uri=request.group(2),
        version=request.group(3),
    )


class StreamFramer:
    """Cuts a TCP/TLS byte stream into SIP messages by their Content-Length (§18.3).

    ``feed`` returns the complete messages' bytes; a stream that cannot be framed (no
    Content-Length, a message over the limit) raises ``SipParseError``, after which the
    connection must be closed: its framing is lost. A double CRLF between messages is a
    keep-alive ping (RFC 5626 §4.4.1), counted in ``pings`` for the transport to answer.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.pings = 0

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; the messages they complete."""
        self._buffer += data
        messages: list[bytes] = []
        while True:
            self._skip_keepalives()
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_MESSAGE_BYTES:
                    raise SipParseError("headers too long")
                return messages
            length = _framing_length(bytes(self._buffer[:end]))
            if length is None:
                raise SipParseError("Content-Length is required on a stream")
            total = end + 4 + length
            if total > MAX_MESSAGE_BYTES:
                raise SipParseError("message too large")
            if len(self._buffer) < total:
                return messages
            messages.append(bytes(self._buffer[:total]))
            del self._buffer[:total]

    def _skip_keepalives(self) -> None:
        while self._buffer[:2] == b"\r\n":
            if self._buffer[:4] == b"\r\n\r\n":
                self.pings += 1
                del self._buffer[:4]
            elif len(self._buffer) >= 4:
                del self._buffer[:2]
            else:
                return


def _framing_length(head: bytes) -> int | None:
    """The Content-Length of a head, read leniently: a message with a bad header is still
    framed (and then answered 400), only a missing or bad length loses the stream."""
    values = []
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() in (b"content-length", b"l"):
            values.append(value.strip())
    if not values:
        return None
    if len(set(values)) != 1 or not values[0].isdigit() or len(values[0]) > 6:
        raise SipParseError("bad Content-Length")
    return int(values[0])


def build_response(
    request: Request,
    status: int,
    reason: str | None = None,
    *,
    to_tag: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
) -> Response:
    """A response to ``request`` (§8.2.6): Via, From, To, Call-ID and CSeq copied.

    ``to_tag`` is added to To when it has none (not on a 100, which never carries one, nor
    to a To that does not parse, copied as it is so that a 400 still goes back). Record-Route
    is copied into the responses of an INVITE that set up a dialog (§12.1.1).
    """
    copied: list[tuple[str, str]] = []
    dialog_forming = request.method == "INVITE" and 100 < status < 300
    seen_to = False
    for name, value in request.headers:
        key = canonical_name(name)
        if key in ("via", "from", "call-id", "cseq"):
            copied.append((name, value))
        elif key == "to" and not seen_to:
            seen_to = True
            copied.append((name, _tagged(value, to_tag, status)))
        elif (key == "record-route" and dialog_forming) or (key == "timestamp" and status == 100):
            copied.append((name, value))
    copied.extend(headers)
    return Response(
        headers=copied,
        body=body,
        status=status,
        reason=reason or REASON_PHRASES.get(status, "Unknown"),
    )


def _tagged(to: str, tag: str | None, status: int) -> str:
    """The To of a response: the request's, with ``tag`` added when it had none (§8.2.6.2).

    A To that does not parse is copied as it came, so that a 400 can still go back.
    """
    if tag is None or status == 100:
        return to
    try:
        addr = NameAddr.parse(to)
    except SipParseError:
        return to
    if addr.tag is not None:
        return to
    addr.params["tag"] = tag
    return str(addr)


def sipfrag_status(body: bytes) -> int | None:
    """The status code of a ``message/sipfrag`` status line (RFC 3420), e.g. a REFER's NOTIFY."""
    line = body.split(b"\n", 1)[0].strip()
    match = re.match(rb"^SIP/2\.0 (\d{3})(?: |$)", line)
    return int(match.group(1)) if match else None

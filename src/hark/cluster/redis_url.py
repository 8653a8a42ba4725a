"""Where the fleet's Redis is, as one URL, and what may be shown of it.

The shapes (``docs/fleet.md``, "Production Redis"):

- ``redis://[[user]:password@]host[:port][/db]``: one Redis;
- ``rediss://…``: the same over TLS (``?ssl_ca_certs=/path/ca.pem`` for a private CA;
  ``ssl_certfile``/``ssl_keyfile`` where Redis wants client certificates);
- ``unix://[[user]:password@]/path/redis.sock[?db=N]``: a local socket;
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/master[/db]``: the master
  that the Sentinels at those addresses (port 26379 unless given) name ``master``, found again
  after every failover; ``rediss+sentinel://…`` speaks TLS to the Sentinels and to Redis.
  The credentials before ``@`` are Redis's; Sentinels that want their own take
  ``?sentinel_username=…&sentinel_password=…``.

The password may also come apart from the URL (``HARK_REDIS_PASSWORD``): ``with_password``.
Nothing here imports redis-py, so the settings can check a URL without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote

SENTINEL_PORT = 26379
REDIS_PORT = 6379
SINGLE_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SCHEMES = SINGLE_SCHEMES + SENTINEL_SCHEMES

# What a URL's query may set, and how its text is read. Anything else is refused by name
# rather than handed to redis-py, which would fail on it only at the first connection.
_TRUE = ("1", "yes", "true", "on")
_FALSE = ("0", "no", "false", "off")


def _flag(value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{value!r} is not yes or no")


def _cert_reqs(value: str) -> str:
    if value not in ("none", "optional", "required"):
        raise ValueError(f"{value!r} is not none, optional or required")
    return value


_PARAMETERS: dict[str, Any] = {
    "db": int,
    "username": str,
    "password": str,
    "client_name": str,
    "health_check_interval": int,
    "max_connections": int,
    "socket_keepalive": _flag,
}
_TLS_PARAMETERS: dict[str, Any] = {
    "ssl_ca_certs": str,
    "ssl_ca_path": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": _cert_reqs,
    "ssl_check_hostname": _flag,
}
_SENTINEL_PARAMETERS: dict[str, Any] = {"sentinel_username": str, "sentinel_password": str}
# TLS parameters that name a file, checked when the URL is read.
_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_DIRECTORIES = ("ssl_ca_path",)


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed Redis URL.

    ``connection`` holds redis-py's connection arguments for Redis itself (``host`` and
    ``port`` only for a single Redis, ``path`` for a socket); ``sentinels`` and ``master``
    are set for the Sentinel shapes, with ``sentinel_connection`` the arguments for talking
    to the Sentinels. ``description`` is the URL without password or query, for logs;
    ``secrets`` the strings an error message must never show.
    """

    scheme: str
    description: str
    secrets: tuple[str, ...] = field(repr=False)
    connection: dict[str, Any] = field(repr=False)
    tls: bool = False
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    sentinel_connection: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def uses_sentinel(self) -> bool:
        """Whether the master is found through Sentinel."""
        return bool(self.sentinels)


def parse_redis_url(url: str, *, check_files: bool = True) -> RedisTarget:
    """Read ``url``; raises ``ValueError`` with a message that never holds its password.
    ``check_files``: whether the TLS files it names must exist here (the settings of a
    container, read elsewhere, name files of that container)."""
    scheme, separator, rest = url.partition("://")
    if not separator or scheme not in SCHEMES:
        raise ValueError(
            "a Redis URL starts with redis://, rediss://, unix://, redis+sentinel:// or "
            "rediss+sentinel://"
        )
    netloc, cut, tail = _split_netloc(rest)
    path, _, query = (cut + tail).partition("?")
    path = path.split("#", 1)[0]
    query = query.split("#", 1)[0]
    userinfo, at, hosts = netloc.rpartition("@")
    username, _, raw_password = userinfo.partition(":") if at else ("", "", "")
    secrets = _secrets(raw_password, query)
    description_user = f"{unquote(username)}@" if username else ""

    def fail(why: str) -> ValueError:
        return ValueError(f"bad Redis URL {scheme}://{description_user}{hosts}{path}: {why}")

    tls = scheme in ("rediss", "rediss+sentinel")
    sentinel = scheme in SENTINEL_SCHEMES
    connection = _query(query, tls=tls, sentinel=sentinel, fail=fail, check_files=check_files)
    # The Sentinels' own credentials, under the names redis-py gives them.
    sentinel_connection: dict[str, Any] = {
        name: connection.pop(f"sentinel_{name}")
        for name in ("username", "password")
        if f"sentinel_{name}" in connection
    }
    if username:
        connection["username"] = unquote(username)
    if raw_password:
        if "password" in connection:
            raise fail("the password is given twice (before @ and as ?password=)")
        connection["password"] = unquote(raw_password)

    if scheme == "unix":
        if hosts:
            raise fail("a unix:// URL names a socket's path, not a host")
        if not path:
            raise fail("no socket path")
        connection["path"] = unquote(path)
        return RedisTarget(scheme, f"unix://{path}", secrets, connection)

    if not sentinel:
        host, port, port_given = _address(hosts, REDIS_PORT, fail)
        _path_db(path.lstrip("/"), connection, fail)
        connection.update(host=host, port=port)
        shown = _show(host) + (f":{port}" if port_given else "")
        description = f"{scheme}://{description_user}{shown}{path}"
        return RedisTarget(scheme, description, secrets, connection, tls=tls)

    if not hosts:
        raise fail("no Sentinel address")
    sentinels = tuple(_address(item, SENTINEL_PORT, fail)[:2] for item in hosts.split(","))
    master, _, db = path.lstrip("/").partition("/")
    if not master:
        raise fail("no master name: redis+sentinel://host:26379,host2:26379/mymaster")
    _path_db(db, connection, fail)
    shown = ",".join(f"{_show(h)}:{p}" for h, p in sentinels)
    description = f"{scheme}://{description_user}{shown}/{unquote(master)}"
    if connection.get("db"):
        description += f"/{connection['db']}"
    if tls:
        sentinel_connection.update({k: v for k, v in connection.items() if k in _TLS_PARAMETERS})
        sentinel_connection["ssl"] = True
    return RedisTarget(
        scheme,
        description,
        secrets,
        connection,
        tls=tls,
        sentinels=sentinels,
        master=unquote(master),
        sentinel_connection=sentinel_connection,
    )


def with_password(url: str, password: str | None) -> str:
    """``url`` with ``password`` (given apart from it, as ``HARK_REDIS_PASSWORD``) put in as
    its credentials (after the user name, if the URL has one). ``ValueError`` when the URL
    holds a password already: which of the two is meant cannot be guessed."""
    if not password:
        return url
    scheme, separator, rest = url.partition("://")
    if not separator:
        raise ValueError("a Redis URL starts with redis://, rediss://, unix://, …")
    netloc, cut, tail = _split_netloc(rest)
    userinfo, at, hosts = netloc.rpartition("@")
    username, _, given = userinfo.partition(":") if at else ("", "", "")
    if given or "password" in parse_qs((cut + tail).partition("?")[2]):
        raise ValueError(
            "the Redis password is given twice: in the Redis URL and in redis_password "
            "(HARK_REDIS_PASSWORD); give it once"
        )
    return f"{scheme}://{username}:{quote(password, safe='')}@{hosts}{cut}{tail}"


def _split_netloc(rest: str) -> tuple[str, str, str]:
    """``host…`` / ``/path?query``: the network location, the character that ended it
    (``/``, ``?``, ``#`` or nothing) and what follows."""
    for i, char in enumerate(rest):
        if char in "/?#":
            return rest[:i], char, rest[i + 1 :]
    return rest, "", ""


def _secrets(raw_password: str, query: str) -> tuple[str, ...]:
    secrets = {raw_password, unquote(raw_password)} if raw_password else set()
    for name, values in parse_qs(query).items():
        if "pass" in name.lower():
            secrets.update(values)
    for piece in query.split("&"):
        name, _, value = piece.partition("=")
        if "pass" in name.lower() and value:
            secrets.add(value)
    # Longest first, so that no part of a longer secret is left after a shorter one is gone.
    return tuple(sorted((s for s in secrets if s), key=len, reverse=True))


def _query(
    query: str, *, tls: bool, sentinel: bool, fail: Any, check_files: bool
) -> dict[str, Any]:
    known = {**_PARAMETERS, **_TLS_PARAMETERS, **(_SENTINEL_PARAMETERS if sentinel else {})}
    values: dict[str, Any] = {}
    for name, texts in parse_qs(query, keep_blank_values=True).items():
        if name not in known:
            raise fail(f"unknown parameter {name!r} (known: {', '.join(sorted(known))})")
        if name in _TLS_PARAMETERS and not tls:
            raise fail(f"{name} is a TLS setting: use rediss:// (or rediss+sentinel://)")
        if len(texts) != 1:
            raise fail(f"{name} is given {len(texts)} times")
        try:
            values[name] = known[name](texts[0])
        except ValueError as exc:
            reason = "" if "pass" in name else f": {exc}"
            raise fail(f"bad {name}{reason}") from None
    if check_files:
        for name in _FILES:
            if name in values and not Path(values[name]).is_file():
                raise fail(f"{name}: no file {values[name]}")
        for name in _DIRECTORIES:
            if name in values and not Path(values[name]).is_dir():
                raise fail(f"{name}: no directory {values[name]}")
    return values


def _address(text: str, default_port: int, fail: Any) -> tuple[str, int, bool]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``: the host, the port, and whether
    the port was given."""
    if text.startswith("["):
        host, bracket, after = text[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise fail(f"bad address {text!r}")
        port_text = after[1:]
    elif text.count(":") > 1:
        raise fail(f"an IPv6 address goes in brackets: [{text}]")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise fail(f"no host in {text!r}")
    if not port_text:
        return host, default_port, False
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise fail(f"bad port in {text!r}")
    return host, int(port_text), True


def _path_db(text: str, connection: dict[str, Any], fail: Any) -> None:
    if not text:
        return
    if not text.isdigit():
        raise fail(f"the database is a number, not {text!r}")
    if "db" in connection and connection["db"] != int(text):
        raise fail("the database is given twice (in the path and as ?db=)")
    connection["db"] = int(text)


def _show(host: str) -> str:
    return f"[{host}]" if ":" in host else host

"""The gate in front of new calls, sans-I/O: inbound trunks, digest authentication (the
answers computed as a phone computes them, RFC 2617/7616) and the per-source INVITE rate."""

from __future__ import annotations

import hashlib

import pytest

from hark.transports.sip.admission import InviteAdmission
from hark.transports.sip.digest import DigestAuthenticator
from hark.transports.sip.message import Request, parse_message, split_list
from hark.transports.sip.trunk import TrunkError, parse_trunks

PBX = "203.0.113.9"
STRANGER = "198.51.100.66"
URI = "sip:+15550100@hark.example.com"


def invite(
    uri: str = URI,
    *,
    to: str | None = None,
    authorization: str | None = None,
    method: str = "INVITE",
) -> Request:
    lines = [
        f"{method} {uri} SIP/2.0",
        "Via: SIP/2.0/UDP 203.0.113.9:5060;branch=z9hG4bKabc",
        "From: <sip:pbx@203.0.113.9>;tag=1",
        f"To: <{to or uri}>",
        "Call-ID: c1",
        f"CSeq: 1 {method}",
        "Contact: <sip:pbx@203.0.113.9>",
        *([f"Authorization: {authorization}"] if authorization else []),
        "Content-Length: 0",
        "",
        "",
    ]
    message = parse_message("\r\n".join(lines).encode())
    assert isinstance(message, Request)
    return message


def challenge_params(header: str) -> dict[str, str]:
    scheme, _, rest = header.partition(" ")
    assert scheme == "Digest"
    params = {}
    for item in split_list(rest):
        name, _, value = item.partition("=")
        params[name.strip()] = value.strip().strip('"')
    return params


def answer(
    challenge: str,
    *,
    username: str,
    password: str,
    uri: str = URI,
    nc: str = "00000001",
    qop: bool = True,
    method: str = "INVITE",
) -> str:
    """The Authorization a phone sends for ``challenge`` (a WWW-Authenticate value) on a
    request of ``method``."""
    params = challenge_params(challenge)
    algorithm = params["algorithm"]

    def digest(text: str) -> str:
        name = "sha256" if algorithm == "SHA-256" else "md5"
        return hashlib.new(name, text.encode()).hexdigest()

    ha1 = digest(f"{username}:{params['realm']}:{password}")
    ha2 = digest(f"{method}:{uri}")
    cnonce = "0a4f113b"
    if qop:
        response = digest(f"{ha1}:{params['nonce']}:{nc}:{cnonce}:auth:{ha2}")
        extra = f', qop=auth, nc={nc}, cnonce="{cnonce}"'
    else:
        response = digest(f"{ha1}:{params['nonce']}:{ha2}")
        extra = ""
    return (
        f'Digest username="{username}", realm="{params["realm"]}", nonce="{params["nonce"]}", '
        f'uri="{uri}", response="{response}", algorithm={algorithm}{extra}'
    )


def gate(trunks: object, rate: float = 100.0, burst: float | None = None) -> InviteAdmission:
    return InviteAdmission(parse_trunks(trunks), rate=rate, burst=burst)


def test_without_trunks_every_caller_is_admitted_under_no_trunk() -> None:
    verdict = gate([]).check(invite(), STRANGER, 0.0)
    assert verdict.status is None and verdict.trunk is None


def test_a_source_no_trunk_covers_is_refused() -> None:
    admission = gate([{"name": "pbx", "addresses": ["203.0.113.0/24"]}])
    assert admission.check(invite(), STRANGER, 0.0).status == 403
    verdict = admission.check(invite(), PBX, 0.0)
    assert verdict.status is None and verdict.trunk is not None and verdict.trunk.name == "pbx"
    # The IPv4 address of a dual-stack socket is the same caller.
    assert admission.check(invite(), f"::ffff:{PBX}", 0.0).status is None


@pytest.mark.parametrize("algorithm", ["SHA-256", "MD5"])
def test_a_trunk_with_credentials_challenges_then_admits_the_right_answer(
    algorithm: str,
) -> None:
    admission = InviteAdmission(
        parse_trunks([{"name": "office", "username": "alice", "password": "s3cret"}]),
        digest=DigestAuthenticator(algorithms=("SHA-256", "MD5")),
    )
    challenged = admission.check(invite(), STRANGER, 10.0)
    assert challenged.status == 401
    offered = [value for name, value in challenged.headers if name == "WWW-Authenticate"]
    assert [challenge_params(v)["algorithm"] for v in offered] == ["SHA-256", "MD5"]
    chosen = next(v for v in offered if challenge_params(v)["algorithm"] == algorithm)
    assert challenge_params(chosen)["qop"] == "auth"
    good = answer(chosen, username="alice", password="s3cret")
    verdict = admission.check(invite(authorization=good), STRANGER, 11.0)
    assert verdict.status is None and verdict.trunk is not None
    assert verdict.trunk.name == "office"
    # The same answer again (same nonce, same count) is a replay.
    assert admission.check(invite(authorization=good), STRANGER, 12.0).status == 403
    # The next count on the same nonce is not.
    again = answer(chosen, username="alice", password="s3cret", nc="00000002")
    assert admission.check(invite(authorization=again), STRANGER, 12.0).status is None


def test_wrong_credentials_and_foreign_nonces_are_refused() -> None:
    admission = gate([{"name": "office", "username": "alice", "password": "s3cret"}])
    (challenge,) = [v for _, v in admission.check(invite(), STRANGER, 0.0).headers]
    # Only MD5 is offered by default (what phones in the field answer); SHA-256 is refused.
    assert challenge_params(challenge)["algorithm"] == "MD5"
    sha = answer(challenge.replace("MD5", "SHA-256"), username="alice", password="s3cret")
    assert admission.check(invite(authorization=sha), STRANGER, 1.0).status == 403
    wrong = answer(challenge, username="alice", password="guess")
    assert admission.check(invite(authorization=wrong), STRANGER, 1.0).status == 403
    unknown = answer(challenge, username="mallory", password="s3cret")
    assert admission.check(invite(authorization=unknown), STRANGER, 1.0).status == 403
    # A nonce issued to another address does not pass from this one.
    right = answer(challenge, username="alice", password="s3cret")
    assert admission.check(invite(authorization=right), PBX, 1.0).status == 403
    # Nor one another server issued (another secret).
    other = DigestAuthenticator().challenge(STRANGER, 0.0)[0][1]
    forged = answer(other, username="alice", password="s3cret")
    assert admission.check(invite(authorization=forged), STRANGER, 1.0).status == 403
    # Nor an answer computed for another Request-URI.
    moved = answer(challenge, username="alice", password="s3cret", uri="sip:other@x")
    assert admission.check(invite(authorization=moved), STRANGER, 1.0).status == 403


def test_a_stale_nonce_gets_a_fresh_challenge_marked_stale() -> None:
    digest = DigestAuthenticator(nonce_lifetime_s=30.0)
    admission = InviteAdmission(
        parse_trunks([{"username": "alice", "password": "s3cret"}]), rate=100.0, digest=digest
    )
    (challenge, *_) = [v for _, v in admission.check(invite(), STRANGER, 0.0).headers]
    late = answer(challenge, username="alice", password="s3cret", qop=False)
    stale = admission.check(invite(authorization=late), STRANGER, 31.0)
    assert stale.status == 401
    fresh = stale.headers[0][1]
    assert challenge_params(fresh)["stale"] == "true"
    retried = answer(fresh, username="alice", password="s3cret", qop=False)
    assert admission.check(invite(authorization=retried), STRANGER, 32.0).status is None


def test_the_numbers_of_a_trunk_are_checked_after_its_credentials() -> None:
    trunks = [
        {"name": "pbx", "addresses": [PBX], "numbers": ["+15550100"]},
        {"name": "remote", "username": "bob", "password": "pw", "numbers": ["+15550199"]},
    ]
    admission = gate(trunks)
    assert admission.check(invite(), PBX, 0.0).status is None
    # The address trunk may not call this number; the remote trunk must authenticate first
    # (a stranger learns nothing of which numbers exist).
    other = "sip:+15550199@hark.example.com"
    challenged = admission.check(invite(other), PBX, 0.0)
    assert challenged.status == 401
    good = answer(challenged.headers[0][1], username="bob", password="pw", uri=other)
    assert admission.check(invite(other, authorization=good), PBX, 1.0).status is None
    unknown = "sip:+15550000@h"
    challenged = admission.check(invite(unknown), STRANGER, 2.0)
    good = answer(challenged.headers[0][1], username="bob", password="pw", uri=unknown)
    assert admission.check(invite(unknown, authorization=good), STRANGER, 3.0).status == 403
    # The number may be in To when a proxy rewrote the Request-URI; tel: URIs count too.
    assert admission.check(invite("sip:hark@10.0.0.1", to=URI), PBX, 4.0).status is None
    assert admission.check(invite("tel:+15550100;phone-context=x"), PBX, 4.0).status is None


def test_invites_beyond_the_rate_of_one_source_get_503_with_retry_after() -> None:
    admission = gate([], rate=1.0, burst=3.0)
    verdicts = [admission.check(invite(), STRANGER, 0.0) for _ in range(5)]
    assert [v.status for v in verdicts] == [None, None, None, 503, 503]
    assert ("Retry-After", "1") in verdicts[3].headers
    # Another source has its own bucket; the first gets a token back each second.
    assert admission.check(invite(), PBX, 0.0).status is None
    assert admission.check(invite(), STRANGER, 1.0).status is None
    assert admission.check(invite(), STRANGER, 1.0).status == 503


def options(uri: str = URI, *, authorization: str | None = None) -> Request:
    return invite(uri, authorization=authorization, method="OPTIONS")


def test_options_from_a_source_no_trunk_covers_are_refused_and_numbers_not_asked() -> None:
    admission = gate([{"name": "pbx", "addresses": [PBX], "numbers": ["+15550199"]}])
    assert admission.check(options(), STRANGER, 0.0).status == 403
    # A trunk's keepalive dials no number: the trunk's address is enough.
    verdict = admission.check(options("sip:hark@hark.example.com"), PBX, 0.0)
    assert verdict.status is None and verdict.trunk is not None
    assert admission.check(invite("sip:hark@hark.example.com"), PBX, 0.0).status == 403


def test_options_are_challenged_as_an_invite_is() -> None:
    admission = gate([{"name": "office", "username": "alice", "password": "s3cret"}])
    challenged = admission.check(options(), STRANGER, 0.0)
    assert challenged.status == 401
    (challenge,) = [v for _, v in challenged.headers]
    # The answer covers the method: one computed for an INVITE does not pass.
    wrong_method = answer(challenge, username="alice", password="s3cret")
    assert admission.check(options(authorization=wrong_method), STRANGER, 1.0).status == 403
    good = answer(challenge, username="alice", password="s3cret", nc="2", method="OPTIONS")
    assert admission.check(options(authorization=good), STRANGER, 1.0).status is None


def test_options_and_invites_share_a_sources_rate() -> None:
    admission = gate([], rate=1.0, burst=2.0)
    assert admission.check(options(), STRANGER, 0.0).status is None
    assert admission.check(invite(), STRANGER, 0.0).status is None
    assert admission.check(options(), STRANGER, 0.0).status == 503
    assert admission.check(invite(), STRANGER, 0.0).status == 503


@pytest.mark.parametrize(
    ("trunks", "problem"),
    [
        ('[{"name": "open"}]', "needs addresses or a username"),
        ('[{"addresses": ["10.0.0.0/33"]}]', "not an address"),
        ('[{"username": "a"}]', "go together"),
        ('[{"addresses": ["10.0.0.1"], "passwd": "x"}]', "unknown key"),
        ('[{"addresses": ["10.0.0.1"], "trusted": "yes"}]', "trusted"),
        ('[{"name": "a", "addresses": ["10.0.0.1"]}, {"name": "a", "addresses": ["::1"]}]', "name"),
        ('{"addresses": ["10.0.0.1"]}', "list"),
        ("not json", "JSON"),
    ],
)
def test_invalid_trunks_are_refused_with_the_reason(trunks: str, problem: str) -> None:
    with pytest.raises(TrunkError, match=problem):
        parse_trunks(trunks)


def test_a_password_never_shows_in_a_trunks_repr_or_error() -> None:
    (trunk,) = parse_trunks('[{"name": "office", "username": "alice", "password": "hunter2"}]')
    assert "hunter2" not in repr(trunk)
    with pytest.raises(TrunkError) as caught:
        parse_trunks('[{"username": "alice", "password": "bad\\"pw"}]')
    assert "bad" not in str(caught.value)

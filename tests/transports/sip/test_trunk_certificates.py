"""A trunk that asks for the client certificate its calls arrive with over TLS: its options
(TOML, JSON, their errors), the gate's verdicts sans-I/O, and a real ``hark serve`` with
Python TLS peers holding certificates this test makes (two CAs of its own and a stranger's).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import secrets
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hark.config import ConfigError, load_settings
from hark.transports.sip.admission import InviteAdmission
from hark.transports.sip.client_certificate import ClientCertificate, _names
from hark.transports.sip.message import Request, Response, StreamFramer, parse_message
from hark.transports.sip.trunk import TrunkError, parse_trunks
from tests.transports.sip.conftest import free_sip_port, sip_serve
from tests.transports.sip.test_admission import PBX, invite
from tests.transports.sip.test_fuzz_sip import _SDP, request
from tests.transports.sip.test_user_agent import _self_signed

# Bounds a hang, never speed.
LIVENESS_S = 30.0
SBC = "sbc.carrier.example"


@dataclass
class Authority:
    """A CA of the test's own: its key, its certificate and the PEM file holding it."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path
    # The certificates between this CA and its root (an intermediate's own), which a peer
    # sends with its own.
    chain: bytes = b""

    @classmethod
    def make(cls, directory: Path, name: str, parent: Authority | None = None) -> Authority:
        """A new CA named ``name``, written to ``directory/name.pem``: a root, or an
        intermediate ``parent`` signs."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(parent.cert.subject if parent is not None else subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(parent.key if parent is not None else key, hashes.SHA256())
        )
        path = directory / f"{name}.pem"
        pem = cert.public_bytes(serialization.Encoding.PEM)
        path.write_bytes(pem)
        return cls(key, cert, path, pem + parent.chain if parent is not None else b"")

    def issue(self, directory: Path, *, dns: tuple[str, ...] = (), cn: str = "peer") -> Path:
        """A client certificate this CA signs, for ``dns`` names (and ``cn``), with its key
        in one PEM file (as baresip's ``sip_certificate`` takes it)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
        )
        if dns:
            names = [x509.DNSName(n) for n in dns]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        path = directory / f"{cn}-{secrets.token_hex(3)}.pem"
        path.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + self.chain
            + key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return path


def fingerprint(pem: Path) -> str:
    """The SHA-256 of a PEM file's (first) certificate, as OpenSSL prints it."""
    digest = x509.load_pem_x509_certificate(pem.read_bytes()).fingerprint(hashes.SHA256()).hex()
    digest = digest.upper()
    return ":".join(digest[i : i + 2] for i in range(0, 64, 2))


def certificate_of(authority: Authority, *names: str, fingerprint: str = "ab" * 32) -> Any:
    """What the transport reads of a peer whose chain ends at ``authority``."""
    anchor = hashlib.sha256(authority.cert.public_bytes(serialization.Encoding.DER)).digest()
    return ClientCertificate(fingerprint, frozenset(names), frozenset({b"leaf", anchor}))


# The options.


def test_a_trunk_names_its_ca_names_and_fingerprints(tmp_path: Path) -> None:
    ca = Authority.make(tmp_path, "carrier-ca")
    pinned = fingerprint(ca.issue(tmp_path, dns=(SBC,)))
    (trunk,) = parse_trunks(
        json.dumps(
            [
                {
                    "name": "carrier",
                    "addresses": ["203.0.113.0/24"],
                    "tls_client_ca": str(ca.path),
                    "tls_client_names": [SBC.upper(), "sbc2.carrier.example"],
                    "tls_client_fingerprints": [f"SHA256 Fingerprint={pinned}"],
                }
            ]
        )
    )
    assert trunk.needs_certificate and trunk.client_ca == str(ca.path)
    assert trunk.client_names == {SBC, "sbc2.carrier.example"}
    assert trunk.client_fingerprints == {pinned.replace(":", "").lower()}
    assert len(trunk.client_authorities) == 1
    # A certificate alone is enough to name a trunk's peers.
    (alone,) = parse_trunks([{"name": "sbc", "tls_client_ca": str(ca.path)}])
    assert alone.networks == () and alone.username is None and alone.needs_certificate
    (plain,) = parse_trunks([{"name": "pbx", "addresses": ["203.0.113.9"]}])
    assert not plain.needs_certificate and plain.accepts(None)


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ({"tls_client_ca": "/nonexistent/ca.pem"}, "tls_client_ca: cannot read"),
        ({"tls_client_ca": ""}, "tls_client_ca must be the path of a PEM file"),
        ({"tls_client_ca": "EMPTY"}, "holds no PEM certificate"),
        ({"tls_client_ca": "GARBAGE"}, "cannot be read"),
        ({"tls_client_fingerprints": ["AB:CD"]}, "is not a SHA-256 fingerprint"),
        ({"tls_client_fingerprints": "zz" * 32}, "is not a SHA-256 fingerprint"),
        ({"tls_client_names": [""]}, "tls_client_names must be a list of strings"),
        ({"tls_client_names": [7]}, "tls_client_names must be a list of strings"),
        ({"tls_client_subjects": ["x"]}, "unknown key"),
    ],
)
def test_bad_certificate_options_are_refused(
    tmp_path: Path, item: dict[str, Any], problem: str
) -> None:
    (tmp_path / "empty.pem").write_text("no certificate here\n")
    (tmp_path / "garbage.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    files = {"EMPTY": str(tmp_path / "empty.pem"), "GARBAGE": str(tmp_path / "garbage.pem")}
    if item.get("tls_client_ca") in files:
        item = {**item, "tls_client_ca": files[item["tls_client_ca"]]}
    with pytest.raises(TrunkError, match=problem):
        parse_trunks([{"name": "carrier", "addresses": ["203.0.113.9"], **item}])


def settings(env: dict[str, str], *, tls: bool = True, **values: Any) -> Any:
    options: dict[str, Any] = dict(values)
    if tls:
        options |= {"sip_tls_port": 5061, "sip_tls_cert": "c.pem", "sip_tls_key": "k.pem"}
    return load_settings(options, env=env)


def test_certificate_trunks_come_from_toml_and_json_and_need_a_tls_port(tmp_path: Path) -> None:
    ca = Authority.make(tmp_path, "carrier-ca")
    config = tmp_path / "hark.toml"
    config.write_text(
        "[[sip_trunks]]\n"
        f'name = "carrier"\naddresses = ["203.0.113.0/24"]\ntls_client_ca = "{ca.path}"\n'
        f'tls_client_names = ["{SBC}"]\n'
    )
    (trunk,) = settings({}, config_file=str(config)).sip_trunks
    assert trunk.client_names == {SBC} and trunk.client_ca == str(ca.path)
    env = {"HARK_SIP_TRUNKS": json.dumps([{"name": "sbc", "tls_client_ca": str(ca.path)}])}
    (trunk,) = settings(env).sip_trunks
    assert trunk.needs_certificate
    with pytest.raises(ConfigError, match="needs sip_tls_port"):
        settings(env, tls=False)
    # Names and fingerprints are checked on a certificate a CA verified first.
    env = {"HARK_SIP_TRUNKS": json.dumps([{"name": "sbc", "tls_client_names": [SBC]}])}
    with pytest.raises(ConfigError, match="need a CA to verify the certificate first"):
        settings(env)
    (trunk,) = settings(env, sip_tls_client_ca=str(ca.path)).sip_trunks
    assert trunk.client_names == {SBC} and trunk.client_ca is None


# The verdicts, sans-I/O.


def test_the_gate_admits_only_the_trunks_certificate(tmp_path: Path) -> None:
    ours, theirs = Authority.make(tmp_path, "ours"), Authority.make(tmp_path, "theirs")
    trunks = parse_trunks(
        [
            {
                "name": "carrier",
                "addresses": [PBX],
                "tls_client_ca": str(ours.path),
                "tls_client_names": [SBC],
            },
            {"name": "other", "addresses": ["192.0.2.1"], "tls_client_ca": str(theirs.path)},
        ]
    )
    gate = InviteAdmission(trunks)

    def status(certificate: ClientCertificate | None) -> int | None:
        return gate.check(invite(), PBX, 0.0, certificate).status

    assert status(certificate_of(ours, SBC)) is None
    assert gate.check(invite(), PBX, 0.0, certificate_of(ours, SBC)).trunk == trunks[0]
    # The trunk's address, but no certificate (UDP, TCP, or TLS without one), another CA's
    # or another name: refused as a stranger is.
    assert status(None) == 403
    assert status(certificate_of(theirs, SBC)) == 403
    assert status(certificate_of(ours, "sbc.elsewhere.example")) == 403
    # Where the certificate is right but the address is not the trunk's: refused too.
    assert gate.check(invite(), "192.0.2.77", 0.0, certificate_of(ours, SBC)).status == 403
    pinned = parse_trunks(
        [{"name": "pin", "tls_client_ca": str(ours.path), "tls_client_fingerprints": ["cd" * 32]}]
    )
    gate = InviteAdmission(pinned)
    assert (
        gate.check(invite(), PBX, 0.0, certificate_of(ours, fingerprint="cd" * 32)).status is None
    )
    assert gate.check(invite(), PBX, 0.0, certificate_of(ours, fingerprint="ab" * 32)).status == 403


def test_a_certificate_trunk_with_a_password_still_challenges(tmp_path: Path) -> None:
    ca = Authority.make(tmp_path, "ca")
    trunks = parse_trunks(
        [{"name": "sbc", "tls_client_ca": str(ca.path), "username": "sbc", "password": "pw"}]
    )
    gate = InviteAdmission(trunks)
    assert gate.check(invite(), PBX, 0.0, None).status == 403
    assert gate.check(invite(), PBX, 0.0, certificate_of(ca)).status == 401


def test_a_certificates_names_are_read_as_rfc_5922_reads_them() -> None:
    subject = ((("commonName", "CN.Example"),),)
    assert _names({"subject": subject}) == {"cn.example"}
    assert _names(
        {
            "subject": subject,
            "subjectAltName": (
                ("DNS", "SBC.Example"),
                ("URI", "sip:edge.example;transport=tls"),
                ("URI", "https://not.sip.example"),
                ("IP Address", "203.0.113.9"),
            ),
        }
    ) == {"sbc.example", "edge.example", "203.0.113.9"}
    # An IP address alone leaves the CN a name; OpenSSL writes IPv6 in full, a trunk
    # compressed: both are compared compressed.
    addresses = (("IP Address", "192.0.2.1"), ("IP Address", "2001:DB8:0:0:0:0:0:1\n"))
    assert _names({"subject": subject, "subjectAltName": addresses}) == {
        "cn.example",
        "192.0.2.1",
        "2001:db8::1",
    }
    (trunk,) = parse_trunks(
        [{"name": "v6", "addresses": ["::/0"], "tls_client_names": ["2001:DB8::1"]}]
    )
    assert trunk.client_names == {"2001:db8::1"}


# Real TLS peers against a real server.


async def call_over_tls(port: int, server_ca: Path, certificate: Path | None) -> int | None:
    """An INVITE over TLS with ``certificate`` (or none): its final status (after the 200,
    the ACK and a BYE), or None when the server ended the connection (the handshake)."""
    context = ssl.create_default_context(cafile=str(server_ca))
    if certificate is not None:
        context.load_cert_chain(certificate)
    branch = secrets.token_hex(4)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    except (ssl.SSLError, ConnectionError):
        return None
    framer = StreamFramer()
    pending: list[Response] = []

    async def final() -> Response | None:
        while True:
            while pending:
                response = pending.pop(0)
                if response.status >= 200:
                    return response
            data = await asyncio.wait_for(reader.read(65536), LIVENESS_S)
            if not data:
                return None
            for raw in framer.feed(data):
                message = parse_message(raw)
                if isinstance(message, Response):
                    pending.append(message)
                elif isinstance(message, Request) and message.method == "BYE":
                    return None

    try:
        local_port = writer.get_extra_info("sockname")[1]
        invite_text = request(
            "INVITE", local_port, branch=branch, call_id=branch, body=_SDP, transport="TLS"
        )
        writer.write(invite_text.encode())
        answer = await final()
        if answer is None:
            return None
        if answer.status == 200:
            to = answer.get("To") or ""
            tag = to.partition(";tag=")[2]
            for method, cseq in (("ACK", "1 ACK"), ("BYE", "2 BYE")):
                # The INVITE's dialog (its From tag, hark's To tag), a transaction of its own.
                message = (
                    request(method, local_port, branch=branch, call_id=branch, cseq=cseq)
                    .replace("SIP/2.0/UDP", "SIP/2.0/TLS")
                    .replace(f"z9hG4bK{branch};", f"z9hG4bK{branch}{method};")
                    .replace("To: <sip:hark@127.0.0.1>", f"To: <sip:hark@127.0.0.1>;tag={tag}")
                )
                writer.write(message.encode())
            bye = await final()
            assert bye is not None and bye.status == 200, bye
        return answer.status
    except (ssl.SSLError, ConnectionError):
        return None
    finally:
        writer.close()


@pytest.mark.realtime
async def test_only_a_call_with_the_trunks_certificate_rings_over_tls(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    server_cert, server_key = _self_signed(tmp_path / "server")
    ours, theirs = Authority.make(tmp_path, "ours"), Authority.make(tmp_path, "theirs")
    stranger_ca = Authority.make(tmp_path, "stranger")
    sbc = ours.issue(tmp_path, dns=(SBC,), cn="sbc")
    # Signed by an intermediate of the trunk's CA, which the peer sends along.
    issuing = Authority.make(tmp_path, "ours-issuing", parent=ours)
    sbc_via_intermediate = issuing.issue(tmp_path, dns=(SBC,), cn="sbc2")
    impostor = ours.issue(tmp_path, dns=("sbc.elsewhere.example",), cn="impostor")
    other_trunks = theirs.issue(tmp_path, dns=(SBC,), cn="other")
    unknown = stranger_ca.issue(tmp_path, dns=(SBC,), cn="unknown")
    env = {
        "HARK_SIP_TRUNKS": json.dumps(
            [
                {
                    "name": "carrier",
                    "addresses": ["127.0.0.0/8"],
                    "tls_client_ca": str(ours.path),
                    "tls_client_names": [SBC],
                },
                # Its CA is known to the TLS port, so its certificates pass the handshake; its
                # address is not ours.
                {"name": "other", "addresses": ["192.0.2.1"], "tls_client_ca": str(theirs.path)},
            ]
        )
    }
    tls_port = free_sip_port()
    tls = (
        "--sip-tls-port",
        str(tls_port),
        "--sip-tls-cert",
        str(server_cert),
        "--sip-tls-key",
        str(server_key),
    )
    with sip_serve(tmp_path / "hark.log", *tls, env=env) as server:
        assert await call_over_tls(tls_port, server_cert, sbc) == 200
        assert await call_over_tls(tls_port, server_cert, sbc_via_intermediate) == 200
        # The trunk's address without its certificate: over TLS without one, with one of
        # the trunk's CA for another name, with another trunk's CA's.
        assert await call_over_tls(tls_port, server_cert, None) == 403
        assert await call_over_tls(tls_port, server_cert, impostor) == 403
        assert await call_over_tls(tls_port, server_cert, other_trunks) == 403
        # A CA the port does not know: the handshake itself fails.
        assert await call_over_tls(tls_port, server_cert, unknown) is None
        log = server.log()
        assert "no trunk takes calls from this address without a client certificate" in log
        assert "no trunk takes calls from this address with this certificate" in log
        # Over UDP, from the trunk's address: no certificate, no call.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.settimeout(LIVENESS_S)
            udp.bind(("127.0.0.1", 0))
            port = udp.getsockname()[1]
            udp.sendto(
                request("INVITE", port, branch="u1", call_id="u1", body=_SDP).encode(),
                ("127.0.0.1", server.sip_port),
            )
            reply = udp.recv(65536)
        assert reply.startswith(b"SIP/2.0 403"), reply[:80]
        assert await call_over_tls(tls_port, server_cert, sbc) == 200
        assert server.alive()

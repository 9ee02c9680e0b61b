"""Makes a development CA and the certificates TensorLights' mTLS needs (not for production:
the CA key sits next to the certificates, unencrypted).

    .venv/bin/python scripts/dev_ca.py /etc/tensorlights/pki \
        --controller ctl.example.org --controller 10.0.0.5 --agent gpu01 --agent gpu02 --operator

writes ca.pem (+ ca.key), controller.pem/.key (server certificate; every --controller name or
IP in its subjectAltName), one <host>.pem/.key per --agent (client certificate whose common
name is the host name the agent registers as: the controller checks that they match), and
operator.pem/.key for tlctl over TLS. An existing CA in the directory is reused.

--expired NAME makes that certificate's validity end yesterday (to test refusal).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tensorlights.tls_files import ROLE_URI, Role

Key = ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "TensorLights dev CA"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: Key) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _validity(expired: bool, days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    if expired:
        return now - datetime.timedelta(days=30), now - datetime.timedelta(days=1)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def load_or_make_ca(directory: Path, days: int) -> tuple[x509.Certificate, Key]:
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(False, days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("TensorLights dev CA"))
        .issuer_name(_name("TensorLights dev CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def issue(
    directory: Path,
    file_stem: str,
    common_name: str,
    ca: tuple[x509.Certificate, Key],
    *,
    server_names: list[str],
    client: bool,
    expired: bool,
    days: int,
    role: Role | None = None,
) -> None:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(expired, days)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    alt: list[x509.GeneralName] = []
    for name in server_names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    if role is not None:  # what the controller lets this client do (tls_files.Role)
        alt.append(x509.UniformResourceIdentifier(f"{ROLE_URI}{role}"))
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(directory / f"{file_stem}.key", key)
    (directory / f"{file_stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(
    directory: Path,
    controller_names: Sequence[str],
    agents: Sequence[str],
    operator: bool = False,
    expired: Sequence[str] = (),
    days: int = 365,
) -> list[str]:
    """The CA (reused if present) and the certificates asked for; the names written."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = load_or_make_ca(directory, days * 10)
    made = []
    if controller_names:
        issue(
            directory,
            "controller",
            controller_names[0],
            ca,
            server_names=list(controller_names),
            client=False,
            expired="controller" in expired,
            days=days,
        )
        made.append("controller")
    roles = [(host, Role.AGENT) for host in agents]
    roles += [("operator", Role.OPERATOR)] if operator else []
    for host, role in roles:
        issue(
            directory,
            host,
            host,
            ca,
            server_names=[],
            client=True,
            expired=host in expired,
            days=days,
            role=role,
        )
        made.append(host)
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--controller", action="append", default=[], metavar="NAME_OR_IP")
    parser.add_argument("--agent", action="append", default=[], metavar="HOST")
    parser.add_argument("--operator", action="store_true", help="also a client cert for tlctl")
    parser.add_argument("--expired", action="append", default=[], metavar="NAME")
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args(argv)
    made = make_pki(
        args.directory, args.controller, args.agent, args.operator, args.expired, args.days
    )
    print(f"{args.directory}: ca.pem" + "".join(f", {n}.pem" for n in made), file=sys.stderr)
    return 0

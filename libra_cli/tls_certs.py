"""A local certificate authority and the certificates a stack needs (``libra certs``).

Writes, into one folder: ``ca.pem`` (give it to clients: ``auth.tls_ca_file``),
``ca-key.pem``, ``server.pem``/``server-key.pem`` (every service:
``auth.tls_cert_file``/``auth.tls_key_file``) and ``client.pem``/``client-key.pem`` (a
client certificate for mutual TLS). Private keys are created 0600. ECDSA P-256 keys;
the server certificate names ``localhost``, ``127.0.0.1``, ``::1`` and any extra host
given, since gRPC checks the address a client dials against these names.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class CertPaths:
    """The files ``make_certs`` wrote."""

    ca: Path
    ca_key: Path
    server: Path
    server_key: Path
    client: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Libra (local)"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             valid_days: int) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))  # clock skew between hosts
            .not_valid_after(now + dt.timedelta(days=valid_days)))


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, common_name: str,
          usage: x509.ObjectIdentifier, hosts: list[str] | None,
          valid_days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (_builder(_name(common_name), ca_name, key, valid_days)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(path: Path, data: bytes, private: bool) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certs(out: Path, hosts: list[str] | None = None, valid_days: int = 365) -> CertPaths:
    """Create a CA, a server and a client certificate under ``out``.

    Raises ValueError when ``valid_days`` is not positive.
    """
    if valid_days <= 0:
        raise ValueError(f"valid_days must be > 0, got {valid_days}")
    out.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("Libra local CA")
    ca = (_builder(ca_name, ca_name, ca_key, valid_days)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=True, key_cert_sign=True, crl_sign=True,
              content_commitment=False, key_encipherment=False, data_encipherment=False,
              key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    all_hosts = list(dict.fromkeys([*DEFAULT_HOSTS, *(hosts or [])]))
    server, server_key = _leaf(ca_key, ca_name, all_hosts[0] if not hosts else hosts[0],
                               ExtendedKeyUsageOID.SERVER_AUTH, all_hosts, valid_days)
    client, client_key = _leaf(ca_key, ca_name, "libra-client",
                               ExtendedKeyUsageOID.CLIENT_AUTH, None, valid_days)
    paths = CertPaths(out / "ca.pem", out / "ca-key.pem", out / "server.pem",
                      out / "server-key.pem", out / "client.pem", out / "client-key.pem")
    pem = serialization.Encoding.PEM
    _write(paths.ca, ca.public_bytes(pem), private=False)
    _write(paths.ca_key, _key_pem(ca_key), private=True)
    _write(paths.server, server.public_bytes(pem), private=False)
    _write(paths.server_key, _key_pem(server_key), private=True)
    _write(paths.client, client.public_bytes(pem), private=False)
    _write(paths.client_key, _key_pem(client_key), private=True)
    return paths

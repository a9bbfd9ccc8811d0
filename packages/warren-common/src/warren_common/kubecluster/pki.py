"""The certificates of a throw-away control plane: its own CA, a serving certificate for the
API server, client certificates for the admin and the components, and the ServiceAccount
signing key. ECDSA P-256: quick to make, accepted everywhere in Kubernetes.

Needs `cryptography` (warren-common's `kubecluster` extra)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as exc:  # pragma: no cover: an environment without the extra
    raise ImportError(f"{exc}: install warren-common with its extra, warren-common[kubecluster]") from exc

# Longer than any test, short enough that a leaked key is worth nothing for long.
VALIDITY = dt.timedelta(days=30)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.touch(mode=0o600)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


class Authority:
    """A new CA in `directory` (ca.crt, ca.key) that issues `<name>.crt` and `<name>.key` there."""

    def __init__(self, directory: Path, common_name: str = "warren-test-ca") -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        subject = _name(common_name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self._write("ca", self._key, self._cert)

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        dns_names: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> None:
        """A serving certificate when it names hosts (dns_names, ips), else a client one; a
        client's organizations are its groups."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        server = bool(dns_names or ips)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        if server:
            names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
            names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        self._write(name, key, builder.sign(self._key, hashes.SHA256()))

    def _write(self, name: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        _write_key(self.directory / f"{name}.key", key)
        (self.directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def signing_keypair(directory: Path, name: str) -> None:
    """`<name>.key` and `<name>.pub`: the key ServiceAccount tokens are signed with."""
    key = ec.generate_private_key(ec.SECP256R1())
    _write_key(directory / f"{name}.key", key)
    (directory / f"{name}.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )

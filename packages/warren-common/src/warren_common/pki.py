"""Certificates and keys for a cluster's control plane: CAs, the leaves they sign and the
ServiceAccount signing key, in one directory. Keys are ECDSA P-256: quick to make and
accepted everywhere in Kubernetes. Existing files are kept; a leaf whose names no longer
match what is asked for is reissued.

The local cluster (warren.cluster) lays its CAs out as kubeadm does; the throw-away control
planes of the tests (kubecluster) use one CA. Needs `cryptography`: the warren package pins
it, and warren-common's `kubecluster` extra brings it elsewhere.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from warren_common.files import write_private

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as exc:  # pragma: no cover: an environment without the extra
    raise ImportError(f"{exc}: install warren-common with its extra, warren-common[kubecluster]") from exc

CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=30)

SERVER = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT = ExtendedKeyUsageOID.CLIENT_AUTH


@dataclass(frozen=True)
class Leaf:
    """A certificate to issue: subject, SANs and usages."""

    name: str
    ca: str
    common_name: str
    organizations: tuple[str, ...] = ()
    usages: tuple[x509.ObjectIdentifier, ...] = (CLIENT,)
    dns_names: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()


@dataclass
class Pki:
    directory: Path
    issued: list[str] = field(default_factory=list)

    def path(self, name: str, suffix: str) -> Path:
        return self.directory / f"{name}.{suffix}"

    def ensure_ca(self, name: str, common_name: str) -> None:
        crt, key = self.path(name, "crt"), self.path(name, "key")
        if crt.exists() and key.exists():
            return
        private = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(private.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(private.public_key()), False)
            .sign(private, hashes.SHA256())
        )
        self._write(name, private, cert)

    def ensure_leaf(self, leaf: Leaf) -> None:
        crt, key = self.path(leaf.name, "crt"), self.path(leaf.name, "key")
        if crt.exists() and key.exists() and _current(x509.load_pem_x509_certificate(crt.read_bytes()), leaf):
            return
        ca_key = serialization.load_pem_private_key(self.path(leaf.ca, "key").read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(self.path(leaf.ca, "crt").read_bytes())
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{self.path(leaf.ca, 'key')} is not an EC key")
        private = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in leaf.organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, leaf.common_name))
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_cert.subject)
            .public_key(private.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(leaf.usages)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)
        )
        sans = _sans(leaf)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        self._write(leaf.name, private, builder.sign(ca_key, hashes.SHA256()))

    def ensure_keypair(self, name: str) -> None:
        """The service-account signing key (private .key, public .pub)."""
        key, pub = self.path(name, "key"), self.path(name, "pub")
        if key.exists() and pub.exists():
            return
        private = ec.generate_private_key(ec.SECP256R1())
        _write_key(key, private)
        pub.write_bytes(
            private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self.issued.append(name)

    def _write(self, name: str, private: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_key(self.path(name, "key"), private)
        self.path(name, "crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.issued.append(name)


def _usage(*, ca: bool) -> x509.KeyUsage:
    """Signing only: a CA signs certificates and CRLs, a leaf its TLS handshakes."""
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


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _sans(leaf: Leaf) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in leaf.dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in leaf.ips]
    return names


def _current(cert: x509.Certificate, leaf: Leaf) -> bool:
    """Whether an existing certificate still fits: names, usages and time left."""
    if cert.not_valid_after_utc - _now() < RENEW_BEFORE:
        return False
    if cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value != leaf.common_name:
        return False
    orgs = tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    if orgs != leaf.organizations:
        return False
    try:
        have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have_names = {str(n.value) for n in have}
    except x509.ExtensionNotFound:
        have_names = set()
    return have_names == {str(n.value) for n in _sans(leaf)}


def _write_key(path: Path, private: ec.EllipticCurvePrivateKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    encoding, key_format = serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL
    write_private(path, private.private_bytes(encoding, key_format, serialization.NoEncryption()))

import stat
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from warren_common.pki import SERVER, Leaf, Pki

from warren.cluster.components import leaves
from warren.config import ClusterConfig


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_ca_and_leaf_chain(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.ensure_ca("ca", "test-ca")
    pki.ensure_leaf(
        Leaf("srv", "ca", "server", usages=(SERVER,), dns_names=("localhost",), ips=("127.0.0.1",))
    )
    ca, leaf = load(tmp_path / "ca.crt"), load(tmp_path / "srv.crt")
    assert leaf.issuer == ca.subject
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in sans} == {"localhost", "127.0.0.1"}
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert stat.S_IMODE((tmp_path / "srv.key").stat().st_mode) == 0o600


def test_second_run_issues_nothing_and_changed_names_reissue(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.ensure_ca("ca", "test-ca")
    leaf = Leaf("srv", "ca", "server", ips=("127.0.0.1",))
    pki.ensure_leaf(leaf)
    first = (tmp_path / "srv.crt").read_bytes()

    again = Pki(tmp_path)
    again.ensure_ca("ca", "test-ca")
    again.ensure_leaf(leaf)
    assert again.issued == []
    assert (tmp_path / "srv.crt").read_bytes() == first

    moved = Pki(tmp_path)
    moved.ensure_leaf(Leaf("srv", "ca", "server", ips=("127.0.0.1", "192.0.2.9")))
    assert moved.issued == ["srv"]
    assert (tmp_path / "srv.crt").read_bytes() != first


def test_admin_is_in_the_platform_group() -> None:
    admin = next(leaf for leaf in leaves(ClusterConfig(), "192.0.2.2") if leaf.name == "admin")
    assert "warren:platform" in admin.organizations


def test_apiserver_names_cover_service_ip_and_advertise_address(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.ensure_ca("ca", "ca")
    apiserver = next(leaf for leaf in leaves(ClusterConfig(), "192.0.2.2") if leaf.name == "apiserver")
    pki.ensure_leaf(apiserver)
    cert = load(tmp_path / "apiserver.crt")
    names = {str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value}
    assert {"10.96.0.1", "192.0.2.2", "127.0.0.1", "kubernetes.default.svc.cluster.local"} <= names
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-apiserver"


def test_service_account_keypair(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.ensure_keypair("sa")
    assert (tmp_path / "sa.key").exists() and (tmp_path / "sa.pub").exists()
    pki.ensure_keypair("sa")
    assert pki.issued == ["sa"]

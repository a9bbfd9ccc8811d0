"""The guest kernel taken from a directory of .debs (the bundle's), with no apt involved."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest
from warren_forkd import kernel

VERSION = "6.1.0-99-amd64"


def fake_kernel_deb(directory: Path, version: str, revision: str) -> Path:
    """A package shaped like Debian's: boot/vmlinuz-<version> (a gzip'd ELF stands in for the
    bzImage) and the modules the guest loads under lib/modules/<version>/kernel."""
    tree = directory / f"tree-{version}-{revision}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: linux-image-{version}\nVersion: {revision}\nArchitecture: amd64\n"
        "Maintainer: test <test@example.invalid>\nDescription: a stand-in kernel\n"
    )
    (tree / "boot").mkdir()
    (tree / "boot" / f"vmlinuz-{version}").write_bytes(
        b"setup" + gzip.compress(b"\x7fELF" + version.encode(), mtime=0)
    )
    modules = tree / "lib" / "modules" / version / "kernel" / "drivers"
    modules.mkdir(parents=True)
    for name in kernel.MODULES:
        (modules / f"{name}.ko").write_bytes(name.encode())
    deb = directory / f"linux-image-{version}_{revision}_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)], check=True, capture_output=True
    )
    return deb


def test_the_versioned_package_is_taken_from_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    debs = tmp_path / "debs"
    debs.mkdir()
    fake_kernel_deb(debs, VERSION, "6.1.150-1")
    # The metapackage and the unsigned build sit beside it in a bundle: neither is taken.
    (debs / "linux-image-amd64_6.1.150-1_amd64.deb").write_bytes(b"")
    (debs / f"linux-image-{VERSION}-unsigned_6.1.150-1_amd64.deb").write_bytes(b"")
    monkeypatch.setenv("WARREN_FORKD_KERNEL_DEBS", str(debs))
    monkeypatch.setattr(kernel, "_kernel_package", lambda: pytest.fail("apt was asked"))
    got = kernel.fetch(cache=tmp_path / "cache")
    assert got.version == VERSION
    assert got.vmlinux.read_bytes() == b"\x7fELF" + VERSION.encode()
    assert [m.name for m in got.modules] == [f"{m}.ko" for m in kernel.MODULES]
    assert got.vmlinuz.parent == tmp_path / "cache" / "kernels" / VERSION
    assert kernel.fetch(cache=tmp_path / "cache") == got  # unpacked once, then cached


def test_the_newest_of_several_is_taken(tmp_path: Path) -> None:
    for version in ("6.1.0-9-amd64", "6.1.0-10-amd64"):
        (tmp_path / f"linux-image-{version}_6.1.1-1_amd64.deb").write_bytes(b"")
    assert kernel.local_package(tmp_path).name.startswith("linux-image-6.1.0-10-amd64_")


def test_a_directory_without_one_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "linux-image-amd64_6.1.150-1_amd64.deb").write_bytes(b"")
    with pytest.raises(RuntimeError, match="WARREN_FORKD_KERNEL_DEBS"):
        kernel.fetch(cache=tmp_path / "cache", debs=tmp_path)

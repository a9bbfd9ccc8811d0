"""The service images' Debian userland from apt source files the caller names (a build host
that is not Debian, such as the kind workflow's Ubuntu runner, names a Debian mirror), or
from the host's own sources when none is named."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from warren.cli import main
from warren.images import debian, services
from warren.images.rootfs import ImageError

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MIRROR = f"deb [signed-by={KEYRING}] http://debian.mirror.example/debian bookworm main\n"


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    path = tmp_path / "debian.list"
    path.write_text(MIRROR)
    return path


def test_given_sources_are_checked_and_named_in_errors(tmp_path: Path, mirror: Path) -> None:
    assert debian.sources([mirror]) == [mirror]
    empty = tmp_path / "empty.sources"
    empty.write_text("\n")
    with pytest.raises(ImageError, match=rf"{empty} is empty"):
        debian.sources([empty])
    wrong = tmp_path / "mirror.txt"
    wrong.write_text(MIRROR)
    with pytest.raises(ImageError, match=r"mirror\.txt: name a \.list"):
        debian.sources([wrong])
    with pytest.raises(ImageError, match="cannot be read"):
        debian.sources([tmp_path / "missing.list"])
    with pytest.raises(ImageError, match="no apt sources given"):
        debian.sources([])


def _fake_run(calls: list[list[str]]) -> Any:
    def run(argv: list[str], **_kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        if argv[-1] != "--version":
            Path(argv[-2]).write_bytes(b"tarball")  # the tarball mmdebstrap would write
        return subprocess.CompletedProcess(argv, 0, "mmdebstrap 1.4.3\n", "")

    return run


def test_mmdebstrap_reads_the_given_sources_not_the_hosts(
    tmp_path: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(shutil, "which", lambda _name: "/usr/bin/mmdebstrap")
    monkeypatch.setattr(subprocess, "run", _fake_run(calls))
    monkeypatch.setattr(debian, "host_sources", lambda: pytest.fail("the host's sources were read"))
    out = debian.build_tarball(tmp_path / "rootfs.tar", ["python3"], [], apt_sources=[mirror])
    assert out.read_bytes() == b"tarball"
    (argv,) = calls
    assert argv[-1] == str(mirror)
    assert argv[-3] == debian.SUITE


def test_the_cache_key_follows_the_given_sources(
    tmp_path: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", _fake_run([]))
    monkeypatch.setattr(debian, "_release_files", list)
    one = debian.inputs_key(["python3"], [], apt_sources=[mirror])
    assert one == debian.inputs_key(["python3"], [], apt_sources=[mirror])
    other = tmp_path / "other.list"
    other.write_text(MIRROR.replace("debian.mirror.example", "other.mirror.example"))
    assert one != debian.inputs_key(["python3"], [], apt_sources=[other])


def test_warren_image_build_passes_apt_sources_on(mirror: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def build_from_checkout(*_args: Any, **kwargs: Any) -> list[Any]:
        seen.update(kwargs)
        return []

    monkeypatch.setattr(services, "build_from_checkout", build_from_checkout)
    result = CliRunner().invoke(main, ["image", "build", "postgres", "--apt-sources", str(mirror)])
    assert result.exit_code == 0, result.output
    assert seen["apt_sources"] == [mirror.absolute()]
    result = CliRunner().invoke(main, ["image", "build", "postgres"])
    assert result.exit_code == 0, result.output
    assert seen["apt_sources"] is None  # the host's own sources

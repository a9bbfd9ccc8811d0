"""Fixtures of the bundle tests: a built bundle, extracted once, and a network namespace with
only loopback up, where every install command runs (`make bundle-test` builds the bundle first).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from warren.bundle.build import default_output
from warren.bundle.extract import extract
from warren.bundle.manifest import Manifest

REPO = Path(__file__).resolve().parents[2]
# What a freshly installed host has: no proxy, no pip configuration, no virtualenv.
CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


@pytest.fixture(scope="session")
def bundle_archive() -> Path:
    path = Path(os.environ.get("WARREN_BUNDLE") or default_output(REPO))
    if not path.is_file():
        pytest.fail(f"no bundle at {path}: run `make bundle-test` (it builds one) or set WARREN_BUNDLE")
    return path


@pytest.fixture(scope="session")
def extracted(bundle_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("bundle") / "extracted"
    extract(bundle_archive, dest)
    return dest


@pytest.fixture(scope="session")
def manifest(extracted: Path) -> Manifest:
    return Manifest.from_json((extracted / "manifest.json").read_bytes())


@dataclass(frozen=True)
class Offline:
    """Runs commands inside the test's network namespace (loopback only, no route anywhere)."""

    namespace: str
    home: Path

    def run(
        self, args: Sequence[str | Path], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.namespace, *map(str, args)],
            env={**CLEAN_ENV, "HOME": str(self.home), **(env or {})},
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )


@pytest.fixture(scope="session")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Offline]:
    if os.geteuid() != 0:
        pytest.fail("the bundle tests create a network namespace: run them as root")
    name = f"warren-bundle-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield Offline(name, tmp_path_factory.mktemp("home"))
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)

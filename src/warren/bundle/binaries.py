"""The Go-built binaries: the build scripts in tools/ make them (or find them in their cache)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warren.bundle import BundleError

CLUSTER_SCRIPT = "tools/build-cluster-binaries.sh"
PULUMI_SCRIPT = "tools/build-pulumi.sh"


@dataclass(frozen=True)
class BinarySet:
    name: str  # bundle directory under bin/
    directory: Path
    pins: dict[str, str]  # PINS: versions and build time
    sums: dict[str, str]  # SHA256SUMS: file -> sha256

    def files(self) -> dict[str, Path]:
        return {
            f"bin/{self.name}/{path.name}": path
            for path in sorted(self.directory.iterdir())
            if path.is_file() and not path.name.startswith(".")
        }


def _read(name: str, directory: Path) -> BinarySet:
    pins_file, sums_file = directory / "PINS", directory / "SHA256SUMS"
    for required in (pins_file, sums_file):
        if not required.is_file():
            raise BundleError(f"{directory} has no {required.name}: its build script did not finish")
    pins = {
        name: value
        for name, _, value in (line.partition("=") for line in pins_file.read_text().splitlines())
        if value and not name.startswith("seconds")  # how long that build took: not a pin
    }
    sums = {}
    for line in sums_file.read_text().splitlines():
        digest, _, file = line.partition("  ")
        sums[file.strip()] = digest
    binaries = {p.name for p in directory.iterdir() if p.is_file()} - {"PINS", "SHA256SUMS"}
    if unlisted := sorted(binaries - set(sums)):
        raise BundleError(f"{directory}: {', '.join(unlisted)} not in SHA256SUMS")
    return BinarySet(name, directory, pins, sums)


def _run_script(script: Path) -> Path:
    """Run a build script (its log goes to our stderr); the directory it prints."""
    result = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise BundleError(f"{script.name} failed (exit {result.returncode}); its log is above")
    lines = result.stdout.strip().splitlines()
    directory = Path(lines[-1]) if lines else Path()
    if not directory.is_dir():
        raise BundleError(f"{script.name} printed no binary directory")
    return directory


def cluster(repo: Path, progress: Callable[[str], None]) -> BinarySet:
    progress(f"cluster binaries ({CLUSTER_SCRIPT}: builds, or returns at once from its cache)")
    return _read("cluster", _run_script(repo / CLUSTER_SCRIPT))


def pulumi(repo: Path, progress: Callable[[str], None]) -> BinarySet | str:
    """The Pulumi CLI and plugins, or why they are left out (they are optional)."""
    script = repo / PULUMI_SCRIPT
    if not script.is_file():
        return f"Pulumi binaries not included: {PULUMI_SCRIPT} is absent"
    progress(f"Pulumi binaries ({PULUMI_SCRIPT})")
    try:
        return _read("pulumi", _run_script(script))
    except (BundleError, OSError) as exc:
        return f"Pulumi binaries not included: {exc}"

"""Debian packages with their whole dependency closure, as a flat apt repository.

apt does the work. It resolves the package list against a private, empty dpkg status (as if
nothing were installed), so the closure holds every library down to libc6 at the archive's
current versions: a minimal host of the same Debian release, at any point release, finds
everything it lacks or must upgrade. The files are downloaded (and checked against Debian's
signed indexes) by `apt-get install --download-only` into a private cache; the machine's own
package state is neither read nor changed. `dpkg-scanpackages` (dpkg-dev) writes the index.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from warren.bundle import BundleError, cache
from warren.bundle.manifest import hash_file

# Purpose -> packages. Everything tools/check-host.sh installs (a unit test holds the two
# together) and what the platform's services run on a node.
PACKAGES: Mapping[str, tuple[str, ...]] = {
    "host tools the build and tests call (tools/check-host.sh)": (
        "coreutils", "gcc", "make", "patch", "dpkg-dev",
    ),
    "node runtime: runc, CNI plugins, the egress floor": (
        "runc", "containernetworking-plugins", "iproute2", "nftables", "iptables", "conntrack",
        "busybox-static",
    ),
    "warren-blockd: the FUSE-served device, loop devices, ext4": (
        "fuse3", "e2fsprogs", "mount", "util-linux",
    ),
    "warren-control's records": ("postgresql",),
    "warren-forkd's microVMs": ("qemu-system-x86", "qemu-utils"),
    "the Python environments": ("python3", "python3-venv"),
    "warren image build and push; the images tier's registry on loopback": (
        "mmdebstrap", "skopeo", "docker-registry",
    ),
    "what Ansible needs on the hosts: sshd, the apt module's library": ("openssh-server", "python3-apt"),
}  # fmt: skip
# Downloaded into the repository with their closure but left out of packages.txt (what an
# install asks apt for): files the bundle ships for a program to read, never installed on
# the host. warren-forkd unpacks the versioned kernel package linux-image-amd64 depends on
# (WARREN_FORKD_KERNEL_DEBS=<bundle>/debs) to boot its guests.
SHIP_ONLY: tuple[str, ...] = ("linux-image-amd64",)
KERNEL = re.compile(r"^linux-image-[0-9][^ ]*-amd64$")  # the versioned package, not -unsigned
REPO_DIR = "debs"
LIST = "packages.txt"
RECIPE = "1"  # bump when the way the closure is made changes


def package_list() -> tuple[str, ...]:
    return tuple(sorted({p for group in PACKAGES.values() for p in group}))


@dataclass(frozen=True)
class Release:
    codename: str  # bookworm
    version: str  # 12
    architecture: str  # amd64


@dataclass(frozen=True)
class DebSet:
    directory: Path
    files: dict[str, Path]  # bundle path -> file
    versions: dict[str, str]  # every package in the repository -> its version
    cached: bool


def host_release(os_release: Path = Path("/etc/os-release")) -> Release:
    """The Debian release this machine's apt serves (the bundle's target release)."""
    fields: dict[str, str] = {}
    if os_release.is_file():
        for line in os_release.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                fields[key] = value.strip().strip('"')
    if fields.get("ID") != "debian" or not fields.get("VERSION_CODENAME"):
        raise BundleError(
            "the Debian packages are taken from this machine's apt sources, so build the bundle on "
            f"Debian (the release the air-gapped hosts run); this is {fields.get('PRETTY_NAME', 'unknown')}"
        )
    arch = _run(["dpkg", "--print-architecture"], "dpkg --print-architecture").strip()
    return Release(fields["VERSION_CODENAME"], fields.get("VERSION_ID", ""), arch)


def _run(args: list[str], what: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise BundleError(f"{what} failed (exit {result.returncode}):\n{tail}")
    return result.stdout


def parse_packages(index: str) -> list[dict[str, str]]:
    """The stanzas of a Packages index (only the single-line fields are kept whole)."""
    stanzas = []
    for block in index.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line[0].isspace():
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            stanzas.append(fields)
    return stanzas


def _intact(directory: Path) -> bool:
    """Every .deb the index names is there with the size and sha256 it records, and nothing more."""
    index = directory / "Packages"
    if not (directory / ".complete").is_file() or not index.is_file():
        return False
    stanzas = parse_packages(index.read_text())
    names = set()
    for stanza in stanzas:
        path = directory / stanza["Filename"].removeprefix("./")
        names.add(path.name)
        if not path.is_file() or hash_file(path) != (int(stanza["Size"]), stanza["SHA256"]):
            return False
    return names == {p.name for p in directory.glob("*.deb")}


def _apt_options(work: Path) -> list[str]:
    options = [
        f"Dir::State::Lists={work / 'lists'}",
        f"Dir::State::status={work / 'status'}",  # empty: resolve as if nothing were installed
        f"Dir::Cache={work / 'cache'}",
        f"Dir::Cache::archives={work / 'archives'}",
        "Acquire::Languages=none",
        "APT::Install-Recommends=false",
    ]
    if os.geteuid() != 0:  # apt's private directories are this user's: no lock, no sandbox user
        options += ["Debug::NoLocking=1", f"APT::Sandbox::User={pwd.getpwuid(os.geteuid()).pw_name}"]
    return [arg for option in options for arg in ("-o", option)]


def key(release: Release) -> str:
    return cache.key(RECIPE, release.codename, release.architecture, *package_list(), "ship-only", *SHIP_ONLY)


def collect(root: Path, progress: Callable[[str], None]) -> tuple[DebSet, Release]:
    release = host_release()
    final = root / f"debs-{key(release)}"
    if _intact(final):
        progress(f"Debian packages from the cache ({final.name})")
        return _deb_set(final, cached=True), release
    for tool, package in (("apt-get", "apt"), ("dpkg-scanpackages", "dpkg-dev")):
        if shutil.which(tool) is None:
            raise BundleError(
                f"{tool} is missing: install Debian's {package} package (apt-get install {package})"
            )
    packages = package_list()
    work = root / "apt"
    for sub in ("lists/partial", "cache", "archives/partial"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    for stale in (work / "archives").glob("*.deb"):
        stale.unlink()
    (work / "status").write_text("")
    options = _apt_options(work)
    progress(f"apt: updating a private copy of the {release.codename} indexes")
    _run(["apt-get", "-q", *options, "update"], "apt-get update (private lists)")
    progress(f"apt: downloading {len(packages) + len(SHIP_ONLY)} packages and their dependency closure")
    _run(
        [
            "apt-get",
            "-q",
            "-y",
            *options,
            "install",
            "--download-only",
            "--no-install-recommends",
            *packages,
            *SHIP_ONLY,
        ],
        "apt-get install --download-only",
    )
    partial = cache.start(final)
    for deb in sorted((work / "archives").glob("*.deb")):
        shutil.move(deb, partial / deb.name)
    if not any(KERNEL.match(deb.name.split("_", 1)[0]) for deb in partial.glob("*.deb")):
        raise BundleError(f"apt downloaded no versioned kernel package behind {', '.join(SHIP_ONLY)}")
    _index(partial, release, packages)
    (partial / ".complete").write_text("")
    cache.finish(partial, final)
    debs = _deb_set(final, cached=False)
    progress(f"apt: {len(debs.versions)} packages in the local repository")
    return debs, release


def _index(directory: Path, release: Release, packages: tuple[str, ...]) -> None:
    """Packages (dpkg-scanpackages), Packages.gz, Release and the list an install asks for."""
    index = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."],
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
    )
    if index.returncode != 0:
        raise BundleError(f"dpkg-scanpackages failed:\n{index.stderr[-2000:]}")
    (directory / "Packages").write_text(index.stdout)
    with gzip.GzipFile(directory / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(index.stdout.encode())
    (directory / LIST).write_text("\n".join(packages) + "\n")
    sums = []
    for name in ("Packages", "Packages.gz"):
        data = (directory / name).read_bytes()
        sums.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    date = datetime.now(UTC).strftime("%a, %d %b %Y %H:%M:%S UTC")
    (directory / "Release").write_text(
        "Origin: Warren bundle\nLabel: Warren bundle\n"
        f"Codename: {release.codename}\nDate: {date}\n"
        f"Architectures: {release.architecture} all\n"
        "Description: Debian packages for an air-gapped Warren install\n"
        "SHA256:\n" + "\n".join(sums) + "\n"
    )


def _deb_set(directory: Path, cached: bool) -> DebSet:
    files = {
        f"{REPO_DIR}/{path.name}": path
        for path in sorted(directory.iterdir())
        if path.is_file() and not path.name.startswith(".")
    }
    stanzas = parse_packages((directory / "Packages").read_text())
    return DebSet(directory, files, {s["Package"]: s["Version"] for s in stanzas}, cached)

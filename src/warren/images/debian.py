"""A Debian userland for Warren's service images, made from Debian's packages alone.

mmdebstrap builds the root filesystem from the host's own apt sources (the same mirror the
host installs from, so an air-gapped build machine's mirror works too), or from the apt
source files given instead (a build host that is not Debian: an Ubuntu CI runner names a
Debian mirror), with every timestamp clamped to a fixed SOURCE_DATE_EPOCH: the same package
versions and the same hooks give a byte-identical tarball. Nothing is pulled from a
container registry.

Documentation, manual pages and translations are left out (each package's copyright file
stays), and so are the apt sources: an image is never upgraded in place, it is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from warren.images.rootfs import ImageError

SUITE = "bookworm"  # Debian 12, the release the hosts, the bundle and the wheels target
SOURCE_DATE_EPOCH = "1700000000"  # any fixed instant; it only has to never change
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
EXCLUDE = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)


def host_sources() -> list[Path]:
    """The host's enabled apt source files (one-line .list or deb822 .sources)."""
    found: list[Path] = []
    for entry in APT_SOURCES:
        if entry.is_file() and entry.read_text().strip():
            found.append(entry)
        elif entry.is_dir():
            found += sorted(p for p in entry.iterdir() if p.suffix in (".list", ".sources"))
    if not found:
        raise ImageError("the host has no apt sources: the Debian userland is built from the host's mirror")
    return found


def given_sources(paths: Sequence[Path]) -> list[Path]:
    """Apt source files named by the caller instead of the host's: each must be a readable,
    non-empty one-line .list or deb822 .sources file."""
    found: list[Path] = []
    for path in paths:
        if path.suffix not in (".list", ".sources"):
            raise ImageError(f"apt sources {path}: name a .list (one-line) or .sources (deb822) file")
        try:
            text = path.read_text()
        except OSError as exc:
            raise ImageError(f"apt sources {path} cannot be read: {exc.strerror}") from None
        if not text.strip():
            raise ImageError(f"apt sources {path} is empty: it must name a Debian {SUITE} mirror")
        found.append(path)
    if not found:
        raise ImageError("no apt sources given: name at least one file, or leave them out for the host's")
    return found


def sources(given: Sequence[Path] | None) -> list[Path]:
    """The given apt source files, or (None) the host's."""
    return host_sources() if given is None else given_sources(given)


def _release_files() -> list[Path]:
    """The mirror's Release files apt last fetched: they change when the mirror does."""
    lists = Path("/var/lib/apt/lists")
    return sorted(p for p in lists.glob("*Release") if p.is_file()) if lists.is_dir() else []


def inputs_key(
    packages: Sequence[str],
    hooks: Sequence[str],
    extra: Sequence[bytes] = (),
    apt_sources: Sequence[Path] | None = None,
) -> str:
    """Everything the tarball depends on: the packages asked for, the hooks, the sources and
    what the mirror last published, mmdebstrap's version, and the caller's own inputs."""
    h = hashlib.sha256()
    for item in (SUITE, SOURCE_DATE_EPOCH, *EXCLUDE, *packages, *hooks):
        h.update(item.encode() + b"\0")
    for path in (*sources(apt_sources), *_release_files()):
        h.update(path.read_bytes())
    version = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True, check=False)
    h.update(version.stdout.encode())
    for blob in extra:
        h.update(hashlib.sha256(blob).digest())
    return h.hexdigest()[:16]


def build_tarball(
    out: Path,
    packages: Sequence[str],
    hooks: Sequence[str],
    progress: Callable[[str], None] = lambda _: None,
    apt_sources: Sequence[Path] | None = None,
) -> Path:
    """Run mmdebstrap into `out`: Debian's minbase plus `packages`, then each of
    `hooks` as a --customize-hook (mmdebstrap's syntax: `$1` is the root; `copy-in` and
    `sync-in` bring files in). The packages come from `apt_sources`, or (None) from the
    host's own apt sources."""
    if shutil.which("mmdebstrap") is None:
        raise ImageError(
            "mmdebstrap is missing: install Debian's mmdebstrap package (tools/check-host.sh does)"
        )
    argv = [
        "mmdebstrap",
        "--quiet",
        # As root: chroot; otherwise in a user namespace of its own (the same tarball).
        "--mode=root" if os.geteuid() == 0 else "--mode=unshare",
        "--variant=minbase",
        "--format=tar",
        "--aptopt=Acquire::Check-Valid-Until false",
        *(f"--dpkgopt={option}" for option in EXCLUDE),
        f"--include={','.join(packages)}",
        *(f"--customize-hook={hook}" for hook in hooks),
        # What the image must not carry: the build host's apt sources and apt's lists.
        '--customize-hook=rm -rf "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*',
        '--customize-hook=rm -rf "$1"/var/lib/apt/lists/*',
        SUITE,
        str(out.with_suffix(".partial.tar")),
        *(str(p) for p in sources(apt_sources)),
    ]
    progress(f"mmdebstrap {SUITE}: {len(packages)} packages and their dependencies")
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
        "LC_ALL": "C.UTF-8",
    }
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-20:])
        raise ImageError(f"mmdebstrap failed (exit {result.returncode}):\n{tail}")
    out.with_suffix(".partial.tar").replace(out)
    return out

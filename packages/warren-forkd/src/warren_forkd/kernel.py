"""The guest kernel: Debian's generic amd64 kernel, unpacked (never installed) into a cache."""

from __future__ import annotations

import gzip
import lzma
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Modules the guest loads, in dependency order: Debian builds virtio and ext4 as modules.
MODULES = (
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_console",
    "virtio_blk",
    "crc16",
    "mbcache",
    "jbd2",
    "crc32c_generic",
    "ext4",
)


@dataclass(frozen=True)
class Kernel:
    version: str
    vmlinuz: Path
    vmlinux: Path  # the same kernel uncompressed, booted through its PVH entry point
    modules: tuple[Path, ...]  # in load order


def extract_vmlinux(bzimage: Path, out: Path) -> None:
    """Unpack the ELF kernel inside a bzImage.

    Under TCG the bzImage's own decompressor is emulated instruction by instruction and takes
    seconds; QEMU loads an ELF kernel with a PVH note directly (microvm supports PVH boot).
    """
    data = bzimage.read_bytes()
    for magic, unpack in ((b"\xfd7zXZ\x00", _unxz), (b"\x1f\x8b\x08\x00", gzip.decompress)):
        at = data.find(magic)
        while at >= 0:
            try:
                elf = unpack(data[at:])
            except (lzma.LZMAError, OSError, EOFError):
                elf = b""
            if elf.startswith(b"\x7fELF"):
                tmp = out.with_name(out.name + ".partial")
                tmp.write_bytes(elf)
                tmp.rename(out)
                return
            at = data.find(magic, at + 1)
    raise RuntimeError(f"no xz or gzip ELF kernel inside {bzimage}")


def _unxz(data: bytes) -> bytes:
    # One stream only: the bzImage carries more bytes after it.
    return lzma.LZMADecompressor().decompress(data)


def cache_root() -> Path:
    """Where kernels and built templates are cached between runs."""
    if explicit := os.environ.get("WARREN_FORKD_CACHE"):
        return Path(explicit)
    if shared := os.environ.get("WARREN_CACHE"):  # the project's one cache directory (Makefile)
        return Path(shared) / "forkd"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "warren" / "forkd"


def _kernel_package() -> str:
    """The versioned package behind the linux-image-amd64 metapackage."""
    out = subprocess.run(
        ["apt-cache", "depends", "linux-image-amd64"], check=True, capture_output=True, text=True
    ).stdout
    match = re.search(r"Depends: (linux-image-[0-9][^\s]*-amd64)\b", out)
    if not match:
        raise RuntimeError(f"no versioned kernel behind linux-image-amd64 in: {out!r}")
    return match.group(1)


def _load(root: Path, version: str) -> Kernel:
    if not (root / "vmlinux").exists():
        extract_vmlinux(root / "vmlinuz", root / "vmlinux")
    modules = tuple(root / "modules" / f"{m}.ko" for m in MODULES)
    return Kernel(version, root / "vmlinuz", root / "vmlinux", modules)


def local_package(directory: Path) -> Path:
    """The newest versioned kernel package (linux-image-<version>-amd64_*.deb) in `directory`.

    An air-gapped host has no apt source to download it from; the bundle ships it in its
    debs/ directory (WARREN_FORKD_KERNEL_DEBS names that directory).
    """
    found = sorted(
        (p for p in directory.glob("linux-image-*-amd64_*.deb") if _VERSIONED.match(p.name)),
        key=lambda p: _version_key(p.name),
    )
    if not found:
        raise RuntimeError(
            f"no versioned kernel package (linux-image-<version>-amd64_*.deb) in {directory}: "
            "point WARREN_FORKD_KERNEL_DEBS at a directory holding one (the bundle's debs/), "
            "or unset it to download the kernel with apt-get"
        )
    return found[-1]


_VERSIONED = re.compile(r"^linux-image-[0-9][^_]*-amd64_[^_]+_amd64\.deb$")


def _version_key(version: str) -> list[tuple[int, int | str]]:
    # Enough of Debian's ordering for kernel package versions (digits compare as numbers).
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", version) if part]


def fetch(cache: Path | None = None, debs: Path | None = None) -> Kernel:
    """The kernel and the modules the guest needs, unpacked once per version: from the
    versioned package in `debs` (else $WARREN_FORKD_KERNEL_DEBS), else downloaded with apt."""
    if debs is None and (named := os.environ.get("WARREN_FORKD_KERNEL_DEBS")):
        debs = Path(named)
    local = local_package(debs) if debs is not None else None
    package = local.name.split("_", 1)[0] if local else _kernel_package()
    version = package.removeprefix("linux-image-")
    root = (cache or cache_root()) / "kernels" / version
    if (root / "vmlinuz").exists():
        return _load(root, version)
    with tempfile.TemporaryDirectory(prefix="forkd-kernel-") as tmp:
        work = Path(tmp)
        if local is None:
            subprocess.run(["apt-get", "download", "-q", package], cwd=work, check=True, capture_output=True)
            (deb,) = work.glob("*.deb")
        else:
            deb = local
        tree = work / "tree"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
        staging = root.with_name(root.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "modules").mkdir(parents=True)
        shutil.copy(tree / "boot" / f"vmlinuz-{version}", staging / "vmlinuz")
        kmods = tree / "lib" / "modules" / version / "kernel"
        for name in MODULES:
            (found,) = kmods.rglob(f"{name}.ko")
            shutil.copy(found, staging / "modules" / f"{name}.ko")
        staging.rename(root)  # last, so a half-unpacked kernel is never taken for a cached one
    return _load(root, version)

"""A gzip'd newc cpio archive written in Python, so building one needs no root and no cpio tool."""

from __future__ import annotations

import gzip
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    path: str  # inside the archive, without a leading slash
    mode: int  # file type and permission bits
    data: bytes = b""  # file contents, or a symlink's target
    rdev: tuple[int, int] = (0, 0)  # major, minor of a device node


def directory(path: str) -> Entry:
    return Entry(path, stat.S_IFDIR | 0o755)


def file(path: str, data: bytes, perm: int = 0o644) -> Entry:
    return Entry(path, stat.S_IFREG | perm, data)


def symlink(path: str, target: str) -> Entry:
    return Entry(path, stat.S_IFLNK | 0o777, target.encode())


def chardev(path: str, major: int, minor: int) -> Entry:
    return Entry(path, stat.S_IFCHR | 0o600, rdev=(major, minor))


def _pad(n: int) -> bytes:
    return b"\0" * (-n % 4)


def _record(ino: int, entry: Entry) -> bytes:
    name = entry.path.encode() + b"\0"
    fields = (ino, entry.mode, 0, 0, 1, 0, len(entry.data), 0, 0, *entry.rdev, len(name), 0)
    header = b"070701" + b"".join(f"{f:08x}".encode() for f in fields)
    return header + name + _pad(len(header) + len(name)) + entry.data + _pad(len(entry.data))


def write(out: Path, entries: list[Entry]) -> None:
    """Write the entries as a gzip'd newc archive (the format the kernel unpacks at boot)."""
    body = b"".join(_record(i + 1, e) for i, e in enumerate(entries))
    body += _record(len(entries) + 1, Entry("TRAILER!!!", 0))
    # mtime=0 keeps the archive byte-identical for identical inputs.
    out.write_bytes(gzip.compress(body, compresslevel=6, mtime=0))

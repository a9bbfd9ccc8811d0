"""The bundle archive: a gzip-compressed tar, manifest.json first, then every file in path order.

Why gzip and not zstd: the first host of an air gap has nothing from the bundle installed yet.
A .tar.gz opens with the `tar` and the Python standard library every Debian host has, so the
bundle can be checked there before anything is installed (`python3 -m warren.bundle verify`
with the warren wheel as the only path entry); zstd would need the `zstd` program or the
zstandard wheel, which are inside the archive. Level 4 costs about twice zstd's time on the
Go binaries for about 6 % more bytes (docs/air-gapped.md has the figures).

Reading is streaming (one pass, nothing written to disk); members must be regular files with
safe relative paths. Standard library only (see the package docstring).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from warren.bundle import MANIFEST, BundleError
from warren.bundle.manifest import Manifest

GZIP_LEVEL = 4
GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20
# Errors a truncated or corrupted compressed stream raises while it is read.
DAMAGE = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


class _HashingReader:
    """Reads a file while hashing what was read."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.digest = hashlib.sha256()

    def read(self, size: int = -1, /) -> bytes:
        data = self._handle.read(size)
        self.digest.update(data)
        return data


def write(
    out: Path,
    manifest: Manifest,
    sources: Mapping[str, Path],
    progress: Callable[[str], None] = lambda _: None,
) -> None:
    """Write the archive for `manifest` from bundle path -> file on disk.

    Each file is hashed again as it is packed: a file that changed after the manifest was
    made fails the build instead of shipping a bundle that would not verify.
    """
    expected = manifest.by_path()
    if set(expected) != set(sources):
        raise BundleError("internal error: the manifest and the files to pack disagree")
    mtime = _epoch(manifest.built)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    manifest_bytes = manifest.to_json()
    total = sum(e.size for e in manifest.files)
    done = 0
    next_report = 0.0
    try:
        with tarfile.open(partial, "w:gz", compresslevel=GZIP_LEVEL, format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(_info(MANIFEST, len(manifest_bytes), 0o644, mtime), io.BytesIO(manifest_bytes))
            for rel in sorted(sources):
                path, entry = sources[rel], expected[rel]
                mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
                with path.open("rb") as handle:
                    reader = _HashingReader(handle)
                    tar.addfile(_info(rel, entry.size, mode, mtime), reader)
                if reader.digest.hexdigest() != entry.sha256:
                    raise BundleError(f"{path} changed while the bundle was being written: build again")
                done += entry.size
                if total and done / total >= next_report:
                    progress(f"packed {done / total:.0%} ({done >> 20} of {total >> 20} MiB)")
                    next_report += 0.25
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(out)


def _info(name: str, size: int, mode: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _epoch(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    mode: int
    kind: str  # "file", or what else the entry is (refused by the readers)
    stream: IO[bytes] | None  # the content, readable once, for files only


@contextmanager
def members(archive: Path) -> Iterator[Iterator[Member]]:
    """The archive's entries in order, streamed; raises BundleError if it is not a .tar.gz."""
    with archive.open("rb") as handle:
        if handle.read(2) != GZIP_MAGIC:
            raise BundleError(f"{archive} is not a gzip-compressed tar (a Warren bundle is a .tar.gz)")
        handle.seek(0)
        with tarfile.open(fileobj=handle, mode="r|gz") as tar:
            yield _iterate(tar)


def _iterate(tar: tarfile.TarFile) -> Iterator[Member]:
    for info in tar:
        if info.isfile():
            yield Member(info.name, info.size, info.mode, "file", tar.extractfile(info))
        else:
            kind = (
                "directory"
                if info.isdir()
                else "symlink"
                if info.issym()
                else "hard link"
                if info.islnk()
                else "special file"
            )
            yield Member(info.name, info.size, info.mode, kind, None)


def hash_stream(stream: IO[bytes], sink: Callable[[bytes], object] | None = None) -> tuple[int, str]:
    """(size, sha256) of what a stream holds, optionally handing each chunk to `sink`."""
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink(chunk)
    return size, digest.hexdigest()

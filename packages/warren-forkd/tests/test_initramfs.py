"""The cpio writer against an independent reader (busybox cpio)."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

from warren_forkd import initramfs


def test_archive_lists_and_extracts(tmp_path: Path) -> None:
    archive = tmp_path / "a.cpio.gz"
    initramfs.write(
        archive,
        [
            initramfs.directory("bin"),
            initramfs.file("bin/hello", b"hi\n", 0o755),
            initramfs.symlink("bin/sh", "hello"),
            initramfs.file("odd", b"12345"),  # a length that needs padding
        ],
    )
    body = gzip.decompress(archive.read_bytes())
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["busybox", "cpio", "-i", "-d"], input=body, cwd=out, check=True, capture_output=True)
    assert (out / "bin" / "hello").read_bytes() == b"hi\n"
    assert (out / "bin" / "hello").stat().st_mode & 0o777 == 0o755
    assert (out / "bin" / "sh").readlink() == Path("hello")
    assert (out / "odd").read_bytes() == b"12345"

"""The dedup report: file-aligned chunks survive an early insertion that fixed ones do not."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from warren_blockd.dedup import report

pytestmark = pytest.mark.skipif(not shutil.which("mkfs.ext4"), reason="mkfs.ext4 (e2fsprogs) is needed")

# One file system identity and clock for both images, as if B were A later on.
MKFS_ENV = {**os.environ, "E2FSPROGS_FAKE_TIME": "1700000000"}
MKFS_IDENTITY = [
    "-U",
    "6b1f4d3e-8c0a-4f55-9a57-2f8b0c1d2e3f",
    "-E",
    "hash_seed=0c5c8a64-1d0e-4c1b-8f7e-3d2a1b0c9d8e",
]


def mkfs(tree: Path, image: Path) -> None:
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-b", "4096", *MKFS_IDENTITY, "-d", str(tree), str(image), "64M"],
        check=True,
        capture_output=True,
        env=MKFS_ENV,
    )


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)


def test_file_aligned_shares_more_after_an_early_insertion(tmp_path: Path) -> None:
    rng = random.Random(11)  # noqa: S311  # reproducible data, no secret
    a_files = {
        f"{d}/file{i:02}": rng.randbytes(rng.randrange(20_000, 600_000))
        for d in ("lib", "src", "tests")
        for i in range(8)
    }
    a_files["src/config.txt"] = b"threads = 4\n" * 20
    b_files = dict(a_files)
    b_files["src/config.txt"] = b"threads = 8\n" * 20  # one small file changed
    b_files["00-inserted/early"] = rng.randbytes(150_000)  # placed first, shifts what follows

    images = []
    for name, files in (("a", a_files), ("b", b_files)):
        root = tmp_path / f"tree-{name}"
        write_tree(root, files)
        image = tmp_path / f"{name}.img"
        mkfs(root, image)
        images.append(image)

    figures = report(images[0], images[1])
    print(figures)  # the figures, for -s runs
    assert figures["chunk_size"] == 256 * 1024
    assert figures["shared_ratio_file_aligned"] > figures["shared_ratio_fixed"]
    assert figures["shared_ratio_file_aligned"] > 0.8
    for mode in ("file_aligned", "fixed"):
        ratio = figures[f"b_shared_bytes_{mode}"] / figures[f"b_mapped_bytes_{mode}"]
        assert ratio == figures[f"shared_ratio_{mode}"]


def test_an_image_shares_everything_with_its_copy(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    write_tree(root, {"a": os.urandom(500_000), "d/b": os.urandom(70_000)})
    image = tmp_path / "a.img"
    mkfs(root, image)
    copy = tmp_path / "copy.img"
    shutil.copyfile(image, copy)
    figures = report(image, copy, chunk_size=64 * 1024)
    assert figures["shared_ratio_file_aligned"] == figures["shared_ratio_fixed"] == 1.0
    assert figures["chunk_size"] == 64 * 1024

"""The ext4 extent reader against e2fsprogs' own view of real images (mkfs.ext4 -d, debugfs)."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import loop_mount_missing, loop_mounted
from warren_blockd import ext4

pytestmark = pytest.mark.skipif(
    not (shutil.which("mkfs.ext4") and shutil.which("debugfs") and shutil.which("dumpe2fs")),
    reason="mkfs.ext4, debugfs and dumpe2fs (e2fsprogs) are needed",
)

LEAF = re.compile(r"^\s*(\d+)/\s*(\d+)\s+\d+/\s*\d+\s+(\d+) -\s*\d+\s+(\d+) -\s*\d+\s+(\d+)\s*(Uninit)?\s*$")
ROOT_LEVEL = re.compile(r"^\s*0/\s*(\d+)\s")
DEBUGFS_ENV = {**os.environ, "DEBUGFS_PAGER": "__none__", "PAGER": "__none__"}


def mkfs(image: Path, size: str, tree: Path | None = None, *options: str) -> None:
    args = ["mkfs.ext4", "-q", "-F", "-b", "4096", *options]
    if tree is not None:
        args += ["-d", str(tree)]
    subprocess.run([*args, str(image), size], check=True, capture_output=True)


def debugfs(image: Path, commands: list[str], *, write: bool = False) -> list[str]:
    """The output of each command, run in one debugfs session."""
    script = image.with_suffix(".debugfs")
    script.write_text("".join(f"{c}\n" for c in commands))
    args = ["debugfs", *(["-w"] if write else []), "-f", str(script), str(image)]
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=DEBUGFS_ENV).stdout
    sections = re.split(r"^debugfs: .*$", out, flags=re.MULTILINE)
    assert len(sections) == len(commands) + 1, out
    return sections[1:]


def debugfs_trees(
    image: Path, inodes: list[int]
) -> dict[int, tuple[list[tuple[int, int, int]], list[tuple[int, int, int]], int]]:
    """inode -> (written leaves, unwritten leaves, tree depth or -1) as debugfs reads them."""
    trees = {}
    for inode, text in zip(inodes, debugfs(image, [f"ex <{i}>" for i in inodes]), strict=True):
        written: list[tuple[int, int, int]] = []
        unwritten: list[tuple[int, int, int]] = []
        depth = -1
        for line in text.splitlines():
            if (root := ROOT_LEVEL.match(line)) and depth < 0:
                depth = int(root.group(1))
            if leaf := LEAF.match(line):
                entry = (int(leaf.group(3)), int(leaf.group(4)), int(leaf.group(5)))
                (unwritten if leaf.group(6) else written).append(entry)
        trees[inode] = (written, unwritten, depth)
    return trees


def inode_of(image: Path, paths: list[str]) -> dict[str, int]:
    found = {}
    for path, text in zip(paths, debugfs(image, [f"stat {p}" for p in paths]), strict=True):
        match = re.search(r"Inode: (\d+)", text)
        assert match, f"debugfs does not know {path}: {text}"
        found[path] = int(match.group(1))
    return found


def used_inodes(image: Path) -> int:
    out = subprocess.run(["dumpe2fs", "-h", str(image)], check=True, capture_output=True, text=True).stdout
    count = int(re.search(r"^Inode count:\s+(\d+)", out, re.MULTILINE).group(1))  # type: ignore[union-attr]
    free = int(re.search(r"^Free inodes:\s+(\d+)", out, re.MULTILINE).group(1))  # type: ignore[union-attr]
    return count - free


def assert_matches_debugfs(image: Path, files: list[ext4.FileExtents]) -> None:
    """Every inode we report maps exactly as debugfs maps it, and none is missing."""
    assert len(files) == used_inodes(image)
    trees = debugfs_trees(image, [f.inode for f in files])
    for f in files:
        written, unwritten, _ = trees[f.inode]
        assert (f.inode, f.extents, f.unwritten) == (f.inode, written, unwritten)


def make_tree(root: Path, seed: int = 1) -> dict[str, int]:
    """Files of many sizes, nested dirs, an empty file and symlinks; returns path -> size."""
    rng = random.Random(seed)  # noqa: S311  # reproducible data, no secret
    sizes = {
        "empty": 0,
        "one": 1,
        "just-under": 4095,
        "block": 4096,
        "just-over": 4097,
        "nested/a/b/c/deep": 100_000,
        "nested/a/mid": 1_000_000,
        "nested/z": 3_000_000,
        "other/x": 300_000,
    }
    for name, size in sizes.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(rng.randbytes(size))
    (root / "short-link").symlink_to("one")  # fast symlink: the target lives in the inode
    (root / "long-link").symlink_to("nested/" + "x" * 100)  # slow symlink: one data block
    return sizes


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    root = tmp_path / "tree"
    root.mkdir()
    return root, make_tree(root)


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["-O", "^64bit"],
        ["-O", "^metadata_csum,uninit_bg"],
        ["-O", "^flex_bg"],
        ["-O", "^has_journal"],
        ["-O", "inline_data"],
        ["-I", "128"],
    ],
    ids=["default", "32bit-descriptors", "uninit_bg", "no-flex_bg", "no-journal", "inline_data", "inode-128"],
)
def test_extents_match_debugfs(tmp_path: Path, tree: tuple[Path, dict[str, int]], options: list[str]) -> None:
    root, sizes = tree
    image = tmp_path / "fs.img"
    mkfs(image, "64M", root, *options)
    files = ext4.read_extents(image)
    assert_matches_debugfs(image, files)

    by_inode = {f.inode: f for f in files}
    paths = [*sizes, "short-link", "long-link", "nested", "nested/a/b/c"]
    inodes = inode_of(image, [f"/{p}" for p in paths])
    inline = "inline_data" in " ".join(options)
    for name, size in sizes.items():
        f = by_inode[inodes[f"/{name}"]]
        assert f.kind == "file"
        blocks = sum(n for _, _, n in f.extents)
        if inline and size <= 60:  # i_block's room: these live in the inode
            assert blocks == 0
        else:
            assert blocks == -(-size // 4096)
    assert by_inode[inodes["/short-link"]].kind == "symlink"
    assert by_inode[inodes["/short-link"]].extents == []
    assert by_inode[inodes["/nested"]].kind == "dir"
    if not inline:
        assert len(by_inode[inodes["/long-link"]].extents) == 1
    assert [f.kind for f in files].count("journal") == (0 if "^has_journal" in options else 1)


@pytest.mark.parametrize("features", ["meta_bg,^resize_inode", "sparse_super2,meta_bg,^resize_inode"])
def test_many_groups_and_meta_bg(tmp_path: Path, features: str) -> None:
    """Inodes spread over 75 small groups, with descriptors in a second meta group."""
    root = tmp_path / "tree"
    root.mkdir()
    rng = random.Random(2)  # noqa: S311  # reproducible data, no secret
    for i in range(1200):
        (root / f"f{i:04}").write_bytes(rng.randbytes(rng.randrange(0, 9000)))
    image = tmp_path / "fs.img"
    mkfs(image, "100M", root, "-g", "256", "-N", "1600", "-O", features)
    sb = ext4.read_superblock(image)
    files = ext4.read_extents(image)
    descriptors_per_block = sb.block_size // sb.desc_size
    assert max(f.inode for f in files) > descriptors_per_block * sb.inodes_per_group
    assert_matches_debugfs(image, files)


def test_fragmented_file_has_a_deeper_tree(tmp_path: Path) -> None:
    """Freeing every other small file, then writing a large one, scatters it over the holes."""
    root = tmp_path / "tree"
    root.mkdir()
    for i in range(40):
        (root / f"f{i:02}").write_bytes(os.urandom(8192))
    image = tmp_path / "fs.img"
    mkfs(image, "16M", root)
    source = tmp_path / "big"
    source.write_bytes(os.urandom(300_000))
    debugfs(image, [*(f"rm /f{i:02}" for i in range(0, 40, 2)), f"write {source} /frag"], write=True)
    files = ext4.read_extents(image)
    assert_matches_debugfs(image, files)
    inode = inode_of(image, ["/frag"])["/frag"]
    written, _, depth = debugfs_trees(image, [inode])[inode]
    assert depth >= 1 and len(written) > 4


@pytest.mark.root
@pytest.mark.skipif(loop_mount_missing() is not None, reason=loop_mount_missing() or "")
def test_deep_tree_and_unwritten_extents_from_the_kernel(tmp_path: Path) -> None:
    image = tmp_path / "fs.img"
    mkfs(image, "128M", None, "-g", "8192")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with loop_mounted(image, mnt):
        # Every other block of a sparse file: 3000 extents, more than one leaf block holds.
        fd = os.open(mnt / "sparse", os.O_CREAT | os.O_WRONLY)
        for i in range(0, 6000, 2):
            os.pwrite(fd, os.urandom(4096), i * 4096)
        os.fsync(fd)
        os.close(fd)
        # Preallocated, then one block written: unwritten extents around a written one.
        fd = os.open(mnt / "falloc", os.O_CREAT | os.O_WRONLY)
        os.posix_fallocate(fd, 0, 1 << 20)
        os.pwrite(fd, os.urandom(4096), 8192)
        os.fsync(fd)
        os.close(fd)
        # Interleaved appends to two files in several directories (spread over groups).
        for d in range(4):
            (mnt / f"dir{d}").mkdir()
            with (mnt / f"dir{d}" / "a").open("wb") as a, (mnt / f"dir{d}" / "b").open("wb") as b:
                for _ in range(64):
                    for f in (a, b):
                        f.write(os.urandom(4096))
                        f.flush()
                        os.fsync(f.fileno())

    files = ext4.read_extents(image)
    assert_matches_debugfs(image, files)
    inodes = inode_of(image, ["/sparse", "/falloc"])
    trees = debugfs_trees(image, list(inodes.values()))
    by_inode = {f.inode: f for f in files}
    sparse = by_inode[inodes["/sparse"]]
    assert trees[sparse.inode][2] >= 2
    assert [lg for lg, _, _ in sparse.extents] == list(range(0, 6000, 2))
    falloc = by_inode[inodes["/falloc"]]
    assert falloc.extents and falloc.unwritten
    assert [lg for lg, _, _ in falloc.extents] == [2]
    assert sum(n for _, _, n in falloc.extents + falloc.unwritten) == 256
    assert len(ext4.claimed_blocks(files)) == sum(n for f in files for _, _, n in f.extents)


def test_not_ext4_is_refused_clearly(tmp_path: Path) -> None:
    junk = tmp_path / "junk.img"
    junk.write_bytes(os.urandom(1 << 20))
    with pytest.raises(ext4.NotExt4Error, match=r"junk\.img: not an ext4 file system"):
        ext4.read_extents(junk)
    short = tmp_path / "short.img"
    short.write_bytes(b"\0" * 1500)
    with pytest.raises(ext4.NotExt4Error, match=r"short\.img: not an ext4 file system"):
        ext4.read_extents(short)


def test_small_blocks_are_refused_with_the_fix(tmp_path: Path) -> None:
    image = tmp_path / "small-blocks.img"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "1024", str(image), "8M"], check=True, capture_output=True)
    with pytest.raises(ext4.NotExt4Error, match=r"block size is 1024 bytes.*mkfs\.ext4 -b 4096"):
        ext4.read_extents(image)


def test_claimed_blocks_and_a_doubly_claimed_block(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a").write_bytes(os.urandom(20_000))
    (root / "b").write_bytes(os.urandom(4096))
    image = tmp_path / "fs.img"
    mkfs(image, "16M", root)
    files = ext4.read_extents(image)
    claimed = ext4.claimed_blocks(files)
    assert len(claimed) == sum(n for f in files for _, _, n in f.extents)
    by_inode = {f.inode: f for f in files}
    inodes = inode_of(image, ["/a", "/b"])
    a_start = by_inode[inodes["/a"]].extents[0][1]
    assert set(range(a_start, a_start + 5)) <= claimed

    # Point b's one extent (i_block words 3-5: ee_block, ee_len|start_hi, start_lo) into a.
    debugfs(image, [f"sif /b block[5] {a_start + 2}"], write=True)
    files = ext4.read_extents(image)
    with pytest.raises(ext4.CorruptImageError, match=r"claimed by both inode \d+ and inode \d+"):
        ext4.claimed_blocks(files)


def test_a_broken_extent_header_is_corruption(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a").write_bytes(os.urandom(20_000))
    image = tmp_path / "fs.img"
    mkfs(image, "16M", root)
    debugfs(image, ["sif /a block[0] 0"], write=True)  # the header's magic and entry count
    with pytest.raises(ext4.CorruptImageError, match="malformed extent tree"):
        ext4.read_extents(image)


def test_an_uninitialised_group_bitmap_is_not_read(tmp_path: Path) -> None:
    """A group flagged INODE_UNINIT has no inode in use, whatever its bitmap block holds."""
    image = tmp_path / "fs.img"
    mkfs(image, "128M", None, "-g", "8192")
    out = subprocess.run(["dumpe2fs", str(image)], check=True, capture_output=True, text=True).stdout
    group = re.search(
        r"^Group 3: [^\n]*\[INODE_UNINIT[^\n]*\n(?:.*\n)*?\s*Inode bitmap at (\d+)", out, re.MULTILINE
    )
    assert group, out
    with image.open("r+b") as f:
        f.seek(int(group.group(1)) * 4096)
        f.write(b"\xff" * 4096)
    assert len(ext4.read_extents(image)) == used_inodes(image)

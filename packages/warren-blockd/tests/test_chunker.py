"""Chunking images: exact round trips both ways, holes, fragmented files, and file-aligned
chunks shared across images wherever the file lies."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import loop_mount_missing, loop_mounted
from warren_blockd import ext4
from warren_blockd.chunker import DEFAULT_CHUNK_SIZE, chunk_image
from warren_blockd.chunks import digest_of
from warren_blockd.manifest import BLOCK_SIZE, Manifest

needs_e2fsprogs = pytest.mark.skipif(
    not (shutil.which("mkfs.ext4") and shutil.which("debugfs")),
    reason="mkfs.ext4 and debugfs (e2fsprogs) are needed",
)


class Store:
    """A sink that insists on one call per distinct chunk and keeps the chunks."""

    def __init__(self) -> None:
        self.chunks: dict[str, bytes] = {}

    def __call__(self, digest: str, raw: bytes) -> None:
        assert digest not in self.chunks, "a chunk was handed over twice"
        assert digest == digest_of(raw)
        self.chunks[digest] = raw


def mkfs(image: Path, size: str, tree: Path) -> None:
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-b", "4096", "-d", str(tree), str(image), size],
        check=True,
        capture_output=True,
    )


def rebuild(manifest: Manifest, chunks: dict[str, bytes]) -> bytes:
    out = bytearray(manifest.size_blocks * BLOCK_SIZE)
    for e in manifest.extents:
        piece = chunks[e.chunk][e.chunk_offset * BLOCK_SIZE : (e.chunk_offset + e.count) * BLOCK_SIZE]
        assert len(piece) == e.count * BLOCK_SIZE
        out[e.first_block * BLOCK_SIZE : e.end * BLOCK_SIZE] = piece
    return bytes(out)


def chunked(image: Path, *, aligned: bool, chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[Manifest, Store]:
    store = Store()
    manifest = chunk_image(image, chunk_size=chunk_size, aligned=aligned, sink=store)
    assert store.chunks.keys() == manifest.chunks()
    assert all(len(raw) <= chunk_size for raw in store.chunks.values())
    return manifest, store


def file_chunks(content: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[str]:
    """The digests a file's content must chunk into, its last block padded with zeros."""
    padded = content + bytes(-len(content) % BLOCK_SIZE)
    return [digest_of(padded[i : i + chunk_size]) for i in range(0, len(padded), chunk_size)]


def tree_files() -> dict[str, bytes]:
    """The tree's files as the image holds them. mkfs.ext4 -d leaves zero blocks out (holes),
    so `zeros-inside` gets its zero blocks written into the image afterwards."""
    rng = random.Random(7)  # noqa: S311  # reproducible data, no secret
    zeros_inside = rng.randbytes(10 * BLOCK_SIZE) + bytes(3 * BLOCK_SIZE) + rng.randbytes(10 * BLOCK_SIZE)
    return {
        "empty": b"",
        "small": rng.randbytes(100),
        "zeros-inside": zeros_inside,
        "dir/sub/big": rng.randbytes(1_500_000),
        "dir/medium": rng.randbytes(300_000),
    }


def make_tree(root: Path) -> None:
    for name, content in tree_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content.replace(bytes(BLOCK_SIZE), b"\1" * BLOCK_SIZE))
    (root / "all-zeros").write_bytes(bytes(5 * BLOCK_SIZE))  # all hole: no extents at all
    (root / "link").symlink_to("dir/sub/big")


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """An ext4 image of `make_tree`, with stray non-zero bytes in its free space."""
    root = tmp_path / "tree"
    root.mkdir()
    make_tree(root)
    path = tmp_path / "fs.img"
    mkfs(path, "32M", root)
    # The only 23-block file is `zeros-inside`: zero its blocks 10-12 in place, allocated.
    target = next(f for f in ext4.read_extents(path) if sum(n for _, _, n in f.extents) == 23)
    assert target.extents[0][2] == 23
    with path.open("r+b") as f:
        f.seek((target.extents[0][1] + 10) * BLOCK_SIZE)
        f.write(bytes(3 * BLOCK_SIZE))
        for block in (5000, 5001, 5003, 8191):  # free in a 32M image this small
            f.seek(block * BLOCK_SIZE)
            f.write(os.urandom(100))
    return path


def _file_blocks(image: Path) -> set[int]:
    files = ext4.read_extents(image)
    return {p + i for f in files if f.kind != "journal" for _, p, n in f.extents for i in range(n)}


@needs_e2fsprogs
@pytest.mark.parametrize("aligned", [True, False], ids=["file-aligned", "fixed"])
@pytest.mark.parametrize("chunk_size", [DEFAULT_CHUNK_SIZE, 64 * 1024, BLOCK_SIZE])
def test_round_trip(image: Path, aligned: bool, chunk_size: int) -> None:
    manifest, store = chunked(image, aligned=aligned, chunk_size=chunk_size)
    original = image.read_bytes()
    assert manifest.size_blocks == len(original) // BLOCK_SIZE
    assert rebuild(manifest, store.chunks) == original
    assert {5000, 5001, 5003, 8191} <= {b for e in manifest.extents for b in range(e.first_block, e.end)}

    # Holes: outside files (everywhere, when fixed) no mapped block is all zeros.
    inside = _file_blocks(image) if aligned else set()
    zero = bytes(BLOCK_SIZE)
    for e in manifest.extents:
        for b in range(e.first_block, e.end):
            if b not in inside:
                assert original[b * BLOCK_SIZE : (b + 1) * BLOCK_SIZE] != zero


@needs_e2fsprogs
def test_file_content_is_its_chunks_zeros_and_all(image: Path) -> None:
    manifest, store = chunked(image, aligned=True)
    for content in tree_files().values():
        if content:
            assert set(file_chunks(content)) <= store.chunks.keys()
    # Inside a file, zero blocks are data: every block a file claims is mapped.
    mapped = {b for e in manifest.extents for b in range(e.first_block, e.end)}
    assert _file_blocks(image) <= mapped
    # Fixed, the zero blocks of `zeros-inside` are holes instead.
    fixed, _ = chunked(image, aligned=False)
    assert sum(e.count for e in fixed.extents) < sum(e.count for e in manifest.extents)


@needs_e2fsprogs
def test_cuts_stay_inside_their_windows(image: Path) -> None:
    cb = 64 * 1024 // BLOCK_SIZE
    fixed, _ = chunked(image, aligned=False, chunk_size=cb * BLOCK_SIZE)
    for e in fixed.extents:
        assert e.chunk_offset == 0
        assert e.first_block // cb == (e.end - 1) // cb

    # File-aligned, outside files, windows count from the start of each unclaimed gap.
    files = [f for f in ext4.read_extents(image) if f.kind != "journal"]
    runs = ext4.claimed_runs(files)
    aligned, _ = chunked(image, aligned=True, chunk_size=cb * BLOCK_SIZE)
    inside = _file_blocks(image)
    ends = [0] + [p + n for p, n in runs]
    for e in aligned.extents:
        if e.first_block in inside:
            continue
        gap_start = max(end for end in ends if end <= e.first_block)
        assert (e.first_block - gap_start) // cb == (e.end - 1 - gap_start) // cb


@needs_e2fsprogs
def test_gap_windows_count_from_the_gap_start(image: Path) -> None:
    files = [f for f in ext4.read_extents(image) if f.kind != "journal"]
    gap_start = max(p + n for p, n in ext4.claimed_runs(files) if p + n <= 6000)
    cb = next(c for c in (16, 24, 40) if gap_start % c)  # windows that differ from block 0's
    first = gap_start + cb // 2 + 1
    with image.open("r+b") as f:  # a long non-zero run through several windows
        f.seek(first * BLOCK_SIZE)
        f.write(os.urandom(3 * cb * BLOCK_SIZE))
    manifest, _ = chunked(image, aligned=True, chunk_size=cb * BLOCK_SIZE)
    run = [(e.first_block, e.count) for e in manifest.extents if first <= e.first_block < first + 3 * cb]
    cuts = [first, *range(gap_start + cb, first + 3 * cb, cb), first + 3 * cb]
    assert run == [(a, b - a) for a, b in itertools.pairwise(cuts)]


@needs_e2fsprogs
def test_a_fragmented_file_is_one_chunk_over_several_extents(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    for i in range(40):
        (root / f"f{i:02}").write_bytes(os.urandom(8192))
    image = tmp_path / "fs.img"
    mkfs(image, "16M", root)
    content = os.urandom(300_000)
    (tmp_path / "frag").write_bytes(content)
    # Free every other small file, then write a large one: it fills the scattered holes.
    script = tmp_path / "cmds"
    script.write_text(
        "".join(f"rm /f{i:02}\n" for i in range(0, 40, 2)) + f"write {tmp_path / 'frag'} /frag\n"
    )
    subprocess.run(["debugfs", "-w", "-f", str(script), str(image)], check=True, capture_output=True)

    manifest, store = chunked(image, aligned=True)
    assert rebuild(manifest, store.chunks) == image.read_bytes()
    first, rest = file_chunks(content)
    pieces = [e for e in manifest.extents if e.chunk == first]
    assert len(pieces) > 2, "the file's first chunk should span several physical runs"
    assert sorted(e.chunk_offset for e in pieces) == sorted({e.chunk_offset for e in pieces})
    assert sum(e.count for e in pieces) == DEFAULT_CHUNK_SIZE // BLOCK_SIZE
    assert store.chunks[first] == content[:DEFAULT_CHUNK_SIZE]
    assert rest in store.chunks


@needs_e2fsprogs
def test_the_same_file_elsewhere_shares_its_chunks(tmp_path: Path) -> None:
    shared = random.Random(3).randbytes(2_000_000)  # noqa: S311  # reproducible data, no secret
    images = []
    for name, before in (("a", b""), ("b", os.urandom(123_456))):
        root = tmp_path / f"tree-{name}"
        root.mkdir()
        if before:
            (root / "0-inserted-first").write_bytes(before)
        (root / "shared").write_bytes(shared)
        image = tmp_path / f"{name}.img"
        mkfs(image, "32M", root)
        images.append(image)

    starts = set()
    for image in images:
        files = ext4.read_extents(image)
        big = next(f for f in files if sum(n for _, _, n in f.extents) == -(-len(shared) // BLOCK_SIZE))
        starts.add(big.extents[0][1])
    assert len(starts) == 2, "the file should lie at a different place in each image"

    expected = set(file_chunks(shared))
    a, _ = chunked(images[0], aligned=True)
    b, _ = chunked(images[1], aligned=True)
    assert expected <= a.chunks() & b.chunks()


def test_fixed_chunking_needs_no_file_system(tmp_path: Path) -> None:
    data = bytearray(os.urandom(40 * BLOCK_SIZE))
    data[8 * BLOCK_SIZE : 20 * BLOCK_SIZE] = bytes(12 * BLOCK_SIZE)  # holes split runs
    path = tmp_path / "raw.img"
    path.write_bytes(bytes(data))
    manifest, store = chunked(path, aligned=False, chunk_size=16 * BLOCK_SIZE)
    assert rebuild(manifest, store.chunks) == bytes(data)
    assert [(e.first_block, e.count) for e in manifest.extents] == [(0, 8), (20, 12), (32, 8)]
    with pytest.raises(ext4.NotExt4Error, match="not an ext4 file system"):
        chunk_image(path, aligned=True, sink=Store())


def test_a_sparse_image_skips_its_holes(tmp_path: Path) -> None:
    path = tmp_path / "sparse.img"
    with path.open("wb") as f:
        f.truncate(64 << 20)
        for block in (3, 4000, 16383):
            f.seek(block * BLOCK_SIZE)
            f.write(b"x" * BLOCK_SIZE)
    manifest, store = chunked(path, aligned=False)
    assert [(e.first_block, e.count) for e in manifest.extents] == [(3, 1), (4000, 1), (16383, 1)]
    assert len(store.chunks) == 1  # three equal blocks, one chunk


def test_bad_sizes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd.img"
    path.write_bytes(b"\1" * (BLOCK_SIZE + 1))
    with pytest.raises(ValueError, match=r"odd\.img: size 4097 bytes is not a whole number"):
        chunk_image(path, aligned=False, sink=Store())
    path.write_bytes(b"\1" * BLOCK_SIZE)
    with pytest.raises(ValueError, match="chunk size 1000"):
        chunk_image(path, aligned=False, chunk_size=1000, sink=Store())


@pytest.fixture
def copy_mounts() -> Iterator[Callable[[], Path]]:
    """Start a process in a mount namespace copied from ours, as another test tier's unshare
    may do at any time; it lives till the test ends. Returns that namespace's mountinfo."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    holders: list[subprocess.Popen[str]] = []

    def start() -> Path:
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", "echo up; exec sleep 600"],
            stdout=subprocess.PIPE,
            text=True,
        )
        holders.append(holder)
        assert holder.stdout is not None
        assert holder.stdout.readline() == "up\n"  # the namespace exists: the copy is made
        return Path(f"/proc/{holder.pid}/mountinfo")

    yield start
    for holder in holders:
        holder.kill()
        holder.wait()


@needs_e2fsprogs
@pytest.mark.root
@pytest.mark.skipif(loop_mount_missing() is not None, reason=loop_mount_missing() or "")
@pytest.mark.parametrize("copied", [False, True], ids=["alone", "mount-copied-elsewhere"])
def test_kernel_written_image_round_trips(
    tmp_path: Path, copy_mounts: Callable[[], Path], copied: bool
) -> None:
    """Stale bytes under unwritten (fallocated) extents and a sparse file of 1000 extents.
    Copied, the file system outlives the umount in another namespace, journal unflushed."""
    image = tmp_path / "fs.img"
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-b", "4096", str(image), "64M"], check=True, capture_output=True
    )
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    written = [os.urandom(BLOCK_SIZE) for _ in range(1000)]
    with loop_mounted(image, mnt):
        elsewhere = copy_mounts() if copied else None
        (mnt / "old").write_bytes(os.urandom(4 << 20))
        os.sync()
        (mnt / "old").unlink()
        os.sync()
        fd = os.open(mnt / "falloc", os.O_CREAT | os.O_WRONLY)
        os.posix_fallocate(fd, 0, 4 << 20)  # likely over old's freed, not zeroed, blocks
        os.fsync(fd)
        os.close(fd)
        fd = os.open(mnt / "sparse", os.O_CREAT | os.O_WRONLY)
        for i, block in enumerate(written):
            os.pwrite(fd, block, 2 * i * BLOCK_SIZE)
        os.fsync(fd)
        os.close(fd)
    if elsewhere is not None:
        assert str(mnt) in elsewhere.read_text().split(), "the mount should outlive our umount"

    original = image.read_bytes()
    for aligned in (True, False):
        manifest, store = chunked(image, aligned=aligned)
        assert rebuild(manifest, store.chunks) == original
        if aligned:  # the sparse file's data, holes left out, cut from its start
            per_chunk = DEFAULT_CHUNK_SIZE // BLOCK_SIZE
            assert digest_of(b"".join(written[:per_chunk])) in store.chunks

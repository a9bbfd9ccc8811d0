"""Cutting a device image into content-addressed chunks and the manifest that maps them.

File-aligned (the default) cuts each file's data at fixed distances from the file's own
start, following the image's ext4 extent maps, so the same file content yields the same
chunks wherever the file lies on the device, even fragmented. Everything no file claims is
cut at fixed distances from the start of each unclaimed gap. Fixed cuts the whole image at
fixed distances from block 0: simple, but an insertion early on shifts every later chunk.

Outside files, all-zero blocks are holes (no chunk, no extent; a manifest reads them as
zeros). Inside a file, zero blocks stay data, so a file's chunks do not depend on where its
zeros fall. The image is streamed: at most one chunk (or one read window) is held at once.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from warren_blockd import ext4
from warren_blockd.chunks import digest_of
from warren_blockd.manifest import BLOCK_SIZE, Extent, Manifest

DEFAULT_CHUNK_SIZE = 256 * 1024  # the store's default: fewer objects than one per block
ZERO_BLOCK = bytes(BLOCK_SIZE)

# The journal is a ring of transient records, mostly zeros in a quiet image: aligning to
# it gains nothing, and treating it as a file would store its zero blocks as data.
_UNALIGNED_KINDS = frozenset({"journal"})

Sink = Callable[[str, bytes], None]


class _Chunker:
    def __init__(self, path: Path, fd: int, size_blocks: int, chunk_blocks: int, sink: Sink) -> None:
        self.path = path
        self.fd = fd
        self.size_blocks = size_blocks
        self.chunk_blocks = chunk_blocks
        self.sink = sink
        self.seen: set[str] = set()
        self.extents: list[Extent] = []

    def read(self, first_block: int, count: int) -> bytes:
        data = os.pread(self.fd, count * BLOCK_SIZE, first_block * BLOCK_SIZE)
        if len(data) != count * BLOCK_SIZE:
            raise OSError(f"{self.path}: short read at block {first_block}; was the image truncated?")
        return data

    def emit(self, raw: bytes, runs: list[tuple[int, int]]) -> None:
        """One chunk of `raw` bytes, laid on the device as the physical `runs` in order."""
        digest = digest_of(raw)
        if digest not in self.seen:
            self.seen.add(digest)
            self.sink(digest, raw)
        offset = 0
        for first, count in runs:
            self.extents.append(Extent(first, count, digest, offset))
            offset += count

    def file(self, extents: list[tuple[int, int, int]]) -> None:
        """A file's data: its extents' blocks concatenated, cut every chunk from its start."""
        pieces: list[bytes] = []
        runs: list[tuple[int, int]] = []
        filled = 0
        for _, physical, length in extents:
            done = 0
            while done < length:
                take = min(length - done, self.chunk_blocks - filled)
                first = physical + done
                pieces.append(self.read(first, take))
                if runs and runs[-1][0] + runs[-1][1] == first:  # physically contiguous
                    runs[-1] = (runs[-1][0], runs[-1][1] + take)
                else:
                    runs.append((first, take))
                done += take
                filled += take
                if filled == self.chunk_blocks:
                    self.emit(b"".join(pieces), runs)
                    pieces, runs, filled = [], [], 0
        if runs:
            self.emit(b"".join(pieces), runs)

    def windows(self, start: int, end: int) -> None:
        """Blocks [start, end) cut every chunk from `start`; a chunk is a run of non-zero
        blocks inside one window."""
        data_from = -1  # the image file's next data offset, in blocks, as SEEK_DATA last said
        for window in range(start, end, self.chunk_blocks):
            count = min(self.chunk_blocks, end - window)
            if data_from < window:
                data_from = _next_data_block(self.fd, window, self.size_blocks)
            if data_from >= window + count:  # a hole in the image file: zeros, skip unread
                continue
            data = self.read(window, count)
            if data.count(0) == len(data):
                continue
            for first, run in _nonzero_runs(data):
                raw = data[first * BLOCK_SIZE : (first + run) * BLOCK_SIZE]
                self.emit(raw, [(window + first, run)])


def _next_data_block(fd: int, block: int, size_blocks: int) -> int:
    """The first block at or after `block` the image file may hold data in. Sparse images
    (the usual case) then skip their holes without reading them."""
    try:
        return os.lseek(fd, block * BLOCK_SIZE, os.SEEK_DATA) // BLOCK_SIZE
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no data after `block`
            return size_blocks
        return block  # SEEK_DATA unsupported here: read everything


def _nonzero_runs(data: bytes) -> Iterator[tuple[int, int]]:
    """(first block, count) of each run of non-zero blocks in `data`."""
    run_start = -1
    blocks = len(data) // BLOCK_SIZE
    for i in range(blocks):
        zero = data[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE] == ZERO_BLOCK
        if not zero and run_start < 0:
            run_start = i
        elif zero and run_start >= 0:
            yield run_start, i - run_start
            run_start = -1
    if run_start >= 0:
        yield run_start, blocks - run_start


def _gaps(runs: list[tuple[int, int]], size_blocks: int) -> Iterator[tuple[int, int]]:
    """[start, end) of each stretch of blocks between the sorted, disjoint `runs`."""
    cursor = 0
    for first, count in runs:
        if first > cursor:
            yield cursor, first
        cursor = first + count
    if cursor < size_blocks:
        yield cursor, size_blocks


def chunk_image(
    path: Path,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    aligned: bool = True,
    sink: Sink,
) -> Manifest:
    """The manifest of the image at `path`, calling `sink(digest, raw)` once per distinct
    chunk. `aligned` needs an ext4 image with 4 KiB blocks (see `warren_blockd.ext4`)."""
    path = Path(path)
    if chunk_size <= 0 or chunk_size % BLOCK_SIZE:
        raise ValueError(f"chunk size {chunk_size} is not a positive multiple of {BLOCK_SIZE}")
    size = path.stat().st_size
    if size % BLOCK_SIZE:
        raise ValueError(f"{path}: size {size} bytes is not a whole number of {BLOCK_SIZE}-byte blocks")
    size_blocks = size // BLOCK_SIZE
    files = ext4.read_extents(path) if aligned else []
    fd = os.open(path, os.O_RDONLY)
    try:
        chunker = _Chunker(path, fd, size_blocks, chunk_size // BLOCK_SIZE, sink)
        if aligned:
            aligned_files = [f for f in files if f.kind not in _UNALIGNED_KINDS and f.extents]
            ext4.claimed_runs(files)  # refuses an image with doubly claimed blocks
            runs = ext4.claimed_runs(aligned_files)
            if runs and runs[-1][0] + runs[-1][1] > size_blocks:
                raise ext4.CorruptImageError(f"{path}: a file's extent passes the end of the image")
            for f in aligned_files:
                chunker.file(f.extents)
            for start, end in _gaps(runs, size_blocks):
                chunker.windows(start, end)
        else:
            chunker.windows(0, size_blocks)
    finally:
        os.close(fd)
    return Manifest(size_blocks, tuple(sorted(chunker.extents)))

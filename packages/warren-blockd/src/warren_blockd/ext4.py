"""A small reader of an ext4 image's own extent maps, without mounting it.

The chunker uses these maps to cut chunks at file boundaries, so the same file content
yields the same chunks wherever the file lies on the device. Only what that needs is
read: the superblock, the group descriptors, the inode bitmaps and tables, and the extent
trees. The journal is not replayed: an image whose journal needs recovery (not cleanly
unmounted, or still mounted somewhere) is read as its metadata in place stands, which may
lack the newest files. Nothing is written and no checksum is verified: a wrong map costs
deduplication, never correctness, because the chunker stores every block's bytes either way.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from warren_blockd.manifest import BLOCK_SIZE  # ext4 blocks must match device blocks one to one

SUPERBLOCK_OFFSET = 1024
EXT4_MAGIC = 0xEF53
EXTENT_MAGIC = 0xF30A
MAX_EXTENT_DEPTH = 5  # the kernel's limit; deeper trees are corrupt
UNWRITTEN_BASE = 32768  # ee_len above this marks an allocated but unwritten (zero) extent
MAX_LOG_BLOCK_SIZE = 8  # anything larger would be a garbage shift
GOOD_OLD_INODE_SIZE = 128
MIN_DESC_SIZE = 32
MIN_DESC_SIZE_64BIT = 64

INCOMPAT_META_BG = 0x10
INCOMPAT_64BIT = 0x80
RO_COMPAT_SPARSE_SUPER = 0x1
RO_COMPAT_GDT_CSUM = 0x10
RO_COMPAT_METADATA_CSUM = 0x400
COMPAT_SPARSE_SUPER2 = 0x200
BG_INODE_UNINIT = 0x1

INODE_EXTENTS_FL = 0x80000
INODE_INLINE_DATA_FL = 0x10000000

_KINDS = {0x8000: "file", 0x4000: "dir", 0xA000: "symlink"}

_EXTENT_HEADER = struct.Struct("<HHHHI")  # magic, entries, max, depth, generation
_EXTENT_INDEX = struct.Struct("<IIHH")  # ei_block, ei_leaf_lo, ei_leaf_hi, unused
_EXTENT_LEAF = struct.Struct("<IHHI")  # ee_block, ee_len, ee_start_hi, ee_start_lo


class Ext4Error(ValueError):
    """The image cannot be read as a supported ext4 file system."""


class NotExt4Error(Ext4Error):
    """The file is not an ext4 image at all, or has a layout this reader refuses."""


class CorruptImageError(Ext4Error):
    """The image's metadata contradicts itself (bad extent tree, doubly claimed block)."""


@dataclass(frozen=True)
class Superblock:
    block_size: int
    blocks_count: int
    first_data_block: int
    blocks_per_group: int
    inodes_per_group: int
    inode_size: int
    desc_size: int
    group_count: int
    first_meta_bg: int
    journal_inode: int
    feature_compat: int
    feature_incompat: int
    feature_ro_compat: int
    backup_bgs: tuple[int, int]


@dataclass(frozen=True)
class FileExtents:
    """One in-use inode's data: (logical block, physical block, length) runs in logical order.

    `extents` holds written data only. Unwritten extents (fallocated, read back as zeros)
    are kept apart in `unwritten`: their blocks are the inode's, but hold no file data.
    Inline-data inodes keep their bytes inside the inode, and block-mapped (pre-extent,
    ext2/3 style) inodes such as the resize inode or an upgraded image's old files are not
    parsed: both report no extents, so their blocks count as unclaimed. A kind of
    "journal" marks the file system's own journal inode.
    """

    inode: int
    kind: str
    extents: list[tuple[int, int, int]]
    unwritten: list[tuple[int, int, int]] = field(default_factory=list)


def _pread_exact(fd: int, length: int, offset: int, path: Path) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise CorruptImageError(f"{path}: metadata at byte {offset} lies past the end of the image")
    return data


def _parse_superblock(raw: bytes, path: Path) -> Superblock:
    (magic,) = struct.unpack_from("<H", raw, 56)
    if magic != EXT4_MAGIC:
        raise NotExt4Error(f"{path}: not an ext4 file system (no ext2/3/4 superblock magic)")
    (log_block_size,) = struct.unpack_from("<I", raw, 24)
    block_size = 1024 << log_block_size if log_block_size < MAX_LOG_BLOCK_SIZE else 0
    if block_size != BLOCK_SIZE:
        raise NotExt4Error(
            f"{path}: the file system's block size is {block_size} bytes; only {BLOCK_SIZE}-byte "
            f"blocks map onto device blocks; recreate it with `mkfs.ext4 -b {BLOCK_SIZE}`"
        )
    (blocks_lo,) = struct.unpack_from("<I", raw, 4)
    (first_data_block,) = struct.unpack_from("<I", raw, 20)
    (blocks_per_group,) = struct.unpack_from("<I", raw, 32)
    (inodes_per_group,) = struct.unpack_from("<I", raw, 40)
    (rev_level,) = struct.unpack_from("<I", raw, 76)
    inode_size = struct.unpack_from("<H", raw, 88)[0] if rev_level >= 1 else GOOD_OLD_INODE_SIZE
    compat, incompat, ro_compat = struct.unpack_from("<III", raw, 92)
    (journal_inode,) = struct.unpack_from("<I", raw, 0xE0)
    (desc_size_field,) = struct.unpack_from("<H", raw, 0xFE)
    (first_meta_bg,) = struct.unpack_from("<I", raw, 0x104)
    (blocks_hi,) = struct.unpack_from("<I", raw, 0x150)
    backup_bgs = struct.unpack_from("<II", raw, 0x24C)
    is_64bit = bool(incompat & INCOMPAT_64BIT)
    blocks_count = blocks_lo | (blocks_hi << 32 if is_64bit else 0)
    desc_size = desc_size_field if is_64bit else MIN_DESC_SIZE
    if (
        blocks_per_group == 0
        or inodes_per_group == 0
        or inodes_per_group > 8 * block_size
        or inode_size < GOOD_OLD_INODE_SIZE
        or inode_size > block_size
        or desc_size < MIN_DESC_SIZE
        or blocks_count <= first_data_block
    ):
        raise CorruptImageError(f"{path}: the superblock's geometry is inconsistent")
    group_count = -(-(blocks_count - first_data_block) // blocks_per_group)
    return Superblock(
        block_size=block_size,
        blocks_count=blocks_count,
        first_data_block=first_data_block,
        blocks_per_group=blocks_per_group,
        inodes_per_group=inodes_per_group,
        inode_size=inode_size,
        desc_size=desc_size,
        group_count=group_count,
        first_meta_bg=first_meta_bg,
        journal_inode=journal_inode,
        feature_compat=compat,
        feature_incompat=incompat,
        feature_ro_compat=ro_compat,
        backup_bgs=(backup_bgs[0], backup_bgs[1]),
    )


def read_superblock(path: Path) -> Superblock:
    """The superblock of the image at `path`; raises NotExt4Error for anything else."""
    with path.open("rb") as f:
        f.seek(SUPERBLOCK_OFFSET)
        raw = f.read(1024)
    if len(raw) < 1024:  # noqa: PLR2004  # the superblock's size
        raise NotExt4Error(f"{path}: not an ext4 file system (too short to hold a superblock)")
    return _parse_superblock(raw, path)


def _is_power_of(n: int, base: int) -> bool:
    while n > 1 and n % base == 0:
        n //= base
    return n == 1


def _group_has_super(sb: Superblock, group: int) -> bool:
    """Whether `group` starts with a superblock copy (it then shifts a meta_bg descriptor)."""
    if group == 0:
        return True
    if sb.feature_compat & COMPAT_SPARSE_SUPER2:
        return group in sb.backup_bgs
    if group == 1 or not sb.feature_ro_compat & RO_COMPAT_SPARSE_SUPER:
        return True
    if group % 2 == 0:
        return False
    return _is_power_of(group, 3) or _is_power_of(group, 5) or _is_power_of(group, 7)


def _descriptor_block(sb: Superblock, group: int) -> int:
    """The block holding `group`'s descriptor (in the one table, or in its meta_bg group)."""
    per_block = sb.block_size // sb.desc_size
    meta_group = group // per_block
    if not sb.feature_incompat & INCOMPAT_META_BG or meta_group < sb.first_meta_bg:
        return sb.first_data_block + 1 + meta_group
    first = meta_group * per_block
    return sb.first_data_block + first * sb.blocks_per_group + (1 if _group_has_super(sb, first) else 0)


@dataclass(frozen=True)
class _Group:
    inode_bitmap: int
    inode_table: int
    flags: int


class _Image:
    def __init__(self, path: Path, fd: int, sb: Superblock) -> None:
        self.path = path
        self.fd = fd
        self.sb = sb

    def block(self, number: int) -> bytes:
        if number >= self.sb.blocks_count:
            raise CorruptImageError(f"{self.path}: metadata points at block {number}, past the end")
        return _pread_exact(self.fd, self.sb.block_size, number * self.sb.block_size, self.path)

    def groups(self) -> list[_Group]:
        sb = self.sb
        per_block = sb.block_size // sb.desc_size
        groups = []
        raw_number, raw = -1, b""
        for g in range(sb.group_count):
            number = _descriptor_block(sb, g)
            if number != raw_number:  # groups share a descriptor block in order: read it once
                raw_number, raw = number, self.block(number)
            offset = (g % per_block) * sb.desc_size
            bitmap_lo, table_lo = struct.unpack_from("<II", raw, offset + 4)
            (flags,) = struct.unpack_from("<H", raw, offset + 18)
            bitmap_hi = table_hi = 0
            if sb.desc_size >= MIN_DESC_SIZE_64BIT:  # the 64bit descriptor carries high halves
                bitmap_hi, table_hi = struct.unpack_from("<II", raw, offset + 0x24)
            groups.append(_Group(bitmap_lo | bitmap_hi << 32, table_lo | table_hi << 32, flags))
        return groups

    def extent_tree(self, inode: int, i_block: bytes) -> list[tuple[int, int, int, bool]]:
        """Every leaf of `inode`'s extent tree as (logical, physical, length, unwritten)."""
        leaves: list[tuple[int, int, int, bool]] = []
        self._node(inode, i_block, None, leaves, set())
        return leaves

    def _node(
        self,
        inode: int,
        node: bytes,
        expected_depth: int | None,
        leaves: list[tuple[int, int, int, bool]],
        visited: set[int],
    ) -> None:
        magic, entries, capacity, depth, _ = _EXTENT_HEADER.unpack_from(node)
        room = (len(node) - _EXTENT_HEADER.size) // _EXTENT_LEAF.size
        if (
            magic != EXTENT_MAGIC
            or entries > capacity
            or capacity > room
            or depth > MAX_EXTENT_DEPTH
            or (expected_depth is not None and depth != expected_depth)
        ):
            raise CorruptImageError(f"{self.path}: inode {inode} has a malformed extent tree node")
        for i in range(entries):
            offset = _EXTENT_HEADER.size + i * _EXTENT_LEAF.size
            if depth > 0:
                _, leaf_lo, leaf_hi, _ = _EXTENT_INDEX.unpack_from(node, offset)
                child = leaf_lo | leaf_hi << 32
                if child in visited:  # a loop or a shared node: never a valid tree
                    raise CorruptImageError(f"{self.path}: inode {inode}'s extent tree revisits {child}")
                visited.add(child)
                self._node(inode, self.block(child), depth - 1, leaves, visited)
            else:
                logical, length, start_hi, start_lo = _EXTENT_LEAF.unpack_from(node, offset)
                unwritten = length > UNWRITTEN_BASE
                if unwritten:
                    length -= UNWRITTEN_BASE
                physical = start_lo | start_hi << 32
                if length == 0 or physical + length > self.sb.blocks_count:
                    raise CorruptImageError(
                        f"{self.path}: inode {inode} has an extent of {length} blocks at {physical}, "
                        f"empty or past the end of the file system"
                    )
                leaves.append((logical, physical, length, unwritten))


def _used_indexes(bitmap: bytes, count: int) -> list[int]:
    used = []
    for byte_index, byte in enumerate(bitmap[: (count + 7) // 8]):
        if byte:
            for bit in range(8):
                i = byte_index * 8 + bit
                if byte >> bit & 1 and i < count:
                    used.append(i)
    return used


def read_extents(path: Path) -> list[FileExtents]:
    """Every in-use inode of the ext4 image at `path` with its extents, by inode number.

    "In use" is the inode bitmap's word: a group flagged INODE_UNINIT (with group
    checksums on) has no inode in use and its bitmap may be garbage, so it is skipped.
    """
    path = Path(path)
    sb = read_superblock(path)
    csums = bool(sb.feature_ro_compat & (RO_COMPAT_GDT_CSUM | RO_COMPAT_METADATA_CSUM))
    result: list[FileExtents] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        image = _Image(path, fd, sb)
        for g, group in enumerate(image.groups()):
            if csums and group.flags & BG_INODE_UNINIT:
                continue
            used = _used_indexes(image.block(group.inode_bitmap), sb.inodes_per_group)
            if not used:
                continue
            # One read covering the used span of the table, not one per inode.
            first, last = used[0], used[-1]
            table = _pread_exact(
                fd,
                (last - first + 1) * sb.inode_size,
                group.inode_table * sb.block_size + first * sb.inode_size,
                path,
            )
            for i in used:
                raw = table[(i - first) * sb.inode_size : (i - first + 1) * sb.inode_size]
                number = g * sb.inodes_per_group + i + 1
                result.append(_file_extents(image, number, raw))
    finally:
        os.close(fd)
    return result


def _file_extents(image: _Image, number: int, raw: bytes) -> FileExtents:
    (mode,) = struct.unpack_from("<H", raw, 0)
    (flags,) = struct.unpack_from("<I", raw, 0x20)
    i_block = raw[0x28 : 0x28 + 60]
    kind = "journal" if number == image.sb.journal_inode else _KINDS.get(mode & 0xF000, "other")
    if flags & INODE_INLINE_DATA_FL or not flags & INODE_EXTENTS_FL:
        return FileExtents(number, kind, [])
    leaves = image.extent_tree(number, i_block)
    leaves.sort()
    for (l1, _, n1, _), (l2, _, _, _) in itertools.pairwise(leaves):
        if l1 + n1 > l2:
            raise CorruptImageError(f"{image.path}: inode {number} maps logical block {l2} twice")
    return FileExtents(
        number,
        kind,
        [(lg, ph, n) for lg, ph, n, unwritten in leaves if not unwritten],
        [(lg, ph, n) for lg, ph, n, unwritten in leaves if unwritten],
    )


def claimed_runs(files: Iterable[FileExtents]) -> list[tuple[int, int]]:
    """Sorted, merged (first physical block, length) runs holding file data (written
    extents only). Raises CorruptImageError if any block is claimed twice, counting
    unwritten extents too: they are allocated to their inode all the same."""
    files = list(files)
    runs = sorted(
        (physical, length, f.inode)
        for f in files
        for extents in (f.extents, f.unwritten)
        for _, physical, length in extents
    )
    for (p1, n1, i1), (p2, _, i2) in itertools.pairwise(runs):
        if p1 + n1 > p2:
            raise CorruptImageError(f"block {p2} is claimed by both inode {i1} and inode {i2}")
    written = sorted((physical, length) for f in files for _, physical, length in f.extents)
    merged: list[tuple[int, int]] = []
    for physical, length in written:
        if merged and merged[-1][0] + merged[-1][1] == physical:
            merged[-1] = (merged[-1][0], merged[-1][1] + length)
        else:
            merged.append((physical, length))
    return merged


def claimed_blocks(files: Iterable[FileExtents]) -> set[int]:
    """Every physical block holding file data; raises CorruptImageError on a double claim.
    One int per block: for large images prefer `claimed_runs`."""
    return {block for start, length in claimed_runs(files) for block in range(start, start + length)}

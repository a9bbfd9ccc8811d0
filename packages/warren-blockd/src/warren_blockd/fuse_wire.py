"""The FUSE wire protocol, as far as warren-blockd speaks it: request headers in, replies out.

Struct layouts follow the kernel's `include/uapi/linux/fuse.h`. Warren negotiates protocol
7.31 (the kernel uses the lower of its own minor and ours); nothing here depends on a later
minor, and every layout used is the same from 7.28 on. Everything is little-endian native
x86-64/arm64 layout (`<`, no implicit padding): the kernel's structs are laid out with
explicit padding fields, which appear here as pad bytes.

This module is pure: it parses bytes and packs bytes, so it is tested without a kernel.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from typing import Any

KERNEL_VERSION = 7
KERNEL_MINOR = 31  # what we offer; the connection runs at min(kernel's, ours)
OLDEST_MINOR = 28  # FUSE_MAX_PAGES (Linux 4.20): below it requests are capped at 128 KiB
ROOT_ID = 1
MIN_READ_BUFFER = 8192
INT_REQ_BIT = 1 << 63  # set in the unique of an INTERRUPT request

# Opcodes (enum fuse_opcode).
LOOKUP = 1
FORGET = 2
GETATTR = 3
SETATTR = 4
OPEN = 14
READ = 15
WRITE = 16
STATFS = 17
RELEASE = 18
FSYNC = 20
GETXATTR = 22
LISTXATTR = 23
FLUSH = 25
INIT = 26
OPENDIR = 27
READDIR = 28
RELEASEDIR = 29
INTERRUPT = 36
DESTROY = 38
BATCH_FORGET = 42

# INIT flags (fuse_init_in.flags / fuse_init_out.flags).
ASYNC_READ = 1 << 0
BIG_WRITES = 1 << 5
ASYNC_DIO = 1 << 15
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
WANTED_FLAGS = ASYNC_READ | BIG_WRITES | ASYNC_DIO | PARALLEL_DIROPS | MAX_PAGES

# SETATTR valid bits.
FATTR_MODE = 1 << 0
FATTR_UID = 1 << 1
FATTR_GID = 1 << 2
FATTR_SIZE = 1 << 3

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error (negative errno), unique
INIT_IN = struct.Struct("<IIII")  # major, minor, max_readahead, flags (then flags2, unused)
# major, minor, max_readahead, flags, max_background, congestion_threshold, max_write,
# time_gran, max_pages, map_alignment, flags2, unused[7]
INIT_OUT = struct.Struct("<IIIIHHIIHHI28x")
# ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode, nlink, uid,
# gid, rdev, blksize, flags
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
ENTRY_OUT = struct.Struct("<QQQQII")  # nodeid, generation, entry_valid, attr_valid, nsecs; attr follows
ATTR_OUT = struct.Struct("<QI4x")  # attr_valid, attr_valid_nsec, dummy; attr follows
READ_IN = struct.Struct("<QQIIQII")  # fh, offset, size, read_flags, lock_owner, flags, padding
WRITE_IN = struct.Struct("<QQIIQII")  # fh, offset, size, write_flags, lock_owner, flags, padding
WRITE_OUT = struct.Struct("<I4x")  # size, padding
OPEN_OUT = struct.Struct("<QI4x")  # fh, open_flags, padding
# blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("<QQQQQIII4x24x")
# valid, padding, fh, size, lock_owner, atime, mtime, ctime, atimensec, mtimensec, ctimensec,
# mode, unused4, uid, gid, unused5
SETATTR_IN = struct.Struct("<I4xQQQQQQIIII4xII4x")
FORGET_IN = struct.Struct("<Q")  # nlookup
BATCH_FORGET_IN = struct.Struct("<I4x")  # count, dummy; then count x FORGET_ONE
FORGET_ONE = struct.Struct("<QQ")  # nodeid, nlookup
DIRENT = struct.Struct("<QQII")  # ino, off, namelen, type; the name follows, padded to 8 bytes


class ProtocolError(ValueError):
    """Bytes from the kernel that do not parse as the request they claim to be."""


@dataclass(frozen=True)
class Request:
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int
    body: memoryview  # what follows the header, exactly len - header bytes


def parse_request(buf: bytes) -> Request:
    if len(buf) < IN_HEADER.size:
        raise ProtocolError(f"a request of {len(buf)} bytes is shorter than its header")
    length, opcode, unique, nodeid, uid, gid, pid, _extlen, _pad = IN_HEADER.unpack_from(buf)
    if length != len(buf):
        raise ProtocolError(f"request {unique} says {length} bytes but {len(buf)} were read")
    return Request(opcode, unique, nodeid, uid, gid, pid, memoryview(buf)[IN_HEADER.size :])


def out_header(unique: int, error: int = 0, payload_len: int = 0) -> bytes:
    """A reply's header; `error` is a positive errno (sent negated), 0 for success."""
    return OUT_HEADER.pack(OUT_HEADER.size + payload_len, -error, unique)


def reply_error(unique: int, error: int) -> bytes:
    return out_header(unique, error)


@dataclass(frozen=True)
class Attr:
    ino: int
    size: int
    mode: int
    nlink: int
    time_ns: int
    uid: int = 0
    gid: int = 0
    blksize: int = 4096

    def pack(self) -> bytes:
        sec, nsec = divmod(self.time_ns, 1_000_000_000)
        blocks = (self.size + 511) // 512
        return ATTR.pack(
            self.ino, self.size, blocks, sec, sec, sec, nsec, nsec, nsec, self.mode, self.nlink,
            self.uid, self.gid, 0, self.blksize, 0,
        )  # fmt: skip


def _valid(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1_000_000_000)


def entry_out(nodeid: int, attr: Attr, timeout: float) -> bytes:
    sec, nsec = _valid(timeout)
    return ENTRY_OUT.pack(nodeid, 0, sec, sec, nsec, nsec) + attr.pack()


def attr_out(attr: Attr, timeout: float) -> bytes:
    sec, nsec = _valid(timeout)
    return ATTR_OUT.pack(sec, nsec) + attr.pack()


def dirent(ino: int, offset: int, name: bytes, mode: int) -> bytes:
    """One READDIR entry; `offset` is the cookie of the entry after it."""
    record = DIRENT.pack(ino, offset, len(name), (mode & 0o170000) >> 12) + name
    return record + bytes(-len(record) % 8)


def lookup_name(body: memoryview) -> str:
    """The name in a LOOKUP body (NUL-terminated)."""
    raw = bytes(body)
    end = raw.find(b"\0")
    if end < 0:
        raise ProtocolError("a LOOKUP name without its terminating NUL")
    return raw[:end].decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class InitParams:
    """What INIT negotiated: the new daemon of a handoff serves with exactly these, since
    the kernel never sends INIT twice on one connection."""

    major: int
    minor: int
    flags: int
    max_readahead: int
    max_write: int
    max_pages: int
    max_background: int
    congestion_threshold: int

    @property
    def read_buffer(self) -> int:
        """The buffer one read of /dev/fuse needs: a WRITE of max_write with its headers."""
        return max(MIN_READ_BUFFER, IN_HEADER.size + WRITE_IN.size + self.max_write + 4096)

    def to_doc(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> InitParams:
        return cls(**{key: int(doc[key]) for key in cls.__dataclass_fields__})


def negotiate(
    body: memoryview, max_write: int = 1 << 20, max_background: int = 32, congestion_threshold: int = 24
) -> tuple[InitParams, bytes]:
    """Parse the kernel's INIT and make our reply (the payload after the header)."""
    if len(body) < INIT_IN.size:
        raise ProtocolError(f"an INIT body of {len(body)} bytes")
    major, minor, max_readahead, kernel_flags = INIT_IN.unpack_from(body)
    if major != KERNEL_VERSION:
        raise ProtocolError(f"the kernel speaks FUSE {major}.{minor}; we speak {KERNEL_VERSION}.x")
    minor = min(minor, KERNEL_MINOR)
    if minor < OLDEST_MINOR:
        raise ProtocolError(f"the kernel speaks FUSE 7.{minor}; we need 7.{OLDEST_MINOR} or later")
    flags = kernel_flags & WANTED_FLAGS
    page = 4096
    max_pages = max_write // page if flags & MAX_PAGES else 32
    max_write = min(max_write, max_pages * page)
    params = InitParams(
        KERNEL_VERSION, minor, flags, max_readahead, max_write, max_pages, max_background,
        congestion_threshold,
    )  # fmt: skip
    reply = INIT_OUT.pack(
        KERNEL_VERSION, minor, max_readahead, flags, max_background, congestion_threshold, max_write,
        1, max_pages, 0, 0,
    )  # fmt: skip
    return params, reply

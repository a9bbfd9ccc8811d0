"""Chunks: compressed, checksummed and addressed by the SHA-256 of their raw bytes.

A stored chunk is `WCK1` + raw length (8 bytes, big endian) + zstd frame. Decoding checks
the magic, the length and the digest before handing back a single byte: a truncated or
corrupted fetch is refused whole (verify before serve).
"""

from __future__ import annotations

import hashlib
import struct
import threading

import zstandard

from warren_blockd.errors import CorruptError

MAGIC = b"WCK1"
HEADER = struct.Struct(">4sQ")
LEVEL = 3  # fast to write; workspaces are mostly source and build output


def digest_of(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def key_for(digest: str) -> str:
    return f"chunks/{digest[:2]}/{digest}"


_local = threading.local()


def encode(raw: bytes) -> tuple[str, bytes]:
    """(digest, stored bytes) for a chunk's raw content."""
    compressor = getattr(_local, "compressor", None)
    if compressor is None:  # one per thread: a compression context is costly to set up
        compressor = _local.compressor = zstandard.ZstdCompressor(level=LEVEL)
    frame = compressor.compress(raw)
    return digest_of(raw), HEADER.pack(MAGIC, len(raw)) + frame


def decode(digest: str, stored: bytes) -> bytes:
    """The raw content, only if it is exactly what `digest` names."""
    if len(stored) < HEADER.size:
        raise CorruptError(key_for(digest), "truncated: shorter than a chunk header")
    magic, length = HEADER.unpack_from(stored)
    if magic != MAGIC:
        raise CorruptError(key_for(digest), "not a chunk (bad magic)")
    try:
        raw = zstandard.ZstdDecompressor().decompress(stored[HEADER.size :], max_output_size=length)
    except zstandard.ZstdError as exc:
        raise CorruptError(key_for(digest), f"does not decompress: {exc}") from None
    if len(raw) != length:
        raise CorruptError(key_for(digest), f"length {len(raw)} is not the recorded {length}")
    if digest_of(raw) != digest:
        raise CorruptError(key_for(digest), "content does not match its digest")
    return raw

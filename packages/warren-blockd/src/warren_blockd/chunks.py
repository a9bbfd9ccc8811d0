"""Chunks: compressed, checksummed and addressed by the SHA-256 of their raw bytes.

A stored chunk is one zstd frame that records its raw length (the frame's content size).
Decoding checks the frame, the length and the digest before handing back a single byte: a
truncated or corrupted fetch is refused whole (verify before serve).
"""

from __future__ import annotations

import hashlib
import threading

import zstandard

from warren_blockd.errors import CorruptError

LEVEL = 1  # fastest of the normal levels: replication is CPU-bound before it is network-bound


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
    return digest_of(raw), compressor.compress(raw)  # content size is written in the frame


def decode(digest: str, stored: bytes) -> bytes:
    """The raw content, only if it is exactly what `digest` names."""
    try:
        length = zstandard.get_frame_parameters(stored).content_size
    except zstandard.ZstdError as exc:
        raise CorruptError(key_for(digest), f"not a chunk (no zstd frame header): {exc}") from None
    if length <= 0:  # chunks are never empty; a frame without its length is not ours
        raise CorruptError(key_for(digest), "not a chunk (the frame does not record its length)")
    try:
        raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=length)
    except zstandard.ZstdError as exc:
        raise CorruptError(key_for(digest), f"does not decompress (truncated or damaged): {exc}") from None
    if len(raw) != length:
        raise CorruptError(key_for(digest), f"length {len(raw)} is not the recorded {length}")
    if digest_of(raw) != digest:
        raise CorruptError(key_for(digest), "content does not match its digest")
    return raw

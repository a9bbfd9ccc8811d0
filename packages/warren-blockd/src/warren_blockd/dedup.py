"""How much of one image another image's chunks already hold, file-aligned versus fixed.

The figure asked is the store's saving for B once A is stored: the share of B's mapped
bytes (holes excluded) whose chunk A already has. Only digests are kept, never chunk bytes.
"""

from __future__ import annotations

from pathlib import Path

from warren_blockd.chunker import DEFAULT_CHUNK_SIZE, chunk_image
from warren_blockd.manifest import BLOCK_SIZE


def _discard(_digest: str, _raw: bytes) -> None:
    pass


def report(a: Path, b: Path, chunk_size: int = DEFAULT_CHUNK_SIZE) -> dict[str, int | float]:
    """Shared-byte ratios of image `b` against image `a`, chunked both ways.

    A ratio is 0.0 when B maps no bytes at all (nothing to share).
    """
    result: dict[str, int | float] = {"chunk_size": chunk_size}
    for mode, aligned in (("file_aligned", True), ("fixed", False)):
        a_chunks = chunk_image(a, chunk_size=chunk_size, aligned=aligned, sink=_discard).chunks()
        b_manifest = chunk_image(b, chunk_size=chunk_size, aligned=aligned, sink=_discard)
        mapped = sum(e.count for e in b_manifest.extents) * BLOCK_SIZE
        shared = sum(e.count for e in b_manifest.extents if e.chunk in a_chunks) * BLOCK_SIZE
        result[f"shared_ratio_{mode}"] = shared / mapped if mapped else 0.0
        result[f"b_mapped_bytes_{mode}"] = mapped
        result[f"b_shared_bytes_{mode}"] = shared
        result[f"a_chunks_{mode}"] = len(a_chunks)
        result[f"b_chunks_{mode}"] = len(b_manifest.chunks())
    return result
